"""Plot a bench_peers.py report: tokens/s (log scale) and peak memory, per candidate.

    python bench/plot_peers.py docs/benchmarks/peers.json docs/benchmarks/peers.png
"""

from __future__ import annotations

import json
import sys

TIER_COLOURS = {"memory": "#4c72b0", "files": "#dd8452"}
RAYPACK_EDGE = "#222222"


def _labels_and_rows(report: dict) -> list[tuple[str, str, dict]]:
    from bench_peers import SPECS

    rows = []
    for spec in SPECS:
        if spec.key not in report["results"]:
            continue
        r = report["results"][spec.key]
        label = spec.label
        if r["num_tokens"] < report["corpus"]["tokens"]:
            label += f" ({r['num_tokens'] / 1e6:.0f}M prefix)"
        rows.append((spec.key, label, spec.tier, r))
    return rows


def plot_report(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _labels_and_rows(report)[::-1]
    names = [label for _, label, _, _ in rows]
    fig, (ax_rate, ax_mem) = plt.subplots(1, 2, figsize=(13, 0.42 * len(rows) + 1.8), sharey=True,
                                          gridspec_kw={"width_ratios": [3, 1.3]})
    ys = range(len(rows))
    for y, (key, _, tier, r) in zip(ys, rows):
        edge = RAYPACK_EDGE if key.startswith("raypack") else "none"
        hatch = "//" if key.startswith("floor") else None
        ax_rate.barh(y, r["rate"] / 1e6, color=TIER_COLOURS[tier], edgecolor=edge, hatch=hatch, linewidth=1.2)
        ax_rate.plot([r["rate_min"] / 1e6, r["rate_max"] / 1e6], [y, y], color="black", linewidth=1)
        floor = "x numpy floor" if tier == "memory" else "x I/O floor"
        ratio = r["x_numpy_floor"] if tier == "memory" else r["x_io_floor"]
        ax_rate.annotate(f" {r['rate'] / 1e6:,.1f}M  ({ratio:.3g} {floor})", (r["rate_max"] / 1e6, y),
                         va="center", fontsize=8)
        mib = r["peak_delta"] / 2**20
        ax_mem.barh(y, mib, color=TIER_COLOURS[tier], edgecolor=edge, hatch=hatch, linewidth=1.2)
        ax_mem.annotate(f" {mib:,.0f} ({r['peak_delta'] / r['num_tokens']:.1f} B/token)", (mib, y),
                        va="center", fontsize=8)
    ax_rate.set_xscale("log")
    ax_rate.set_yticks(list(ys), names, fontsize=9)
    ax_rate.set_xlabel("M tokens/s (median of warm runs; line: min-max over repeats; log scale)")
    lo, hi = ax_rate.get_xlim()
    ax_rate.set_xlim(lo, hi * 20)
    ax_mem.set_xlabel("peak memory added by the run, MiB")
    lo, hi = ax_mem.get_xlim()
    ax_mem.set_xlim(0, hi * 2.0)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in TIER_COLOURS.values()]
    fig.legend(handles, ["in memory: packing only (ratio to the numpy floor)",
                         "Parquet files -> output (ratio to the pyarrow I/O floor)"],
               loc="lower center", ncol=2, fontsize=9, frameon=False)
    corpus, m = report["corpus"], report["machine"]
    fig.suptitle(f"{corpus['tokens'] / 1e6:.0f}M tokens, {corpus['docs']:,} documents, C={corpus['context_length']}; "
                 f"{m['cpus']} x {m['cpu']}, {m['memory_gib']:.0f} GiB; hatched = floors, outlined = raypack",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python bench/plot_peers.py REPORT.json OUT.png", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        plot_report(json.load(f), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
