"""numpy <-> Arrow for the hot paths, by their buffers: pyarrow's pandas shim is never asked.

pyarrow imports pandas the first time a process calls ``pa.array``, ``Array.to_numpy``,
``np.asarray(array)``, ``pa.scalar`` or a compute function given a numpy array (its shim checks
whether the argument is a pandas object). That import costs a fresh process about 0.2 s on the path
of its first task and 33 MiB (BENCHMARKS.md, "pandas"), and a ``--local`` run needs nothing of
pandas. These helpers build the same arrays from the buffers; a test runs the ``--local`` jobs with
pandas made unimportable.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["arrow_array", "binary_array", "from_stream_bytes", "numpy_values", "stream_bytes"]


def arrow_array(values: np.ndarray, type: pa.DataType | None = None) -> pa.Array:
    """A 1-D numeric or bool numpy array as an Arrow array without nulls, over the same memory (a copy
    only when ``values`` is not contiguous, is bool, or is cast to ``type``)."""
    values = np.asarray(values)
    if values.ndim != 1:
        raise ValueError(f"arrow_array takes a 1-D array, not {values.ndim}-D")
    arrow_type = pa.from_numpy_dtype(values.dtype) if type is None else type
    if pa.types.is_boolean(arrow_type):
        bits = np.packbits(values.astype(np.bool_, copy=False), bitorder="little")
        return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(bits)])
    values = np.ascontiguousarray(values, dtype=np.dtype(arrow_type.to_pandas_dtype()))
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def numpy_values(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of a numeric or bool Arrow array as numpy: a read-only view of its buffer where it
    has no nulls (bool is unpacked, a copy); with nulls, pyarrow's own conversion (nulls as NaN)."""
    if isinstance(array, pa.ChunkedArray):
        chunks = [numpy_values(chunk) for chunk in array.chunks]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.dtype(array.type.to_pandas_dtype()))
    if array.null_count:
        return array.to_numpy(zero_copy_only=False)  # a rare path (an error being named): pandas may load
    buffer, n, offset = array.buffers()[1], len(array), array.offset
    if pa.types.is_boolean(array.type):
        if n == 0:
            return np.zeros(0, dtype=np.bool_)
        bits = np.frombuffer(buffer, dtype=np.uint8)
        return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].astype(np.bool_)
    dtype = np.dtype(array.type.to_pandas_dtype())
    if n == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(buffer, dtype=dtype, count=n, offset=offset * dtype.itemsize)


def binary_array(items: Sequence[bytes], type: pa.DataType = pa.binary()) -> pa.Array:
    """``items`` (bytes) as a binary (or string: valid UTF-8 is the caller's to know) Arrow array."""
    width = np.int64 if type in (pa.large_binary(), pa.large_string()) else np.int32
    offsets = np.zeros(len(items) + 1, dtype=width)
    np.cumsum([len(item) for item in items], out=offsets[1:])
    return pa.Array.from_buffers(type, len(items), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(items))])


def stream_bytes(table: pa.Table) -> bytes:
    """``table`` as Arrow IPC stream bytes: what a packer actor hands back through Ray, whose own pickling of
    an Arrow table asks pyarrow's pandas shim (ray._private.arrow_serialization)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_stream_bytes(data: bytes) -> pa.Table:
    """The table :func:`stream_bytes` wrote."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
