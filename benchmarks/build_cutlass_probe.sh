#!/usr/bin/env bash
# Build benchmarks/cuda/cutlass_gemm_probe.cu into build/cutlass_probe/libcutlass_probe.so (sm_90a) for
# benchmarks/cutlass_probe.py. Needs nvcc (CUDA 12.4 or newer) and the CUTLASS headers, which the
# `nvidia-cutlass` wheel carries: CUTLASS_DIR defaults to its unpacked source folder.
#
#   bash benchmarks/build_cutlass_probe.sh            # unpacks nvidia-cutlass (pip download) if needed
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
  -I "$CUTLASS_DIR/include" -I "$CUTLASS_DIR/tools/util/include" -DCUTLASS_ENABLE_TENSOR_CORE_MMA=1)
src=benchmarks/cuda/cutlass_gemm_probe.cu
n=$(sed -n 's/^#define PROBE_NUM \([0-9]*\)/\1/p' "$src")
JOBS=${JOBS:-$(nproc)}
objs=()
pids=()
for i in $(seq 0 $((n - 1))); do
  objs+=("$out/cfg$i.o")
  if [ ! -f "$out/cfg$i.o" ] || [ "$src" -nt "$out/cfg$i.o" ]; then
    rm -f "$out/cfg$i.o"  # (a failed compile must not leave an older configuration's object behind)
    (t0=$SECONDS; "$NVCC" "${flags[@]}" -DPROBE_CFG="$i" -c "$src" -o "$out/cfg$i.o" &&
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
"$NVCC" "${flags[@]}" -DPROBE_TABLE -c "$src" -o "$out/table.o"
"$NVCC" -arch=sm_90a -shared -cudart static "${objs[@]}" "$out/table.o" -o "$out/libcutlass_probe.so"
ls -la "$out/libcutlass_probe.so"
