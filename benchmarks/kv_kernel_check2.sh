#!/usr/bin/env bash
# Follow-up device call for the quantized-KV kernels (two GPUs), after the scale/zero load change:
#   bash benchmarks/kv_kernel_check2.sh OUT_DIR
# GPU 0: the quantized-KV kernel tests on the GPU, then the kernel sweep (small grid) for int8 and
#        int4 with each kernel's default code-reading mode.
# GPU 1: batch-1 decode with fp16 and int8 KV (run_capacity.sh bs1), then the int8 step profile.
set -u
out=${1:?OUT_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -m gpu -n 8 tests/kernels/test_kv_quant_kernels.py -q -rfE -p no:cacheprovider \
    >"$out/kv_tests.log" 2>&1
  echo "kv kernel tests rc=$?"
  tail -2 "$out/kv_tests.log"
  for q in 8 4; do
    timeout 100 python3 "$here/kv_attention_sweep.py" --small --policies $q --out "$out/sweep_q$q.json" \
      >"$out/sweep_q$q.log" 2>&1
    echo "[sweep q$q] rc=$?"
    sed -n '/best per case/,$p' "$out/sweep_q$q.log"
  done
}
lane1() {
  export CUDA_VISIBLE_DEVICES=1
  bash "$here/run_capacity.sh" bs1 "$out/cap" 100
  timeout 100 python3 "$here/profile_step.py" --out "$out/prof_q8.json" --quant-policy 8 \
    --cases "decode 1@128,decode 256" >"$out/prof_q8.log" 2>&1
  echo "profile rc=$?"
  grep -A3 "decode 1@128\|decode 256" "$out/prof_q8.log" | grep -v "^ *[a-z_]*(" | head -8
}
lane0 >"$out/lane0.txt" 2>&1 &
lane1 >"$out/lane1.txt" 2>&1 &
wait
cat "$out/lane0.txt" "$out/lane1.txt"
