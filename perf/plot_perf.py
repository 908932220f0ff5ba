#!/usr/bin/env python3
"""Draws the perf binaries' JSON (-J) as one PNG, every file side by side.

    python3 perf/plot_perf.py FILE.json [FILE.json ...] -o OUT.png [--title TEXT] [--label-from-file]

Collectives (nccl-tests' JSON, schema version 3): bus bandwidth against
size, one line per file (label: the program and attncomm's transport/algo,
else the file name; files whose names differ only by a trailing .rN
repetition are merged by the median), out-of-place solid, in-place dashed;
one panel per collective.
ring_attn_perf: time per mode against the KV-cache miss rate T/(T+P), the
pass-KV / pass-Q crossover marked (interpolated; "no crossover in range"
when the curves do not cross). decode_attn_perf: time per mode against the
batch size, the same crossover. level_attn_perf: time per variant (keep
fractions) as bars. kv_attn_perf: decode step and migration time against
the share of blocks lent.

Exit status: 0 written, 1 unreadable or unknown data, 2 usage, 3 matplotlib
missing. Absorbs attn/plot_fig9.py's pass-KV / pass-Q comparison.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

NO_MATPLOTLIB = "matplotlib not installed: pip install matplotlib (or apt install python3-matplotlib)"
COLLECTIVES = ["reduce_scatter", "all_gather", "all_reduce", "alltoall", "broadcast", "sendrecv", "reduce"]


class DataError(Exception):
    pass


def crossover(xs, a, b, log_x=True):
    """The x values where curve a crosses curve b, linearly interpolated
    between neighbouring points (in log10(x) when log_x and every x > 0).
    xs ascending; a, b the same length. Empty when they never cross."""
    use_log = log_x and all(x > 0 for x in xs)
    t = [math.log10(x) for x in xs] if use_log else list(xs)
    d = [ai - bi for ai, bi in zip(a, b)]
    out = []
    for i in range(len(d)):
        if d[i] == 0:
            if not out or out[-1] != xs[i]:
                out.append(xs[i])
            continue
        if i + 1 < len(d) and d[i + 1] != 0 and (d[i] < 0) != (d[i + 1] < 0):
            f = d[i] / (d[i] - d[i + 1])
            x = t[i] + f * (t[i + 1] - t[i])
            out.append(10 ** x if use_log else x)
    return out


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise DataError("%s: %s" % (path, e))


def stem(path):
    return os.path.splitext(os.path.basename(path))[0]


def where(path):
    """' (file name)' for titles; nothing for a binary's temporary --plot JSON."""
    name = stem(path)
    return "" if re.match(r"^\w+_perf-\w{6}$", name) else " (%s)" % name


def kind_of(doc):
    """'collective', one of the attention programs, or None."""
    rows = doc.get("results") if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and doc.get("program") in ("ring_attn_perf", "decode_attn_perf", "level_attn_perf",
                                                        "kv_attn_perf"):
        return doc["program"]
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict):
        return None
    r = rows[0]
    if "size" in r and ("out_of_place" in r or "in_place" in r):
        return "collective"
    if "variant" in r:
        return "level_attn_perf"
    if "lent_fraction" in r:
        return "kv_attn_perf"
    if "mode" in r and "T" in r:  # older files without "program": decode has one new token per sequence
        return "decode_attn_perf" if all(x.get("T") == x.get("batch") for x in rows) else "ring_attn_perf"
    return None


def rows_of(doc):
    return doc["results"] if isinstance(doc, dict) else doc


# ---- collectives ------------------------------------------------------------

def collective_label(doc, path, from_file=False):
    if from_file:  # CONFIG.COLL.rN: the panel names the collective
        label = re.sub(r"\.r\d+$", "", stem(path))
        return re.sub(r"\.(%s)$" % "|".join(COLLECTIVES), "", label) or label
    prog = ""
    args = doc.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        prog = os.path.basename(args[0])
    prog = prog or doc.get("program", "") or doc.get("config", {}).get("program", "")
    extra = doc.get("attncomm") or {}
    parts = [str(extra[k]) for k in ("transport", "algo") if extra.get(k)]
    if prog and parts:
        return "%s %s" % (prog, "/".join(parts))
    return re.sub(r"\.r\d+$", "", stem(path))  # repetitions of one configuration share a label


def collective_group(doc, path):
    coll = (doc.get("attncomm") or {}).get("collective")
    if coll:
        return coll
    text = " ".join([stem(path)] + [str(a) for a in (doc.get("args") or [])[:1]])
    for c in COLLECTIVES:
        if c in text:
            return c
    return "collective"


def collective_series(doc, path):
    """{'out_of_place': {size: busbw}, 'in_place': {...}} from a v3 file."""
    out = {"out_of_place": {}, "in_place": {}}
    for r in rows_of(doc):
        size = r.get("size")
        if not isinstance(size, (int, float)) or size <= 0:
            continue
        for place in out:
            m = r.get(place)
            if isinstance(m, dict) and isinstance(m.get("bus_bw"), (int, float)):
                out[place][size] = m["bus_bw"]
    if not out["out_of_place"] and not out["in_place"]:
        raise DataError("%s: no results with a size and bus_bw" % path)
    return out


def draw_collectives(ax, group, items):
    """items: [(label, [series, ...])]; repetitions merged by the median."""
    for i, (label, reps) in enumerate(items):
        color = "C%d" % (i % 10)
        for place, style in (("out_of_place", "-"), ("in_place", "--")):
            sizes = sorted({s for rep in reps for s in rep[place]})
            if not sizes:
                continue
            bw = [statistics.median([rep[place][s] for rep in reps if s in rep[place]]) for s in sizes]
            ax.plot(sizes, bw, style, marker="o", markersize=3, color=color,
                    label="%s%s" % (label, "" if place == "out_of_place" else " (in place)"))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(group)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


# ---- attention ----------------------------------------------------------------

def mode_curves(rows, x_of):
    """{mode: ([x...], [time_ms...])} sorted by x."""
    curves = {}
    for r in rows:
        curves.setdefault(r["mode"], []).append((x_of(r), r["time_us"] / 1e3))
    return {m: ([p[0] for p in sorted(v)], [p[1] for p in sorted(v)]) for m, v in curves.items()}


def mark_crossover(ax, curves, fmt):
    """Marks where pass-kv and pass-q cross; returns the text it wrote."""
    if "pass-kv" not in curves or "pass-q" not in curves:
        return ""
    xa, ya = curves["pass-kv"]
    xb, yb = curves["pass-q"]
    common = sorted(set(xa) & set(xb))
    a = [ya[xa.index(x)] for x in common]
    b = [yb[xb.index(x)] for x in common]
    xs = crossover(common, a, b)
    if not xs:
        text = "pass-KV / pass-Q: no crossover in range"
    else:
        for x in xs:
            ax.axvline(x, color="grey", linestyle=":", linewidth=1)
        text = "pass-KV / pass-Q crossover at " + ", ".join(fmt(x) for x in xs)
    ax.text(0.02, 0.02, text, transform=ax.transAxes, fontsize=7, va="bottom")
    return text


def draw_modes(ax, doc, path, program):
    rows = [r for r in rows_of(doc) if "mode" in r and "time_us" in r]
    if not rows:
        raise DataError("%s: no rows with a mode and time_us" % path)
    if program == "ring_attn_perf":
        curves = mode_curves(rows, lambda r: 100.0 * r["T"] / max(1, r["T"] + r["P"]))
        ax.set_xscale("log")
        ax.set_xlabel("KV cache miss rate T/(T+P), %")
        fmt = lambda x: "%.3g%%" % x
    else:
        curves = mode_curves(rows, lambda r: r.get("batch", r["T"]))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (sequences, one new token each)")
        fmt = lambda x: "batch %.3g" % x
    order = ["pass-kv", "pass-q", "ship-q", "heads", "auto", "sequential", "gather-kv"]  # one colour per mode everywhere
    for mode, (xs, ts) in sorted(curves.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
        color = "C%d" % (order.index(mode) if mode in order else 9)
        ax.plot(xs, ts, "o-" if mode != "auto" else "x--", markersize=4, color=color, label=mode)
    ticks = sorted({x for xs, _ in curves.values() for x in xs})
    ax.set_xticks(ticks)
    ax.set_xticklabels(["%g" % x for x in ticks], fontsize=7)
    ax.minorticks_off()
    ax.set_yscale("log")  # modes differ by multiples; noise too
    mark_crossover(ax, curves, fmt)
    n = rows[0].get("nranks")
    ax.set_ylabel("time (ms)")
    ax.set_title("%s%s%s" % (program, ", %d ranks" % n if n else "", where(path)), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def draw_level(ax, doc, path):
    rows = [r for r in rows_of(doc) if "variant" in r and "time_us" in r]
    if not rows:
        raise DataError("%s: no rows with a variant and time_us" % path)
    names = [r["variant"].replace("level ", "keep ") for r in rows]
    times = [r["time_us"] / 1e3 for r in rows]
    bars = ax.bar(range(len(rows)), times, color=["grey"] + ["C0"] * (len(rows) - 1))
    for bar, r in zip(bars, rows):
        if r.get("speedup_vs_pass_kv"):
            ax.annotate("%.2fx" % r["speedup_vs_pass_kv"], (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("time (ms)")
    ax.set_title("level_attn_perf: time per keep host:rack:cluster%s" % where(path), fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)


def draw_kv(ax, doc, path):
    rows = sorted((r for r in rows_of(doc) if "lent_fraction" in r), key=lambda r: r["lent_fraction"])
    if not rows:
        raise DataError("%s: no rows with a lent_fraction" % path)
    f = [r["lent_fraction"] for r in rows]
    ax.plot(f, [r["step_us"] / 1e3 for r in rows], "o-", label="decode step")
    ax.plot(f, [r["migrate_us"] / 1e3 for r in rows], "s--", label="migration (moving the KV)")
    ax.set_yscale("log")
    ax.set_xlabel("share of the request's blocks lent to other ranks")
    ax.set_ylabel("time (ms)")
    ax.set_title("kv_attn_perf%s" % where(path), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


# ---- main -----------------------------------------------------------------------

def panels(paths, label_from_file=False):
    """[(title, draw(ax))] in input order, collectives grouped by collective."""
    out, groups = [], {}
    for p in paths:
        doc = load(p)
        kind = kind_of(doc)
        if kind is None:
            raise DataError("%s: not a perf binary's JSON (no known results)" % p)
        if kind == "collective":
            group = collective_group(doc, p)
            if group not in groups:
                groups[group] = {}
                out.append((group, lambda ax, g=group: draw_collectives(ax, g, list(groups[g].items()))))
            groups[group].setdefault(collective_label(doc, p, label_from_file), []).append(collective_series(doc, p))
        elif kind == "level_attn_perf":
            out.append((p, lambda ax, d=doc, p=p: draw_level(ax, d, p)))
        elif kind == "kv_attn_perf":
            out.append((p, lambda ax, d=doc, p=p: draw_kv(ax, d, p)))
        else:
            out.append((p, lambda ax, d=doc, p=p, k=kind: draw_modes(ax, d, p, k)))
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--title", default="")
    ap.add_argument("--label-from-file", action="store_true",
                    help="label collective lines by file name (compare_*.sh: CONFIG.COLL.rN.json)")
    args = ap.parse_args(argv)
    try:
        todo = panels(args.json, args.label_from_file)
    except DataError as e:
        print(e, file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(NO_MATPLOTLIB, file=sys.stderr)
        return 3
    cols = min(3, len(todo))
    rows = (len(todo) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    try:
        for (_, draw), ax in zip(todo, axes.flat):
            draw(ax)
    except (DataError, KeyError, TypeError, ZeroDivisionError) as e:
        print("%s: unexpected data: %s" % (args.output, e), file=sys.stderr)
        return 1
    for ax in list(axes.flat)[len(todo):]:
        ax.set_visible(False)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    try:
        fig.savefig(args.output, dpi=110)
    except OSError as e:
        print("%s: %s" % (args.output, e), file=sys.stderr)
        return 1
    print("wrote", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
