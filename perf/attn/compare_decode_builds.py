#!/usr/bin/env python3
"""Two builds' decode_attn_perf side by side: the binaries alternate, each
configuration repeated, medians of the runs' medians.

    python3 perf/attn/compare_decode_builds.py BEFORE_BIN AFTER_BIN [-r 3] [-c 2:1024,2:16384,4:1024]
"""
import argparse
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("-r", type=int, default=3, help="runs of each binary per configuration")
    ap.add_argument("-c", default="2:1024,2:16384,4:1024", help="procs:cached-tokens list")
    ap.add_argument("-n", type=int, default=200)
    a = ap.parse_args()
    configs = [tuple(int(x) for x in c.split(":")) for c in a.c.split(",")]
    bins = [("before", a.before), ("after", a.after)]
    res = {}
    for p, tokens in configs:
        for rep in range(a.r):
            for name, b in (bins if rep % 2 == 0 else bins[::-1]):
                out = subprocess.run([b, "--procs", str(p), "-L", str(tokens), "--batches", "1", "-n", str(a.n),
                                      "-w", "10"], capture_output=True, text=True, timeout=900).stdout
                for line in out.splitlines():
                    f = line.split()
                    if len(f) >= 10 and f[0] == "1" and f[4] in ("pass-kv", "pass-q", "ship-q", "auto"):
                        res.setdefault((p, tokens, f[4], name), []).append((float(f[6]), float(f[7]), float(f[8])))
    print(f"{'procs':>5} {'L':>6} {'mode':>8} {'before ms':>10} {'after ms':>10} {'after/before':>12} "
          f"{'kernel after':>12} {'comm after':>10}")
    for p, tokens in configs:
        for m in ("pass-kv", "pass-q", "ship-q", "auto"):
            b, af = res.get((p, tokens, m, "before"), []), res.get((p, tokens, m, "after"), [])
            if not b or not af:
                continue
            bt = statistics.median(x[0] for x in b)
            at, ak, ac = (statistics.median(x[i] for x in af) for i in range(3))
            print(f"{p:>5} {tokens:>6} {m:>8} {bt:10.3f} {at:10.3f} {at / bt:12.2f} {ak:12.3f} {ac:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
