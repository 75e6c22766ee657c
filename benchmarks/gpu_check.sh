#!/usr/bin/env bash
# One device call that re-checks the open GPU items, one lane per GPU of an `nvidia-h200-x2`
# machine (on one GPU the lanes run one after the other):
#
#   bash benchmarks/gpu_check.sh OUT_DIR          # the checks below
#   bash benchmarks/gpu_check.sh OUT_DIR serve    # the issue-3 serving run, plain on GPU 0 and with
#                                                 # --jit-schedule on GPU 1, side by side
#   bash benchmarks/gpu_check.sh OUT_DIR table_kv # GPU 0 as in `table`; GPU 1 the KV-bound int8
#                                                 # run and batch 1 with fp16 and int8 KV
#   bash benchmarks/gpu_check.sh OUT_DIR one_row  # the one-row decode path's GPU tests and
#                                                 # benchmarks/dense_gemv.py on GPU 0; batch 1 with
#                                                 # HOTLOOP_DENSE_GEMV=1 then 0 on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR one_row_table  # its GPU tests and run_gpu.py's batch-1
#                                                 # rows on GPU 0; batch 1 with fp16 / int8 KV
#                                                 # (twice, then without the path) on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR pdl      # every GPU test, batch 1 fp16 / int8 KV on GPU 0;
#                                                 # batch 1 and the batch-256 step with
#                                                 # HOTLOOP_PDL=1 then 0 on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR fusions  # every GPU test on GPU 0; batch 1 with
#                                                 # HOTLOOP_ONE_ROW_ROPE / HOTLOOP_DECODE_FUSED_MERGE
#                                                 # off, each on, both on, then W4A16 batch 1 with
#                                                 # HOTLOOP_PDL=1 and 0, on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR head     # dense_gemv / one-row GPU tests, the rope and LM-head
#                                                 # launch grids, batch 1 with HOTLOOP_ONE_ROW_ROPE /
#                                                 # HOTLOOP_ONE_ROW_LM_HEAD on GPU 0; the W4A16 offline
#                                                 # row, then serving, on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR argmax   # the new kernels' GPU tests, batch 1 with the greedy
#                                                 # argmax kernel on / off, a profile, on GPU 0; batch 1
#                                                 # with fp16 / int8 KV and W4A16 on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR late     # 8B batch 1 with the rope fusion on / off (twice) on
#                                                 # GPU 0; SmolLM2 the same, then serving, on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR final    # batch 1 with every default: 8B twice and SmolLM2 on
#                                                 # GPU 0; fp16 / int8 KV and W4A16 on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR qrope    # the rope GEMV into quantized caches: GPU tests on
#                                                 # GPU 0; batch 1 with fp16 / int8 KV on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR qrope_ab # batch 1 with int8 (GPU 0) / int4 (GPU 1) KV, the rope
#                                                 # fusion into quantized caches on / off, alternating
#   bash benchmarks/gpu_check.sh OUT_DIR next     # every GPU test, then the int8 quantized-rope A/B, on
#                                                 # GPU 0; batch 1 with every default (8B, SmolLM2,
#                                                 # W4A16), then the int4 A/B, on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR splits   # the batch-256 row and 8B batch 1 with the decode
#                                                 # splits capped (HOTLOOP_DECODE_MAX_SPLITS) on GPU 0;
#                                                 # SmolLM2 batch 1 the same on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR hostprof # where a batch-256 decode step's host time goes:
#                                                 # host_profile.py, 8B on GPU 0; host_step.py (CPU
#                                                 # only) and SmolLM2's profile on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR gc       # the batch-256 row, its host profile and the offline
#                                                 # row on GPU 0; serving, then batch 1 with fp16 /
#                                                 # int8 KV alternating, on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR dequant  # the W4A16 GPU tests and awq_gemm.py on GPU 0; the
#                                                 # W4A16 offline row and batch 1 on GPU 1
#   bash benchmarks/gpu_check.sh OUT_DIR table    # the issue-4 offline and batch-256 rows and the
#                                                 # W4A16 batch-1 rows with and without
#                                                 # --embeddings-on-host (run_gpu.py) on GPU 0, the
#                                                 # issue-3 serving run on GPU 1
#
# lane 0: every GPU test (`pytest -m gpu`, 8 workers; tests/cli needs pexpect, absent there), the
#         attention kernels over a few launch configurations (kv_attention_sweep.py), the quantized
#         decode again with HOTLOOP_KV_SPLIT_EO=0 (the joined path) for comparison
# lane 1: the KV-bound offline run with int8 KV (issue 6; fp16 took 341.6 s on 2026-11-30), then
#         batch-1 decode with fp16 and int8 KV, twice
# Expects the wheels of `.whl` installed on PYTHONPATH (see ../shared/GPU.md). Prints each lane's
# summary; the logs and JSON stay under OUT_DIR.
set -u
out=${1:?OUT_DIR}
what=${2:-checks}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -n 8 tests --ignore=tests/cli -q -rfE -p no:cacheprovider \
    >"$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"
  tail -15 "$out/gpu_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  timeout 200 python3 "$here/kv_attention_sweep.py" --out "$out/sweep.json" \
    --prefill-configs "64,64,4,2;128,64,8,2;128,32,8,2;128,64,4,2;64,32,4,2;64,64,4,3" \
    --decode-configs "32,4,2;64,4,2;128,4,2;64,4,3;128,4,1" \
    >"$out/sweep.log" 2>&1
  echo "attention sweep rc=$?"
  grep "relative error" "$out/sweep.log"
  sed -n '/best per case/,$p' "$out/sweep.log"
  # the joined-codes path (the fifth session's default) beside it, for comparison
  HOTLOOP_KV_SPLIT_EO=0 timeout 120 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_joined.json" \
    --policies 8,4 --no-prefill --decode-configs "64,4,2;128,4,2" >"$out/sweep_joined.log" 2>&1
  echo "attention sweep, joined codes (HOTLOOP_KV_SPLIT_EO=0) rc=$?"
  sed -n '/best per case/,$p' "$out/sweep_joined.log"
}
g1=$((ngpu > 1 ? 1 : 0))  # the second lane's GPU
lane1() {
  export CUDA_VISIBLE_DEVICES=$g1
  bash "$here/run_capacity.sh" kv_int8 "$out/cap" 430
  # batch 1 after the KV-bound run, when lane 0's test compiles no longer load the host
  bash "$here/run_capacity.sh" bs1 "$out/cap" 80
  bash "$here/run_capacity.sh" bs1 "$out/cap2" 80
}
serve() {  # gpu tag extra-flags...
  local gpu=$1 tag=$2
  shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout 420 python3 "$here/run_serve.py" --out "$out/serve_$tag" \
    --port $((23500 + gpu)) -- "$@" >"$out/serve_$tag.log" 2>&1
  echo "[serve_$tag] rc=$?"
  grep -E "Median TTFT|P99 TTFT|Median TPOT|P99 TPOT|Output token throughput|Failed" "$out/serve_$tag.log"
}
table() {
  CUDA_VISIBLE_DEVICES=0 timeout 560 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf \
    --only llama3_offline,llama3_offline_b512,llama3_b256_1k,llama3_awq_bs1,llama3_awq_bs1_host_emb
}
kv_lane() {  # the KV-bound int8 run, then batch 1 with fp16 and int8 KV
  export CUDA_VISIBLE_DEVICES=$g1
  bash "$here/run_capacity.sh" kv_int8 "$out/cap" 450
  bash "$here/run_capacity.sh" bs1 "$out/cap" 80
}
one_row_tests() {  # the one-row decode path: its GPU tests, then the GEMV against cuBLAS per shape
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_dense_gemv.py \
    tests/models/test_one_row.py tests/api/test_gpu_parity.py >"$out/one_row_tests.log" 2>&1
  echo "one-row GPU tests rc=$?"
  tail -15 "$out/one_row_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  timeout 330 python3 "$here/dense_gemv.py" "$out/dense_gemv.json" 2>&1
}
one_row_bs1() {  # batch 1, Llama-3-8B and SmolLM2-135M shapes: the one-row path, without PDL, off
  export CUDA_VISIBLE_DEVICES=$g1
  local m v
  for m in llama3-8b smollm2-135m; do
    for v in "gemv1 1 1" "gemv1_nopdl 1 0" "gemv0 0 1"; do
      set -- $v
      HOTLOOP_DENSE_GEMV=$2 HOTLOOP_PDL=$3 timeout 150 python3 -m hotloop.bench.offline latency \
        --model "$m" --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 128 \
        --output-len 512 --num-iters 3 --session-len 2048 --max-batch-size 8 \
        --output-json "$out/bs1_${m}_$1.json" >"$out/bs1_${m}_$1.log" 2>&1
      echo "[bs1 $m $1] rc=$? $(grep -o '"decode_tokens_per_s": [0-9.]*' "$out/bs1_${m}_$1.json" 2>/dev/null)"
    done
  done
  timeout 120 python3 "$here/profile_step.py" --out "$out/profile_bs1.json" --cases "1@128" \
    >"$out/profile_bs1.log" 2>&1
  echo "profile decode 1@128 rc=$?"
}
one_row_rows() {  # the one-row path's GPU tests, then the batch-1 rows of run_gpu.py
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_dense_gemv.py \
    tests/models/test_one_row.py tests/api/test_gpu_parity.py >"$out/one_row_tests.log" 2>&1
  echo "one-row GPU tests rc=$?"
  tail -15 "$out/one_row_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  timeout 300 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_bs1,smollm2_bs1 2>&1 | tail -14
}
one_row_kv() {  # batch 1 with fp16 and int8 KV (issue 6), twice, then the 8B row without the path
  export CUDA_VISIBLE_DEVICES=$g1
  bash "$here/run_capacity.sh" bs1 "$out/cap" 80
  bash "$here/run_capacity.sh" bs1 "$out/cap2" 80
  HOTLOOP_DENSE_GEMV=0 bash "$here/run_capacity.sh" bs1 "$out/cap_nogemv" 80
}
pdl_tests() {  # every GPU test with PDL in the decode step's kernels, then batch 1 with fp16 / int8 KV
  export CUDA_VISIBLE_DEVICES=0
  timeout 250 python3 -m pytest -m gpu -n 8 tests --ignore=tests/cli -q -rfE -p no:cacheprovider \
    >"$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"
  tail -15 "$out/gpu_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  bash "$here/run_capacity.sh" bs1 "$out/cap" 80
}
pdl_ab() {  # batch 1 (8B, SmolLM2) and the batch-256 step, PDL on then off
  export CUDA_VISIBLE_DEVICES=$g1
  local m p
  for m in llama3-8b smollm2-135m; do
    for p in 1 0; do
      HOTLOOP_PDL=$p timeout 150 python3 -m hotloop.bench.offline latency --model "$m" --load-format dummy \
        --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 512 --num-iters 3 --session-len 2048 \
        --max-batch-size 8 --output-json "$out/bs1_${m}_pdl$p.json" >"$out/bs1_${m}_pdl$p.log" 2>&1
      echo "[bs1 $m HOTLOOP_PDL=$p] rc=$? $(grep -o '"decode_tokens_per_s": [0-9.]*' "$out/bs1_${m}_pdl$p.json")"
    done
  done
  for p in 1 0; do
    HOTLOOP_PDL=$p timeout 150 python3 -m hotloop.bench.offline latency --model llama3-8b --load-format dummy \
      --dtype bfloat16 --batch-size 256 --input-len 1024 --output-len 32 --num-iters 1 --session-len 2048 \
      --max-batch-size 256 --max-prefill-token-num 16384 --output-json "$out/b256_pdl$p.json" >"$out/b256_pdl$p.log" 2>&1
    echo "[b256 HOTLOOP_PDL=$p] rc=$? $(grep -o '"decode_ms_p50": [0-9.]*' "$out/b256_pdl$p.json")"
  done
}
fusion_tests() {  # the kernel and one-row tests, then every GPU test
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m pytest -m gpu -n 8 tests --ignore=tests/cli -q -rfE -p no:cacheprovider \
    >"$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"
  tail -15 "$out/gpu_tests.log" | grep -E "passed|failed|FAILED|ERROR"
}
fusion_ab() {  # batch 1 (8B, SmolLM2): default, + rope in the qkv GEMV, + fused merge, + both
  export CUDA_VISIBLE_DEVICES=$g1
  local m v
  for m in llama3-8b smollm2-135m; do
    for v in "base 0 0" "rope 1 0" "merge 0 1" "both 1 1"; do
      set -- $v
      HOTLOOP_ONE_ROW_ROPE=$2 HOTLOOP_DECODE_FUSED_MERGE=$3 bs1 "${m}_$1" "$m"
    done
  done
  local p  # W4A16 batch 1 with PDL in its GEMVs, then without
  for p in 1 0; do
    HOTLOOP_PDL=$p bs1 "awq_pdl$p" llama3-8b --model-format awq
  done
}
head_tests() {  # the dense_gemv tests, the rope / LM-head launch grids, then batch 1 A/B
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_dense_gemv.py \
    tests/models/test_one_row.py >"$out/one_row_tests.log" 2>&1
  echo "dense_gemv + one-row GPU tests rc=$?"
  tail -15 "$out/one_row_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  timeout 200 python3 "$here/dense_gemv.py" "$out/dense_gemv_rope_head.json" --sections rope,lm_head 2>&1
  local m v
  for m in llama3-8b smollm2-135m; do
    for v in "base 0 0" "rope 1 0" "head 0 1" "both 1 1"; do
      set -- $v
      HOTLOOP_ONE_ROW_ROPE=$2 HOTLOOP_ONE_ROW_LM_HEAD=$3 bs1 "${m}_$1" "$m"
    done
  done
}
serve_awq() {  # the W4A16 offline row (issue 5), then the issue-3 serving run again
  CUDA_VISIBLE_DEVICES=$g1 timeout 320 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf \
    --only llama3_awq_offline 2>&1 | tail -4
  serve "$g1" plain
}
bs1() {  # name model extra-flags... (environment switches go in front of the call)
  local name=$1 m=$2
  shift 2
  timeout 150 python3 -m hotloop.bench.offline latency --model "$m" --load-format dummy --dtype bfloat16 \
    --batch-size 1 --input-len 128 --output-len 512 --num-iters 3 --session-len 2048 --max-batch-size 8 \
    --output-json "$out/bs1_$name.json" "$@" >"$out/bs1_$name.log" 2>&1
  echo "[bs1 $name] rc=$? $(grep -o '"decode_ms_p50": [0-9.]*\|"decode_tokens_per_s": [0-9.]*' "$out/bs1_$name.json" 2>/dev/null | tr '\n' ' ')"
}
argmax_tests() {  # the new kernels' GPU tests and parity, then batch 1 with the greedy argmax on / off
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_dense_gemv.py \
    tests/kernels/test_greedy_argmax.py tests/models/test_one_row.py tests/api/test_gpu_parity.py \
    >"$out/argmax_tests.log" 2>&1
  echo "GPU tests rc=$?"
  tail -15 "$out/argmax_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  bs1 llama3-8b llama3-8b
  HOTLOOP_GREEDY_ARGMAX=0 bs1 llama3-8b_torch_argmax llama3-8b
  bs1 llama3-8b_again llama3-8b
  bs1 smollm2-135m smollm2-135m
  HOTLOOP_GREEDY_ARGMAX=0 bs1 smollm2-135m_torch_argmax smollm2-135m
  timeout 100 python3 "$here/profile_step.py" --out "$out/profile_bs1.json" --cases "1@128" \
    >"$out/profile_bs1.log" 2>&1
  echo "profile decode 1@128 rc=$?"
  grep -A12 "decode 1@128" "$out/profile_bs1.log"
}
argmax_kv() {  # batch 1 with fp16 and int8 KV (issue 6), then W4A16 batch 1 (issue 5)
  export CUDA_VISIBLE_DEVICES=$g1
  bash "$here/run_capacity.sh" bs1 "$out/cap" 80
  bash "$here/run_capacity.sh" bs1 "$out/cap2" 80
  bs1 awq llama3-8b --model-format awq
  for f in "$out"/cap*/bs1_q*.json; do echo "$f $(grep -o '"decode_tokens_per_s": [0-9.]*' "$f")"; done
}
late_8b() {  # the rope GEMV's late launch trigger: dense_gemv GPU tests, then 8B batch 1 rope on / off
  export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 -m pytest -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_dense_gemv.py \
    tests/models/test_one_row.py >"$out/late_tests.log" 2>&1
  echo "GPU tests rc=$?"
  tail -15 "$out/late_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  local i
  for i in 1 2; do
    HOTLOOP_ONE_ROW_ROPE=1 bs1 "llama3-8b_rope_$i" llama3-8b
    HOTLOOP_ONE_ROW_ROPE=0 bs1 "llama3-8b_norope_$i" llama3-8b
  done
}
late_small() {  # SmolLM2 batch 1 rope on / off, then serving alone on its GPU
  export CUDA_VISIBLE_DEVICES=$g1
  local i
  for i in 1 2; do
    HOTLOOP_ONE_ROW_ROPE=1 bs1 "smollm2-135m_rope_$i" smollm2-135m
    HOTLOOP_ONE_ROW_ROPE=0 bs1 "smollm2-135m_norope_$i" smollm2-135m
  done
  serve "$g1" plain
}
final_bs1() {  # batch 1 with every default: Llama-3-8B twice, SmolLM2-135M
  export CUDA_VISIBLE_DEVICES=0
  bs1 llama3-8b_1 llama3-8b
  bs1 llama3-8b_2 llama3-8b
  bs1 smollm2-135m smollm2-135m
}
final_kv() {  # batch 1 with fp16 and int8 KV (issue 6), then W4A16 (issue 5)
  export CUDA_VISIBLE_DEVICES=$g1
  bash "$here/run_capacity.sh" bs1 "$out/cap" 80 >/dev/null 2>&1
  for f in "$out"/cap/bs1_q*.json; do echo "$f $(grep -o '"decode_tokens_per_s": [0-9.]*' "$f")"; done
  bs1 awq llama3-8b --model-format awq
}
qrope_tests() {  # the rope GEMV into int8 / int4 caches: kernel and one-row GPU tests
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -n 6 -q -rfE -p no:cacheprovider tests/kernels/test_dense_gemv.py \
    tests/models/test_one_row.py -k "quantized or rope or lm_head" >"$out/qrope_tests.log" 2>&1
  echo "GPU tests rc=$?"
  tail -15 "$out/qrope_tests.log" | grep -E "passed|failed|FAILED|ERROR"
}
qrope_kv() {  # batch 1 with fp16 and int8 KV (issue 6)
  export CUDA_VISIBLE_DEVICES=$g1
  bash "$here/run_capacity.sh" bs1 "$out/cap" 80 >/dev/null 2>&1
  for f in "$out"/cap/bs1_q*.json; do echo "$f $(grep -o '"decode_tokens_per_s": [0-9.]*' "$f")"; done
}
qrope_ab_lane() {  # GPU policy: batch 1 with that KV policy, the quantized rope fusion on / off, twice
  export CUDA_VISIBLE_DEVICES=$1
  local i
  for i in 1 2; do
    HOTLOOP_ONE_ROW_ROPE_QUANT=1 bs1 "q$2_on_$i" llama3-8b --quant-policy "$2"
    HOTLOOP_ONE_ROW_ROPE_QUANT=0 bs1 "q$2_off_$i" llama3-8b --quant-policy "$2"
  done
}
qrope_ab8() { qrope_ab_lane 0 8; }
qrope_ab4() { qrope_ab_lane "$g1" 4; }
next_tests() {  # every GPU test, then the int8 A/B of the quantized rope fusion
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m pytest -m gpu -n 8 tests --ignore=tests/cli -q -rfE -p no:cacheprovider \
    >"$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"
  tail -15 "$out/gpu_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  qrope_ab_lane 0 8
}
next_rows() {  # batch 1 with every default (8B twice, SmolLM2), then the int4 A/B
  export CUDA_VISIBLE_DEVICES=$g1
  bs1 llama3-8b_1 llama3-8b
  bs1 llama3-8b_2 llama3-8b
  bs1 smollm2-135m smollm2-135m
  bs1 awq llama3-8b --model-format awq
  qrope_ab_lane "$g1" 4
}
splits_8b() {  # the batch-256 row (its host time), then 8B batch 1 with the decode splits capped
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_b256_1k 2>&1 | tail -6
  local s
  for s in 16 4 1 16; do HOTLOOP_DECODE_MAX_SPLITS=$s bs1 "llama3-8b_s${s}_$RANDOM" llama3-8b; done
}
splits_small() {  # SmolLM2 batch 1 with the decode splits capped, and the fused merge at 4 splits
  export CUDA_VISIBLE_DEVICES=$g1
  local s
  for s in 16 8 4 2 1 16; do HOTLOOP_DECODE_MAX_SPLITS=$s bs1 "smollm2_s${s}_$RANDOM" smollm2-135m; done
  HOTLOOP_DECODE_MAX_SPLITS=4 HOTLOOP_DECODE_FUSED_MERGE=1 bs1 smollm2_s4_fused smollm2-135m
}
hostprof() {  # MODEL TAG: where a batch-256 decode step's host time goes (host_profile.py)
  timeout 200 python3 "$here/host_profile.py" --model "$1" --load-format dummy --dtype bfloat16 \
    --batch-size 256 --input-len 1024 --output-len 96 --steps 40 --session-len 2048 --max-batch-size 256 \
    --max-prefill-token-num 16384 --out "$out/hostprof_$2.txt" >"$out/hostprof_$2.log" 2>&1
  echo "[hostprof $2] rc=$? $(head -9 "$out/hostprof_$2.txt" 2>/dev/null | tr -d '\n ')"
}
hostprof_8b() {
  export CUDA_VISIBLE_DEVICES=0
  hostprof llama3-8b 8b
}
hostprof_cpu() {  # the same host code without a GPU (host_step.py), then SmolLM2's batch-256 profile
  export CUDA_VISIBLE_DEVICES=$g1
  local r
  for r in host-only gpu; do
    CUDA_VISIBLE_DEVICES= timeout 120 python3 "$here/host_step.py" --batch 256 --steps 200 --runner $r \
      --tokenizer smollm2-135m \
      >"$out/host_step_$r.log" 2>&1
    echo "[host_step $r] rc=$? $(grep -o '"host_ms_per_step_p50": [0-9.]*' "$out/host_step_$r.log")"
  done
  hostprof smollm2-135m smollm2
}
gc_rows() {  # after the GC settings: the batch-256 row, its host profile, then the offline row
  export CUDA_VISIBLE_DEVICES=0
  timeout 500 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_b256_1k,llama3_offline \
    2>&1 | tail -12
  hostprof llama3-8b 8b
}
gc_serve() {  # the issue-3 serving run, then batch 1 with fp16 / int8 KV alternating on one GPU
  serve "$g1" plain
  export CUDA_VISIBLE_DEVICES=$g1
  local i
  for i in 1 2; do
    bs1 "kv16_$i" llama3-8b
    bs1 "kv8_$i" llama3-8b --quant-policy 8
  done
}
dq_tests() {  # the W4A16 GPU tests, then the GEMM table (dequant column) against bf16
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_w4a16_gemm.py \
    tests/kernels/test_w4a16_dequant.py >"$out/dq_tests.log" 2>&1
  echo "W4A16 GPU tests rc=$?"
  tail -15 "$out/dq_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  timeout 280 python3 "$here/awq_gemm.py" "$out/awq_gemm.json" >"$out/awq_gemm.log" 2>&1
  echo "awq_gemm rc=$?"
  grep -E "^(shape|qkv|o |gate|down)" "$out/awq_gemm.log" | head -30
}
dq_rows() {  # the W4A16 offline row, then W4A16 batch 1
  export CUDA_VISIBLE_DEVICES=$g1
  timeout 330 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_awq_offline 2>&1 | tail -12
  bs1 awq llama3-8b --model-format awq
}
serve_plain() { serve 0 plain; }
serve_plain_g1() { serve "$g1" plain; }
serve_jit() { serve "$g1" jit --jit-schedule; }
lanes() {  # FN0 FN1: side by side on two GPUs, one after the other on one
  if [ "$ngpu" -gt 1 ]; then
    "$1" >"$out/lane0.txt" 2>&1 &
    "$2" >"$out/lane1.txt" 2>&1 &
    wait
  else
    "$1" >"$out/lane0.txt" 2>&1
    "$2" >"$out/lane1.txt" 2>&1
  fi
}
case $what in
  table)
    lanes table serve_plain_g1
    tail -12 "$out/lane0.txt"
    cat "$out/lane1.txt"
    ;;
  table_kv)
    lanes table kv_lane
    tail -12 "$out/lane0.txt"
    cat "$out/lane1.txt"
    ;;
  one_row_table)
    lanes one_row_rows one_row_kv
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  next)
    lanes next_tests next_rows
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  dequant)
    lanes dq_tests dq_rows
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  gc)
    lanes gc_rows gc_serve
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  hostprof)
    lanes hostprof_8b hostprof_cpu
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  splits)
    lanes splits_8b splits_small
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  qrope_ab)
    lanes qrope_ab8 qrope_ab4
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  qrope)
    lanes qrope_tests qrope_kv
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  final)
    lanes final_bs1 final_kv
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  late)
    lanes late_8b late_small
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  argmax)
    lanes argmax_tests argmax_kv
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  head)
    lanes head_tests serve_awq
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  fusions)
    lanes fusion_tests fusion_ab
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  pdl)
    lanes pdl_tests pdl_ab
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  one_row)
    lanes one_row_tests one_row_bs1
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  serve)
    lanes serve_plain serve_jit
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
  *)
    lanes lane0 lane1
    cat "$out/lane0.txt" "$out/lane1.txt"
    ;;
esac
