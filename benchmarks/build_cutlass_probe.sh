#!/usr/bin/env bash
# Build the CUTLASS dense-GEMM probe (sm_90a): benchmarks/cuda/cutlass_gemm_probe.cu into
# build/cutlass_probe/libcutlass_probe.so for benchmarks/cutlass_probe.py. Needs nvcc (CUDA 12.4 or
# newer) and the CUTLASS headers, which the `nvidia-cutlass` wheel carries: CUTLASS_DIR defaults to its
# unpacked source folder. (The mixed-input W4A16 probe, `w4a16`, is at d4a0eb1: the engine's own library
# and benchmarks/w4a16_cutlass_table.py replaced it. This script still fetches curand_kernel.h into
# build/cutlass_probe/curand where the toolkit lacks it: HOTLOOP_CURAND_INCLUDE can point there.)
#
#   bash benchmarks/build_cutlass_probe.sh [gemm]   # unpacks nvidia-cutlass (pip download) if needed
#   CUTLASS_DIR=/path/to/cutlass bash benchmarks/build_cutlass_probe.sh
#
# Each configuration compiles in its own unit (minutes each), JOBS at a time (default: the cores).
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/cutlass_probe
NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null; then
  echo "no nvcc ('$NVCC'): install the CUDA toolkit (12.4 or newer) or set NVCC=/path/to/nvcc" >&2
  exit 2
fi
mkdir -p "$out"
if [ -z "${CUTLASS_DIR:-}" ]; then
  CUTLASS_DIR=$out/cutlass/cutlass_library/source
  if [ ! -d "$CUTLASS_DIR/include" ]; then
    python3 -m pip download -q --no-deps "nvidia-cutlass==4.2.0.0" -d "$out/wheel"
    python3 -m zipfile -e "$out"/wheel/nvidia_cutlass-*.whl "$out/cutlass"
  fi
fi
flags=(-std=c++17 -O3 -DNDEBUG -arch=sm_90a -Xcompiler -fPIC --expt-relaxed-constexpr
  -I "$CUTLASS_DIR/include" -I "$CUTLASS_DIR/tools/util/include" -DCUTLASS_ENABLE_TENSOR_CORE_MMA=1
  -I hotloop/kernels/cuda)
case ${1:-gemm} in
  gemm) src=benchmarks/cuda/cutlass_gemm_probe.cu lib=libcutlass_probe.so tag=cfg ;;
  *)
    echo "unknown probe '$1': want gemm (the w4a16 probe is at d4a0eb1)" >&2
    exit 2
    ;;
esac
n=$(sed -n 's/^#define PROBE_NUM \([0-9]*\)/\1/p' "$src")
# cutlass/util/mixed_dtype_utils.hpp (the W4A16 reorder) includes curand_kernel.h, which a
# toolkit without cuRAND lacks: take the header from the nvidia-curand wheel then
if ! echo '#include <curand_kernel.h>' | "$NVCC" -x cu -E - >/dev/null 2>&1; then
  if [ -z "$(find "$out/curand" -name curand_kernel.h 2>/dev/null | head -1)" ]; then
    python3 -m pip download -q --no-deps nvidia-curand -d "$out/curand_wheel"
    python3 -m zipfile -e "$out"/curand_wheel/nvidia_curand-*.whl "$out/curand"
  fi
  flags+=(-I "$(dirname "$(find "$out/curand" -name curand_kernel.h | head -1)")")
fi
JOBS=${JOBS:-$(nproc)}
objs=()
pids=()
for i in $(seq 0 $((n - 1))); do
  objs+=("$out/$tag$i.o")
  if [ ! -f "$out/$tag$i.o" ] || [ "$src" -nt "$out/$tag$i.o" ]; then
    rm -f "$out/$tag$i.o"  # (a failed compile must not leave an older configuration's object behind)
    (t0=$SECONDS; "$NVCC" "${flags[@]}" -DPROBE_CFG="$i" -c "$src" -o "$out/$tag$i.o" &&
      echo "config $i compiled in $((SECONDS - t0)) s") &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
  fi
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if [ "$failed" = 1 ]; then
  echo "a configuration failed to compile (see above)" >&2
  exit 1
fi
"$NVCC" "${flags[@]}" -DPROBE_TABLE -c "$src" -o "$out/${tag}table.o"
"$NVCC" -arch=sm_90a -shared -cudart static "${objs[@]}" "$out/${tag}table.o" -o "$out/$lib"
ls -la "$out/$lib"
