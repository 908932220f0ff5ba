#!/usr/bin/env bash
# Installs what attncomm needs to build and test on Debian 12 / Ubuntu.
# Idempotent: packages already present are not reinstalled. Optional
# dependencies (hwloc, UCX, ibverbs, MPI, Gloo, OpenBLAS; clang with its
# libFuzzer and sanitizer runtimes for scripts/sanitize.sh and fuzz.sh) are
# installed too so the perf baselines, topology code and fuzzers are
# exercised; the library builds without them.
set -euo pipefail
REQUIRED=(build-essential cmake ninja-build pkg-config libgtest-dev libgmock-dev libssl-dev iproute2 python3)
OPTIONAL=(libopenblas-dev libhwloc-dev hwloc libxml2-dev libucx-dev ucx-utils libibverbs-dev
          openmpi-bin libopenmpi-dev libgloo-dev graphviz python3-numpy python3-matplotlib
          clang libclang-rt-dev)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=$(command -v sudo || true); fi
missing=()
for p in "${REQUIRED[@]}" "${OPTIONAL[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "install_deps: no apt-get; install by hand: ${missing[*]}" >&2
    exit 1
  fi
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${REQUIRED[@]}" >/dev/null
  # Optional packages one by one: a missing one must not stop the build.
  for p in "${OPTIONAL[@]}"; do
    $SUDO apt-get install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 ||
      echo "install_deps: optional package $p unavailable, continuing" >&2
  done
fi
# The Python tests run on the python3 first on PATH (the one CMake finds),
# which need not be Debian's (pyenv, a venv): give it numpy through pip
# when python3-numpy does not reach it. Optional: the tests skip without it.
if ! python3 -c "import numpy" >/dev/null 2>&1; then
  echo "install_deps: numpy for $(command -v python3) through pip"
  python3 -m pip install --quiet numpy >/dev/null 2>&1 ||
    echo "install_deps: pip could not install numpy; the Python tests will skip" >&2
fi
# The same for matplotlib: the perf binaries' --plot and compare_*.sh's
# pictures run perf/plot_perf.py on that python3 (they skip without it).
if ! python3 -c "import matplotlib" >/dev/null 2>&1; then
  echo "install_deps: matplotlib for $(command -v python3) through pip"
  python3 -m pip install --quiet matplotlib >/dev/null 2>&1 ||
    echo "install_deps: pip could not install matplotlib; --plot and the plot tests will skip" >&2
fi
