#!/usr/bin/env bash
# Issue-6 capacity workloads on the GPU (Llama-3-8B shape, dummy weights), one lane per call so that
# lanes can run side by side on a two-GPU machine:
#
#   bash benchmarks/run_capacity.sh LANE OUT_DIR [TIMEOUT_S]
#
# Lanes:
#   kv_fp16 | kv_int8 | kv_int4  offline throughput bound by KV memory: 1000 requests of 4096 in /
#                                1024 out, ignore_eos, max batch 512, --quant-policy 0 / 8 / 4
#   bs1                          batch-1 decode, 128 in / 512 out, fp16 KV then int8 KV
#   bs1_int8                     the same, int8 KV only
#   prefix                       2,048-token shared prompt + 256 distinct 64-token suffixes, all sent at
#                                once to `hotloop serve`, 128 out; prefix caching off, then on
# Each run writes its JSON and log under OUT_DIR; the table is in BENCHMARKS.md.
set -u
lane=$1
out=$2
limit=${3:-560}
mkdir -p "$out"
py=${PYTHON:-python3}
bench() {  # name kind args...
  local name=$1 kind=$2
  shift 2
  echo "[$name] start $(date +%T)"
  timeout "$limit" "$py" -m hotloop.bench.offline "$kind" --model llama3-8b --load-format dummy \
    --dtype bfloat16 --output-json "$out/$name.json" "$@" >"$out/$name.log" 2>&1
  echo "[$name] rc=$? $(date +%T)"
  tail -4 "$out/$name.log"
}
kv() {  # policy
  bench "kv_bound_q$1" throughput --num-prompts 1000 --input-len 4096 --output-len 1024 \
    --session-len 5120 --max-batch-size 512 --max-prefill-token-num 16384 --quant-policy "$1"
}
case $lane in
  kv_fp16) kv 0 ;;
  kv_int8) kv 8 ;;
  kv_int4) kv 4 ;;
  bs1 | bs1_int8)
    qs=(0 8)
    [ "$lane" = bs1_int8 ] && qs=(8)
    for q in "${qs[@]}"; do
      bench "bs1_q$q" latency --batch-size 1 --input-len 128 --output-len 512 --num-iters 3 \
        --session-len 2048 --max-batch-size 8 --quant-policy "$q"
    done
    ;;
  prefix)
    port=${PORT:-23400}
    for mode in off on; do
      extra=()
      [ "$mode" = on ] && extra=(--enable-prefix-caching)
      echo "[prefix_$mode] start $(date +%T)"
      timeout "$limit" "$py" "$(dirname "$0")/run_serve.py" --out "$out/prefix_$mode" --port "$port" \
        --prefix-len 2048 --input-len 64 --output-len 128 --num-prompts 256 --request-rate inf \
        -- --session-len 4096 "${extra[@]}" >"$out/prefix_$mode.log" 2>&1
      echo "[prefix_$mode] rc=$? $(date +%T)"
      grep -E "Median TTFT|Output token throughput|Failed" "$out/prefix_$mode.log"
      port=$((port + 1))
    done
    ;;
  *)
    echo "unknown lane $lane (kv_fp16, kv_int8, kv_int4, bs1, bs1_int8, prefix)" >&2
    exit 2
    ;;
esac
