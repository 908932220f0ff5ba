#!/usr/bin/env python3
"""Draws the pass-KV / pass-Q time ratio against the KV-cache miss rate
(the CP paper's Fig. 9) from ring_attn_perf's JSON (-J), to PNG.

    build/perf/ring_attn_perf -t 4 -L 8192 --miss 1,0.25,0.1,0.05,0.025,0.01 --modes kv,q,auto -J grid.json
    python3 perf/attn/plot_fig9.py grid.json fig9.png

A ratio above 1 means pass-Q is faster. Points are labelled with the mode
AUTO chose when the run measured it. Needs matplotlib (pip install matplotlib).
perf/plot_perf.py (and the binaries' --plot) draws the times themselves with
the crossover marked.
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        rows = json.load(f)["results"]
    by_point = {}
    for r in rows:
        by_point.setdefault((r["T"], r["P"]), {})[r["mode"]] = r
    points = []
    for (T, P), modes in sorted(by_point.items(), key=lambda kv: kv[0][0] / max(1, sum(kv[0]))):
        if "pass-kv" in modes and "pass-q" in modes:
            miss = 100.0 * T / (T + P)
            ratio = modes["pass-kv"]["time_us"] / modes["pass-q"]["time_us"]
            chose = modes.get("auto", {}).get("auto_chose", "")
            points.append((miss, ratio, chose))
    if not points:
        print("no configuration has both pass-kv and pass-q", file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: pip install matplotlib", file=sys.stderr)
        for p in points:
            print("miss %6.2f%%  pass-KV/pass-Q %.3f  auto %s" % p)
        return 1
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label="pass-KV time / pass-Q time")
    for miss, ratio, chose in points:
        if chose:
            ax.annotate(chose, (miss, ratio), textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("KV cache miss rate T/(T+P), %")
    ax.set_ylabel("pass-KV / pass-Q time")
    ax.set_title("pass-KV vs pass-Q (above 1: pass-Q faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    print("wrote", sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
