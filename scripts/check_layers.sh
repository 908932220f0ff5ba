#!/usr/bin/env bash
# The layering rules of docs/ARCHITECTURE.md on the include graph: leaves
# (transports/*, kernels/*, topology) include no other leaf and nothing of
# src/ but the transport interface and its error/log helpers; src/core
# includes nothing above it; no include cycle between folders; no source
# file over 600 lines outside tests. --report lists without failing.
set -euo pipefail
exec python3 "$(dirname "$0")/check_layers.py" "$@"
