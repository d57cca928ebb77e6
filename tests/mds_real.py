"""The real MDS library in a child process: reads exports with ``StreamingDataset`` and writes
reference shards with ``MDSWriter`` (mosaicml-streaming, CPU only), for tests/export/test_export_mds.py.

Run as ``python tests/mds_real.py READER_DIR``; READER_DIR holds mosaicml-streaming and the few
packages its import chain needs (the Makefile installs them there with --no-deps, beside the venv,
never into it). One JSON request per stdin line, one JSON reply per stdout line:

  {"op": "read", "dir": D, "out": NPZ}   StreamingDataset(local=D, shuffle=False): every sample by
      index and by iteration (they must agree) into NPZ: tokens (n, C), segment_doc_ids and
      segment_lengths concatenated, segment_counts (n,), and llmfoundry_tokens: what llm-foundry's
      StreamingTextDataset makes of each ``tokens`` ndarray (``torch.from_numpy(t[:C].copy())
      .to(torch.int64)``, its current code).
  {"op": "write", "src": NPZ, "dir": D, "size_limit": L, "encodings": {...}}  MDSWriter writes the
      samples of NPZ (same keys as above) with those column encodings.

The package ``streaming`` and ``streaming.base`` are entered without running their
``__init__.py``: those import ``streaming.vision`` (torchvision, whose registry wheel is built for
CUDA torch and fails to load beside the CPU torch) and ``streaming.base.dataloader``
(transformers, for its DataLoader only). Every module the reading and writing use
(``dataset``, ``format.mds.reader``/``writer``/``encodings``, ...) is the library's own code.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import types


def _enter_package(reader_dir: str) -> None:
    root = os.path.join(reader_dir, "streaming")
    for name, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    sys.path.insert(0, reader_dir)


def _read(request: dict) -> dict:
    import numpy as np
    import torch
    from streaming.base.dataset import StreamingDataset

    dataset = StreamingDataset(local=request["dir"], shuffle=False, batch_size=1)
    by_index = [dataset[i] for i in range(dataset.num_samples)]
    by_iter = list(dataset)
    for i, (a, b) in enumerate(zip(by_index, by_iter, strict=True)):
        if any(not np.array_equal(a[k], b[k]) for k in a):
            raise AssertionError(f"sample {i}: iteration and indexing disagree")
    if not by_index:
        raise AssertionError("no samples")
    tokens = [s["tokens"] for s in by_index]
    if not all(isinstance(t, np.ndarray) for t in tokens):
        raise AssertionError("tokens are not ndarrays (llm-foundry would read them as int64 bytes)")
    c = tokens[0].shape[0]
    foundry = [torch.from_numpy(t[:c].copy()).to(torch.int64).numpy() for t in tokens]
    np.savez(request["out"], tokens=np.stack(tokens), llmfoundry_tokens=np.stack(foundry),
             segment_doc_ids=np.concatenate([s["segment_doc_ids"] for s in by_index]),
             segment_lengths=np.concatenate([s["segment_lengths"] for s in by_index]),
             segment_counts=np.array([s["segment_doc_ids"].size for s in by_index]))
    del dataset
    return {"samples": len(by_index)}


def _write(request: dict) -> dict:
    import numpy as np
    from streaming.base.format.mds.writer import MDSWriter

    src = np.load(request["src"])
    ends = np.cumsum(src["segment_counts"])
    starts = ends - src["segment_counts"]
    with MDSWriter(out=request["dir"], columns=request["encodings"], size_limit=request["size_limit"]) as writer:
        for i in range(src["tokens"].shape[0]):
            writer.write({"tokens": src["tokens"][i],
                          "segment_doc_ids": src["segment_doc_ids"][starts[i]:ends[i]],
                          "segment_lengths": src["segment_lengths"][starts[i]:ends[i]]})
    return {}


def _exec(request: dict) -> dict:
    """Run ``code`` (a docs/MDS.md recipe) with ``streaming.StreamingDataset`` importable and
    ``request["globals"]`` defined; save the numpy arrays / tensors of its ``batch`` dict in ``out``."""
    import numpy as np
    import streaming
    from streaming.base.dataset import StreamingDataset

    streaming.StreamingDataset = StreamingDataset  # what `from streaming import StreamingDataset` gives
    scope = dict(request["globals"])
    exec(compile(request["code"], "docs/MDS.md", "exec"), scope)
    batch = scope["batch"]
    np.savez(request["out"], **{k: np.asarray(v) for k, v in batch.items() if hasattr(v, "shape")})
    return {"keys": sorted(batch)}


def main() -> None:
    _enter_package(sys.argv[1])
    ops = {"read": _read, "write": _write, "exec": _exec}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"ok": True, **ops[request["op"]](request)}
        except BaseException as e:  # noqa: BLE001 - reported to the test
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
