#!/usr/bin/env python3
"""The house rules of docs/ARCHITECTURE.md, checked on the include graph.

  check_layers.py [--report] [--dot FILE]

Fails (exit 1) on:
  - a leaf (a transport under transports/, kernels/, topology/) including
    another leaf, or anything in src/ beyond what it may use: for a
    transport the transport kit (its interface and helpers, LEAF_MAY_USE),
    for kernels and topology errors and logging only;
  - src/core including src/attn, src/coll, src/device or src/api;
  - an include cycle between folders;
  - a source file over 600 lines outside tests (the public header aside).
--report prints the same list but exits 0. --known FILE fails only on
problems not listed in FILE (the debt still to be paid, one problem a line
as printed, line numbers left out), and on listed ones that are gone, so the
list only shrinks. --dot writes the folder-level include graph for Graphviz
(scripts/include_graph.sh draws it).
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = re.compile(r"\.(cc|h|cu|cuh|c)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# What a leaf may include from src/, "the transport kit": the transport
# interface (transport.h, and bootstrap.h through which a transport's setup
# exchanges addresses) and the helpers transports are written with: errors,
# logging, settings, sockets and the handshake's authentication, shareable
# memory and process watching. Kit headers include nothing else of src/
# (checked below), so a leaf that uses them still reaches nothing above.
LEAF_MAY_USE = {
    "src/core/transport.h", "src/core/bootstrap.h", "src/core/error.h", "src/core/log.h",
    "src/core/env.h", "src/core/settings.h", "src/core/socket.h", "src/core/auth.h",
    "src/core/shareable_memory.h", "src/core/process_watch.h",
}
# Kernels and topology read no environment (their callers pass settings in):
# of src/ they may use errors and logging only.
PURE_LEAF_MAY_USE = {"src/core/error.h", "src/core/log.h"}
MAX_LINES = 600
LONG_FILE_EXEMPT = {"include/attncomm.h"}
SKIP_TOPS = ("tests/", "build", "third_party/", ".")


def tracked_sources():
    """git's files (tracked, or new and not ignored); every file outside a checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
        paths = out.split("\n")
    except (OSError, subprocess.CalledProcessError):
        paths = [os.path.relpath(os.path.join(d, f), ROOT)
                 for d, _, fs in os.walk(ROOT) for f in fs]
    for path in paths:
        if path and SOURCE.search(path) and not path.startswith(SKIP_TOPS) \
                and os.path.exists(os.path.join(ROOT, path)):
            yield path


def folder(path):
    """The unit the rules speak of: transports/tcp, kernels, topology, src/core, perf/attn ...
    kernels/ is one leaf: its CUDA kernels take the CPU kernels' argument types."""
    parts = path.split("/")
    if parts[0] in ("transports", "src", "perf") and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0] if len(parts) > 1 else "."


def resolve(includer, name, files):
    """A quoted include as the build resolves it: from the including file's
    folder first, then from the repository root (the project's include path)."""
    local = os.path.normpath(os.path.join(os.path.dirname(includer), name))
    if local in files:
        return local
    if name in files:
        return name
    return None  # a system or generated header


def is_leaf(f):
    return f in ("kernels", "topology") or f.startswith("transports/")


def find_cycles(edges):
    """Strongly connected components of more than one folder (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    nodes = sorted(set(edges) | {b for bs in edges.values() for b in bs})
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def key(problem):
    """A problem without its line number, so a known one survives edits above it."""
    return re.sub(r"^([^:]+):\d+:", r"\1:", problem)


def write_dot(path, edges, bad_edges):
    """Folders as boxes, arrows from includer to included; leaves green, the
    library's floors blue, tools grey; an arrow that breaks a rule is red."""
    nodes = sorted(set(edges) | {b for bs in edges.values() for b in bs})

    def colour(n):
        if is_leaf(n):
            return "#d8f0d8"
        if n.startswith("src/") or n == "include":
            return "#d8e4f8"
        return "#eeeeee"

    with open(path, "w") as f:
        f.write("digraph attncomm {\n  rankdir=TB; nodesep=0.3; ranksep=0.6;\n"
                "  node [shape=box, style=filled, fontname=Helvetica, fontsize=11];\n"
                "  edge [color=\"#777777\", arrowsize=0.6];\n")
        for n in nodes:
            f.write(f'  "{n}" [fillcolor="{colour(n)}"];\n')
        for a in sorted(edges):
            for b in sorted(edges[a]):
                attr = ' [color="#d03030", penwidth=1.6]' if (a, b) in bad_edges else ""
                f.write(f'  "{a}" -> "{b}"{attr};\n')
        f.write("}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", action="store_true", help="list, but exit 0")
    ap.add_argument("--dot", help="write the folder include graph (Graphviz) here")
    ap.add_argument("--known", help="a file of known problems: fail only on others")
    args = ap.parse_args()

    files = set(tracked_sources())
    problems = []
    edges = {}
    bad_edges = set()
    for path in sorted(files):
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = text.count("\n")
        if lines > MAX_LINES and path not in LONG_FILE_EXEMPT:
            problems.append(f"{path}: {lines} lines (at most {MAX_LINES} outside tests)")
        src_folder = folder(path)
        for m in INCLUDE.finditer(text):
            target = resolve(path, m.group(1), files)
            if target is None:
                continue
            dst_folder = folder(target)
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path}:{line}: includes {target}"
            if dst_folder != src_folder:
                edges.setdefault(src_folder, set()).add(dst_folder)
            if is_leaf(src_folder) and dst_folder != src_folder:
                if is_leaf(dst_folder):
                    problems.append(f"{where} (a leaf including another leaf)")
                    bad_edges.add((src_folder, dst_folder))
                elif target.startswith("src/"):
                    transport = src_folder.startswith("transports/")
                    allowed = LEAF_MAY_USE if transport else PURE_LEAF_MAY_USE
                    if target not in allowed:
                        problems.append(f"{where} (a leaf reaching into src/ beyond " + (
                            "the transport kit)" if transport else "errors and logging)"))
                        bad_edges.add((src_folder, dst_folder))
            if path in LEAF_MAY_USE and target.startswith("src/") and target not in LEAF_MAY_USE:
                problems.append(f"{where} (a transport-kit header including more of src/)")
            if src_folder == "src/core" and dst_folder in ("src/attn", "src/coll", "src/device",
                                                            "src/api"):
                problems.append(f"{where} (src/core is the ground floor: it includes nothing above it)")
                bad_edges.add((src_folder, dst_folder))
    for comp in find_cycles(edges):
        problems.append("include cycle between folders: " + " <-> ".join(comp))

    if args.dot:
        write_dot(args.dot, edges, bad_edges)

    if args.known:
        with open(args.known) as f:
            known = {l.strip() for l in f if l.strip() and not l.startswith("#")}
        keys = {key(p): p for p in problems}
        new = [p for k, p in keys.items() if k not in known]
        gone = sorted(k for k in known if k not in keys)
        for p in new:
            print("new: " + p)
        for k in gone:
            print(f"fixed (remove it from {args.known}): {k}")
        print(f"check_layers: {len(problems)} problem(s), {len(new)} new, {len(gone)} fixed, "
              f"in {len(files)} source files")
        return 0 if args.report or not (new or gone) else 1
    for p in problems:
        print(p)
    print(f"check_layers: {len(problems)} problem(s) in {len(files)} source files")
    return 0 if args.report or not problems else 1


if __name__ == "__main__":
    sys.exit(main())
