#!/usr/bin/env bash
# Configures attncomm with CMake generators, as a user who never heard of
# scripts/build.sh would: `cmake -S . -B dir [-G gen]`, then optionally
# builds one target. A generator whose toolchain this machine lacks (Green
# Hills MULTI, Watcom WMake) is skipped when a hello-world project fails
# with it too; any other failure fails the script.
#
#   check_generators.sh                  every generator cmake lists, configure only
#   check_generators.sh --default        the default generator only (CI)
#   check_generators.sh --build TARGET   also build TARGET (e.g. attncomm) with each
#   check_generators.sh --gen NAME       only this generator (repeatable)
set -uo pipefail
cd "$(dirname "$0")/.."
src=$PWD
work=${GEN_WORK_DIR:-$(mktemp -d /tmp/attn-generators.XXXXXX)}
target=""
gens=()
default_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) target=$2; shift 2 ;;
    --gen) gens+=("$2"); shift 2 ;;
    --default) default_only=1; shift ;;
    *) echo "usage: $0 [--default] [--gen NAME]... [--build TARGET]" >&2; exit 2 ;;
  esac
done

# The generator names from `cmake --help` ("* " marks the default; a long
# name may carry its "= description" on the next line).
list_generators() {
  cmake --help | sed -n '/^Generators/,$p' | grep -E '^[ *] [^ ]' |
    sed -E 's/^[ *] +//; s/ *=.*$//; s/ +$//' | grep -v '^$'
}

if [ "$default_only" = 1 ]; then
  gens=("")
elif [ ${#gens[@]} -eq 0 ]; then
  mapfile -t gens < <(list_generators)
fi

mkdir -p "$work/hello"
cat > "$work/hello/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.20)
project(hello CXX)
file(WRITE ${CMAKE_BINARY_DIR}/hello.cc "int main() { return 0; }\n")
add_executable(hello ${CMAKE_BINARY_DIR}/hello.cc)
EOF

failed=0
for g in "${gens[@]}"; do
  name=${g:-default}
  slug=$(echo "$name" | tr -c 'A-Za-z0-9' '_')
  gflag=()
  [ -n "$g" ] && gflag=(-G "$g")
  if [ -n "$g" ] && ! cmake -S "$work/hello" -B "$work/hello-$slug" "${gflag[@]}" > "$work/hello-$slug.log" 2>&1; then
    echo "skip  $name: a hello-world C++ project does not configure with it here either ($work/hello-$slug.log)"
    continue
  fi
  dir="$work/attn-$slug"
  if ! cmake -S "$src" -B "$dir" "${gflag[@]}" > "$work/attn-$slug.log" 2>&1; then
    echo "FAIL  $name: configure (log: $work/attn-$slug.log)"
    grep -A4 'CMake Error' "$work/attn-$slug.log" | head -20
    failed=1
    continue
  fi
  if [ -n "$target" ]; then
    if ! cmake --build "$dir" --target "$target" --config Release -j "$(nproc)" \
         > "$work/build-$slug.log" 2>&1; then
      echo "FAIL  $name: build of $target (log: $work/build-$slug.log)"
      tail -20 "$work/build-$slug.log"
      failed=1
      continue
    fi
    echo "ok    $name: configured and built $target"
  else
    echo "ok    $name: configured"
  fi
done
[ -z "${GEN_WORK_DIR:-}" ] && [ "$failed" = 0 ] && rm -rf "$work"
exit "$failed"
