#!/usr/bin/env python3
"""Side-by-side markdown table of perf JSON files (ours and baselines).

Usage: summarize.py [--out FILE] [--title TEXT] [--order cfg1,cfg2,...]
                    [--ratio NUM:DEN ...] [--metric busbw|time] PATH...

PATH is a JSON file written with -J, or a directory of them. A file's
configuration is the part of its name before the first '.', e.g.
attn-shm.all_gather.r2.json -> "attn-shm"; repetitions of one configuration
are combined by taking the median busbw per size (out-of-place), or with
--metric time the median time in microseconds (small messages, whose busbw
rounds to nothing). A --ratio NUM:DEN column shows how many times faster
NUM is than DEN: median(NUM)/median(DEN) for busbw, the inverse for time;
DEN may be "a|b" for the better of two baselines.
"""
import argparse
import glob
import json
import os
import statistics
import sys


def normalize(j):
    """nccl-tests' schema (version 3, written since 2026-11-27) -> the older
    {"collective", "rows": [{"out_of_place": {"time_us", "busbw", "wrong"}}]}."""
    if j.get("version") != 3:
        return j
    a = j.get("attncomm", {})
    rows = []
    for r in j.get("results", []):
        m = r.get("out_of_place")
        row = {"size": r["size"]}
        if m:
            row["out_of_place"] = {"time_us": m.get("time", m.get("cpu_time")), "busbw": m["bus_bw"],
                                   "wrong": -1 if m.get("nwrong") is None else m["nwrong"]}
        rows.append(row)
    return {"program": a.get("program"), "library": j.get("attncomm_version"),
            "collective": a.get("collective"), "nranks": a.get("nranks"), "mode": a.get("mode"),
            "transport": a.get("transport"), "iters": j.get("config", {}).get("iterations"),
            "rows": rows}


def load(paths, metric="busbw"):
    """(cfg, coll, size) -> list of (metric value, wrong); plus per-cfg metadata."""
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "*.json"))) if os.path.isdir(p) else [p]
    data, meta, bad = {}, {}, []
    for f in files:
        cfg = os.path.basename(f).split(".")[0]
        try:
            with open(f) as fh:
                j = normalize(json.load(fh))
        except (OSError, ValueError) as e:
            bad.append(f"{f}: {e}")
            continue
        meta.setdefault(cfg, j)
        for row in j.get("rows", []):
            m = row.get("out_of_place")
            if not m:
                continue
            key = (cfg, j["collective"], row["size"])
            value = m["time_us"] if metric == "time" else m["busbw"]
            data.setdefault(key, []).append((value, m.get("wrong", -1)))
    return data, meta, bad


def size_label(b):
    if b >= 1 << 30 and b % (1 << 30) == 0:
        return f"{b >> 30} GiB"
    if b >= 1 << 20 and b % (1 << 20) == 0:
        return f"{b >> 20} MiB"
    if b >= 1 << 10 and b % (1 << 10) == 0:
        return f"{b >> 10} KiB"
    return f"{b} B"


def cell(vals):
    if not vals:
        return "-", None
    med = statistics.median(v for v, _ in vals)
    wrong = any(w > 0 for _, w in vals)
    return f"{med:.2f}" + (" (WRONG)" if wrong else ""), med


def cpu_table(paths, cfgs):
    """Median wall / CPU seconds per run from the <run>.time files that
    compare_baselines.sh writes ("wall user sys"), if any."""
    runs = {}
    for p in paths:
        if not os.path.isdir(p):
            continue
        for f in glob.glob(os.path.join(p, "*.time")):
            parts = os.path.basename(f).split(".")
            try:
                with open(f) as fh:
                    wall, user, sys_ = (float(x) for x in fh.read().split()[-3:])
            except (OSError, ValueError):
                continue
            runs.setdefault((parts[1], parts[0]), []).append((wall, user + sys_))
    if not runs:
        return []
    colls = sorted({c for c, _ in runs})
    out = ["", "### seconds per whole run: wall / CPU (user+sys, all ranks), median", "",
           "| collective | " + " | ".join(cfgs) + " |", "|---|" + "---:|" * len(cfgs)]
    for coll in colls:
        cells = []
        for c in cfgs:
            v = runs.get((coll, c))
            cells.append(f"{statistics.median(w for w, _ in v):.1f} / "
                         f"{statistics.median(u for _, u in v):.1f}" if v else "-")
        out.append(f"| {coll} | " + " | ".join(cells) + " |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--out")
    ap.add_argument("--title", default="busbw (GB/s), median over repetitions")
    ap.add_argument("--order", default="")
    ap.add_argument("--ratio", action="append", default=[])
    ap.add_argument("--metric", choices=["busbw", "time"], default="busbw")
    a = ap.parse_args()

    data, meta, bad = load(a.paths, a.metric)
    cfgs = [c for c in a.order.split(",") if c in meta] if a.order else []
    cfgs += sorted(c for c in meta if c not in cfgs)
    colls = []
    for (_, coll, _) in sorted(data):
        if coll not in colls:
            colls.append(coll)
    # A ratio whose numerator was not run is left out, not shown as "-".
    ratios = [r.split(":", 1) for r in a.ratio if ":" in r and r.split(":", 1)[0] in cfgs]

    out = [f"### {a.title}", ""]
    for c in cfgs:
        j = meta[c]
        reps = max((len(v) for k, v in data.items() if k[0] == c), default=0)
        out.append(f"- **{c}**: {j.get('program')} ({j.get('library')}), "
                   f"{j.get('nranks')} ranks as {j.get('mode')}, transport "
                   f"'{j.get('transport') or 'default'}', {j.get('iters')} iters, "
                   f"{reps} rep(s)")
    out.append("")
    head = ["collective", "size"] + cfgs + [
        f"{n} / " + (f"best({d.replace('|', ', ')})" if "|" in d else d) for n, d in ratios]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * 2 + "---:|" * (len(head) - 2))
    for coll in colls:
        sizes = sorted({k[2] for k in data if k[1] == coll})
        for s in sizes:
            meds, cells = {}, []
            for c in cfgs:
                text, med = cell(data.get((c, coll, s), []))
                cells.append(text)
                meds[c] = med
            for num, den in ratios:
                dens = [meds.get(d) for d in den.split("|")]
                dens = [d for d in dens if d]
                n = meds.get(num)
                if a.metric == "time":  # the best baseline is the fastest
                    cells.append(f"{min(dens) / n:.2f}x" if n and dens else "-")
                else:
                    cells.append(f"{n / max(dens):.2f}x" if n and dens else "-")
            out.append(f"| {coll} | {size_label(s)} | " + " | ".join(cells) + " |")
    out += cpu_table(a.paths, cfgs)
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    for b in bad:
        print(f"summarize: skipped {b}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
