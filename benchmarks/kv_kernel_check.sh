#!/usr/bin/env bash
# One two-GPU device call for the quantized-KV attention kernels (issue 6):
#
#   bash benchmarks/kv_kernel_check.sh OUT_DIR
#
# GPU 0: the kernel tests on the GPU, then benchmarks/kv_attention_sweep.py (small grid) for each
#        way of reading codes: HOTLOOP_KV_PRMT (PTX byte permutes) x HOTLOOP_KV_INT8_PAIRS (int8
#        codes read as 16-bit pairs), and bf16 for reference.
# GPU 1: the KV-bound offline run with int8 KV (run_capacity.sh kv_int8), default modes.
set -u
out=${1:?OUT_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 8 tests/kernels -q -rfE -p no:cacheprovider >"$out/kernel_tests.log" 2>&1
  echo "kernel tests rc=$?"
  tail -3 "$out/kernel_tests.log"
  for mode in "8 0 0" "8 1 0" "8 0 1" "8 1 1" "4 0 1" "4 1 1" "0 1 1"; do
    set -- $mode
    HOTLOOP_KV_PRMT=$2 HOTLOOP_KV_INT8_PAIRS=$3 timeout 150 python3 "$here/kv_attention_sweep.py" --small \
      --policies "$1" --out "$out/sweep_q$1_prmt$2_pairs$3.json" >"$out/sweep_q$1_prmt$2_pairs$3.log" 2>&1
    echo "[q$1 prmt=$2 pairs=$3] rc=$?"
    sed -n '/best per case/,$p' "$out/sweep_q$1_prmt$2_pairs$3.log"
  done
}
lane1() {
  export CUDA_VISIBLE_DEVICES=1
  bash "$here/run_capacity.sh" kv_int8 "$out/cap" 470
}
lane0 >"$out/lane0.txt" 2>&1 &
lane1 >"$out/lane1.txt" 2>&1 &
wait
cat "$out/lane0.txt" "$out/lane1.txt"
