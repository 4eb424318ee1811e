#!/usr/bin/env bash
# Packs what tools/gpu/check.sh needs on a GPU machine that has the NVIDIA
# driver, CUDA 13 and NCCL but none of our Debian packages: the GPU tests and
# benchmark binaries (stripped), every shared library they load from this
# machine (glibc and its loader included, so the target's glibc does not
# matter), the CUDA runtime they dlopen, and check.sh. NCCL is not packed
# (libnccl.so.2 is ~210 MB): check.sh uses the target's.
#
# Usage: tools/gpu/pack.sh [BUILD_DIR [DEST]]
#   BUILD_DIR  the build with the binaries below (default build)
#   DEST       the folder to fill, emptied first (default BUILD_DIR/gpu-pack)
# Build first:
#   cmake --build build --target nccl_gpu_test data_plane_gpu_ipc_test \
#     baton-gpu-bench
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
dest=${2:-$build/gpu-pack}
# What one call to the GPU machine may carry.
limit_mib=60

binaries=("$build/tests/nccl_gpu_test" "$build/tests/data_plane_gpu_ipc_test"
  "$build/bin/baton-gpu-bench")
for binary in "${binaries[@]}"; do
  if [ ! -x "$binary" ]; then
    echo "pack.sh: $binary is missing; build it first:" >&2
    echo "  cmake --build $build --target nccl_gpu_test data_plane_gpu_ipc_test baton-gpu-bench" >&2
    exit 1
  fi
done

# The CUDA runtime the binaries dlopen: the one CMake found for this build.
cudart=$(sed -n 's/^CUDA_cudart_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt")
if [ -z "$cudart" ] || [ ! -e "$cudart" ]; then
  echo "pack.sh: no CUDA runtime in $build/CMakeCache.txt (CUDA_cudart_LIBRARY)" >&2
  exit 1
fi
cudart=$(readlink -f "$cudart")
cudart_soname=$(objdump -p "$cudart" | awk '/SONAME/ {print $2}')

rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
for binary in "${binaries[@]}"; do
  strip --strip-all -o "$dest/bin/$(basename "$binary")" "$binary"
done

# The NCCL the build found: not packed, but what it needs from glibc is
# (libdl, librt: the binaries themselves do not ask for them).
nccl=$(readlink -f "$(sed -n 's/^NCCL_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt")")

# Every library ldd resolves for the binaries and the libraries they dlopen,
# under the name asked for, and the loader itself (check.sh runs the
# binaries through it).
declare -A packed=()
for binary in "${binaries[@]}" "$cudart" "$nccl"; do
  while read -r name path; do
    if [ -z "${packed[$name]:-}" ]; then
      cp -L "$path" "$dest/lib/$name"
      packed[$name]=1
    fi
  done < <(ldd "$binary" | awk '
    $2 == "=>" && $3 ~ /^\// && $1 !~ /^libnccl/ { print $1, $3 }
    $1 ~ /ld-linux/ { n = split($1, parts, "/"); print parts[n], $1 }')
done
if [ ! -e "$dest/lib/ld-linux-x86-64.so.2" ]; then
  echo "pack.sh: ldd named no ld-linux-x86-64.so.2 loader" >&2
  exit 1
fi
cp -L "$cudart" "$dest/lib/$cudart_soname"
cp "$root/tools/gpu/check.sh" "$dest/check.sh"
chmod +x "$dest/check.sh"

nccl_header=$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")/nccl.h
{
  echo "baton GPU pack, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
    git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built against: CUDA runtime $cudart_soname, NCCL $(
    awk '/#define NCCL_(MAJOR|MINOR|PATCH) / {printf "%s%s", sep, $3; sep="."}' \
      "$nccl_header" 2>/dev/null)"
  echo "needs on the target: the NVIDIA driver (libcuda.so.1) and libnccl.so.2"
  echo
  (cd "$dest" && find . -type f | sort | xargs ls -l | awk '{print $5, $9}')
} > "$dest/MANIFEST"

size_kib=$(du -sk "$dest" | awk '{print $1}')
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  echo "pack.sh: $dest is $((size_kib / 1024)) MiB, over $limit_mib MiB" >&2
  exit 1
fi
echo "packed $dest: $(find "$dest/bin" -type f | wc -l) binaries, $(find "$dest/lib" -type f | wc -l) libraries, $((size_kib / 1024)) MiB"
