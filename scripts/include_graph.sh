#!/usr/bin/env bash
# Draws the folder-level include graph (docs/include_graph.svg) with
# Graphviz from the sources as they are: an arrow from includer to included,
# red where it breaks a rule of scripts/check_layers.sh.
#   include_graph.sh [OUT.svg]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/include_graph.svg}
command -v dot > /dev/null || { echo "include_graph: needs Graphviz's dot (apt install graphviz)" >&2; exit 2; }
dotfile=$(mktemp /tmp/attn-includes.XXXXXX.dot)
trap 'rm -f "$dotfile"' EXIT
python3 scripts/check_layers.py --report --dot "$dotfile" > /dev/null
dot -Tsvg "$dotfile" -o "$out"
echo "include_graph: wrote $out"
