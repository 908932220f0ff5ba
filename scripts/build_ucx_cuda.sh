#!/usr/bin/env bash
# UCX with CUDA support for the GPU machine, built here (it has no package
# registry) and carried in .device/ucx-cuda (git-ignored): a stripped,
# relocatable install (lib/, include/, bin/ucx_info) that
# scripts/gpu_check.sh builds attncomm against. Debian's UCX has no CUDA.
#
#   bash scripts/build_ucx_cuda.sh        # skips when .device/ucx-cuda is complete
#
# Needs: the CUDA toolkit (CUDA_HOME, default /usr/local/cuda), autotools,
# git, and for NVML's header (not in the toolkit here) pip. The UCX source
# comes from UCX_SRC, else UCX_GIT_DIR (a bare mirror: git archive), else a
# shallow clone from GitHub. The build happens in UCX_WORK (outside the repo).
# Environment: UCX_VERSION (1.22.0), UCX_WORK (<repo>/../ucx-src), JOBS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEST=$ROOT/.device/ucx-cuda
UCX_VERSION=${UCX_VERSION:-1.22.0}
UCX_WORK=${UCX_WORK:-$(dirname "$ROOT")/ucx-src}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
JOBS=${JOBS:-2}

if [ -s "$DEST/.complete" ] && [ -f "$DEST/lib/libucp.so" ]; then
  echo "ucx-cuda: $DEST holds $(cat "$DEST/.complete"); nothing to do"
  exit 0
fi
mkdir -p "$UCX_WORK"
SRC=${UCX_SRC:-$UCX_WORK/ucx-$UCX_VERSION}
PREFIX=$UCX_WORK/install-$UCX_VERSION
BLD=$UCX_WORK/build-$UCX_VERSION

# ---- source ------------------------------------------------------------------
if [ ! -f "$SRC/configure.ac" ]; then
  if [ -n "${UCX_GIT_DIR:-}" ]; then
    mkdir -p "$SRC"
    git --git-dir="$UCX_GIT_DIR" archive "v$UCX_VERSION" | tar -x -C "$SRC"
  else
    git clone --depth 1 --branch "v$UCX_VERSION" https://github.com/openucx/ucx "$SRC"
  fi
fi

# ---- NVML ----------------------------------------------------------------------
# UCX's cuda modules need nvml.h and libnvidia-ml. The header comes from
# NVIDIA's nvidia-nvml-dev wheel (matching the toolkit's version) when the
# toolkit lacks it; the library is the driver's, which this machine has not,
# so a link-only stub stands in (soname libnvidia-ml.so.1, like the toolkit's
# own stubs): the GPU machine's driver provides the real one at run time.
NVML=$UCX_WORK/nvml
nvml_cppflags=() nvml_ldflags=()
if [ ! -f "$CUDA_HOME/include/nvml.h" ]; then
  if [ ! -f "$NVML/include/nvml.h" ]; then
    cuda_mm=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
    mkdir -p "$NVML/whl" "$NVML/include"
    pip download --no-deps --only-binary=:all: -d "$NVML/whl" "nvidia-nvml-dev==$cuda_mm.*"
    python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
n = [f for f in z.namelist() if f.endswith("include/nvml.h")][0]
open(sys.argv[2], "wb").write(z.read(n))' "$(ls "$NVML"/whl/*.whl | head -1)" "$NVML/include/nvml.h"
  fi
  nvml_cppflags=("-I$NVML/include")
fi
if [ ! -f "$CUDA_HOME/lib64/stubs/libnvidia-ml.so" ] && ! ldconfig -p | grep -q 'libnvidia-ml\.so '; then
  if [ ! -f "$NVML/stubs/libnvidia-ml.so" ]; then
    mkdir -p "$NVML/stubs"
    hdr=$CUDA_HOME/include/nvml.h
    [ -f "$hdr" ] || hdr=$NVML/include/nvml.h
    # Every function nvml.h declares, as a symbol that only has to exist.
    grep DECLDIR "$hdr" | grep -oE '\bnvml[A-Za-z0-9_]+ *\(' | tr -d ' (' | sort -u |
      sed 's/.*/int &(void) { return 999; }/' >"$NVML/stubs/nvml_stub.c"
    gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$NVML/stubs/libnvidia-ml.so" "$NVML/stubs/nvml_stub.c"
  fi
  nvml_ldflags=("-L$NVML/stubs")
fi

# ---- build -------------------------------------------------------------------
# Only what attncomm needs next to CUDA: shared memory and TCP transports,
# the cuda modules; no InfiniBand, knem, xpmem, gdrcopy, bindings, fuse
# or libbfd (libraries the GPU machine may lack). No device code (NVCC is
# "false"): it only serves ucx_perftest's GPU kernels, and with rdma-core's
# headers installed those want the GPUNetIO submodule that an archive lacks.
(cd "$SRC" && { [ -x configure ] || ./autogen.sh; })
rm -rf "$BLD" "$PREFIX"
mkdir -p "$BLD"
(cd "$BLD" && "$SRC/contrib/configure-release" --prefix="$PREFIX" \
   --disable-static --enable-mt --with-cuda="$CUDA_HOME" \
   --without-verbs --without-rdmacm --without-knem --without-xpmem --without-gdrcopy \
   --without-rocm --without-ze --without-ugni --without-efa --without-mad --without-gaudi \
   --without-java --without-go --without-fuse3 --without-bfd --without-valgrind --without-mpi \
   --disable-examples --disable-gtest --disable-test-apps \
   NVCC="$(type -P false)" CPPFLAGS="${nvml_cppflags[*]:-}" LDFLAGS="${nvml_ldflags[*]:-}" >configure.log)
grep -E "(UCT|UCM|CUDA) modules" "$BLD/configure.log" || true
make -C "$BLD" -j"$JOBS" >"$BLD/make.log"
make -C "$BLD" install >"$BLD/install.log"

# ---- collect -----------------------------------------------------------------
# Relocatable: no libtool archives (absolute paths), pkg-config files relative
# to themselves; ucx-config.cmake already finds its prefix from its own path,
# and UCX its modules from libucs's. The libraries' RUNPATH names $PREFIX,
# which is removed below, so a test here of the moved copy is a fair one.
# Of the tools only ucx_info and ucx_perftest (which needs libgomp): the rest
# would add libstdc++.
find "$PREFIX" -name '*.la' -delete
rm -rf "$PREFIX/share" "$PREFIX"/bin/{io_demo,ucx_perftest_daemon,ucx_read_profile}
for pc in "$PREFIX"/lib/pkgconfig/*.pc; do
  sed -i 's|^prefix *= *.*|prefix=${pcfiledir}/../..|' "$pc"
done
find "$PREFIX/lib" "$PREFIX/bin" -type f \( -name '*.so*' -o -perm -u+x \) -exec strip --strip-unneeded {} + 2>/dev/null || true
ls "$PREFIX/lib/ucx/libuct_cuda.so" >/dev/null  # the point of all this
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
cp -a "$PREFIX" "$DEST"
rm -rf "$PREFIX"
LD_LIBRARY_PATH=$DEST/lib "$DEST/bin/ucx_info" -v | sed -n 's/# Library version: /ucx /p' >"$DEST/.complete"
echo "ucx-cuda: $(cat "$DEST/.complete") in $DEST ($(du -sh "$DEST" | cut -f1))"
