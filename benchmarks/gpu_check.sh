#!/usr/bin/env bash
# One device call that re-checks the open GPU items, one lane per GPU of an `nvidia-h200-x2` machine
# (on one GPU the lanes run one after the other). Each lane's output goes to OUT_DIR/lane0.txt and
# lane1.txt (printed at the end); the logs and JSON stay under OUT_DIR.
#
#   bash benchmarks/gpu_check.sh OUT_DIR [MODE]
#   REQUIRE_H200=1 bash benchmarks/gpu_check.sh OUT_DIR [MODE]   # exit 3 at once unless the card is an H200
#
# Wheels: ../shared/tools/device-wheels.sh fills .whl with the server's packages; the JSON-mode GPU test
# also needs `bash ../shared/tools/device-wheels.sh xgrammar` (keep xgrammar and apache_tvm_ffi, drop
# the torch / triton / nvidia wheels it pulls in: the device has them). The VL GPU tests read their photo
# from PyPI llama-models (`pip download --no-deps llama-models -d .whl`, 6.6 MB); without it they skip.
#
#   tests    (default) GPU 0: every GPU test (`pytest -m gpu`, 8 workers; tests/cli needs pexpect).
#            GPU 1: batch 1 with every default (Llama-3-8B twice, SmolLM2-135M, W4A16 8B), then fp16 /
#            int8 KV alternating, twice (issue 6).
#   rows     GPU 0: run_gpu.py's batch-256 and offline rows, then host_profile.py at batch 256
#            (issue 4). GPU 1: the issue-3 serving run, then the W4A16 offline row (issue 5).
#   w4a16    GPU 0: the W4A16 GPU tests, then awq_gemm.py (every launch against bf16 per M).
#            GPU 1: the W4A16 offline row, then W4A16 batch 1.
#   kv       GPU 0: every GPU test, then the attention launch sweep (kv_attention_sweep.py).
#            GPU 1: the KV-bound int8 offline run (run_capacity.sh), then batch 1 fp16 / int8 KV.
#   serve    the issue-3 serving run, plain on GPU 0 and with --jit-schedule on GPU 1.
#   chunks   the issue-3 serving run by prefill chunk (--max-prefill-token-num 8192 / 512 / 256), the
#            serving-mix steps of profile_step.py (decode 16, mixed 16 + 256 / 512 / 1024), then the
#            engine's GPU tests.
#   (s33a-s35e, s36a: the thirty-third to thirty-sixth sessions' one-off A/B calls, removed; each ran at the
#            commit its results README under benchmarks/results/ names; swap, the forty-second session's
#            transposed MLP products, is at 387bb4d)
#   open     one GPU: the other open rows with today's defaults: issue 3's serving run, plain and with
#            HOTLOOP_DENSE_TUNE=1, then W4A16 batch 1 twice (issue 5).
#   buckets  one GPU: the attention GPU tests; the prefill kernel's tiles at 128-1,024 tokens
#            (kv_attention_sweep.py); the 8B GEMMs at M = 1,008-1,152 (dense_gemm.py: the serving mix's
#            1,024 + 16 rows and the prefill buckets around them); profile_step.py's 1,024 + 16 mixed step.
#            (At 8d0d537 it also ran the mixed step and issue 3's serving run with 8 and 32 buckets per
#            octave, an environment switch since removed: results/gpu_2026-12-06j.)
#   exact    one GPU: the executor / parity GPU tests; profile_step.py's serving-mix steps with
#            HOTLOOP_PIECEWISE_EAGER_FROM=off (padded graphs, the default) and auto (large steps eagerly
#            over their exact rows); issue 3's serving run with off and 1024, while TABLE4_BUDGET_S
#            seconds into the script leave 120 s. EXACT_SHORT=1: only the exact steps' GPU tests.
#   exact2   one GPU: profile_step.py's 1,024 and 2 x 1,024 mixed steps with the switch off, at 1024 and auto; then
#            issue 3's serving run alternating off / auto / off / auto until TABLE4_BUDGET_S.
#   steps    one GPU: step_kernels.py on issue 4's batch-256 bench steps (rounds of 8 and one step a launch: kernel
#            time by name, GPU busy and idle per step), profile_step.py's graph step at exactly 1k, then issue 3's
#            serving run alternating auto (the default) / off until TABLE4_BUDGET_S.
#   probe    one GPU: overlap_probe.py (a prompt's prefill on one stream, batch-16 decode replays on another), then
#            issue 3's serving run with auto and off while TABLE4_BUDGET_S allows.
#   h200     one GPU: issue 4's batch-256 row, step_kernels.py on its steps, then issue 3's serving run alternating
#            auto / off until TABLE4_BUDGET_S (meant for REQUIRE_H200=1). (Until the forty-seventh session it also ran
#            cutlass_probe.py where the probe's .so was carried; the probe's three rounds lost.)
#   cutlass  one GPU: cutlass_probe.py (the CUTLASS configurations of benchmarks/cuda/cutlass_gemm_probe.cu against
#            cuBLAS at M = 256 and 1,040; CUTLASS_M overrides), with build/cutlass_probe/libcutlass_probe.so carried.
#   (w4cutlass: the forty-ninth session's mixed-input W4A16 probe, w4a16_cutlass_probe.py; at d4a0eb1, replaced by
#            w4engine's W4_ENGINE_TABLE_M, which times the engine's own configurations.)
#   w4engine one GPU: the CUTLASS W4A16 GEMM's GPU tests (tests/kernels/test_w4a16_cutlass.py), then run_gpu.py's
#            W4A16 rows (W4_ENGINE_ROWS, default llama3_awq_offline) with HOTLOOP_W4A16_KERNEL=cutlass and =triton
#            (W4_ENGINE_KERNELS; cutlass_fused adds HOTLOOP_W4C_GEMV_PDL=1 HOTLOOP_W4C_FUSED_SILU=1) while
#            TABLE4_BUDGET_S allows. Carry build/hl_cache, where the library is built here by
#            HOTLOOP_CACHE=build/hl_cache python3 -c "from hotloop.kernels import w4a16_cutlass as w; w.build()"
#            (and .whl/nvidia_cutlass-*.whl: the headers' version is part of the library's key). bf16 in
#            W4_ENGINE_KERNELS runs the rows' bf16 baseline (llama3_awq_offline -> llama3_offline);
#            W4_ENGINE_TABLE_M=1,256,... then runs w4a16_cutlass_table.py (every configuration against bf16).
#   w4steps  one GPU: step_kernels.py on a batch-256 (W4_STEPS_BATCH) x 1k decode step with W4A16 weights
#            (HOTLOOP_W4A16_KERNEL=cutlass, build/hl_cache carried) and bf16 (W4_STEPS_KINDS), top 40 kernels each:
#            where the W4A16 step spends what its GEMMs save.
#   settle   every GPU test, then the serving run with --jit-schedule and plain (one GPU, in turn).
#   all      every GPU test, tests/cli included (one GPU, 8 workers).
#   ncu      Nsight Compute on one launch of each W4A16 one-row kernel and read probe (benchmarks/ncu_w4a16.py).
#   tma      one GPU: decode_tma_probe.py (batch 256 x 1k: a plain read, the engine's decode kernel, one page a
#            tile, TMA tiles). (At e93fc00 it also ran the TMA kernel's GPU tests and issue 4's batch-256 row
#            with HOTLOOP_DECODE_TMA=0 / 1, an engine switch since removed: results/gpu_2026-12-07b.)
#   (overlap, overlap2: two micro-batches on two streams, bf16 at batch 256 / 128 (forty-fourth session, at
#            92356a0, results/gpu_2026-12-07c) and W4A16 at 384 / 256 (forty-fifth, at 47d530f,
#            results/gpu_2026-12-07d); removed after they lost. awqoff, the offline rows with the switch, was
#            written at 47d530f and never run.)
#   b256     one GPU: issue 4's batch-256 row with the defaults, HOTLOOP_DENSE_TUNE=1, HOTLOOP_DECODE_GRID=seq and the
#            defaults again, until TABLE4_BUDGET_S seconds into the script.
#   table4   one GPU: issue 4's rows of the table (batch 1 with and without 8 steps a launch, SmolLM2, batch 256,
#            offline) and their transformers baselines, in one run_gpu.py run of about 8 minutes; then, until
#            TABLE4_BUDGET_S (default 560) seconds into the script, the batch-256 row with HOTLOOP_DENSE_TUNE=1
#            and with HOTLOOP_DECODE_GRID=seq.
#   table    the whole issue-4 table (`run_gpu.py --gpus 2`, transformers baseline included), less the
#            256-sequence offline, host-embedding and multi-step offline rows (measured in other calls).
#   verify   the engine's GPU tests (multi-step decode's included), then the 8B batch-256 host profile
#            with 8 and 1 steps per launch, one after the other on one GPU.
#   hostprof GPU 0: host_profile.py, 8B at batch 256. GPU 1: host_step.py (CPU only), then SmolLM2's
#            batch-256 host profile.
#   multistep GPU 0: the GPU tests that run the engine (multi-step decode's included), then the 8B
#            batch-256 host profile with 1 and 8 decode steps per launch. GPU 1: batch 1 (SmolLM2, 8B)
#            and SmolLM2 at batch 256, each with 1 and 8 steps per launch.
#
# One-off A/B modes of earlier sessions (kv*, s23*-s32*, fresh*, cuda*, ncusass, merge, plan, ...) are in
# this file's history (all of them up to d7e985e): each results README under benchmarks/results/ names
# the commit its calls ran at.
# Batch-1 rows are `hotloop bench latency --load-format dummy --dtype bfloat16 --batch-size 1
# --input-len 128 --output-len 512 --num-iters 3` (the `bs1` helper); environment switches (see
# hotloop/kernels/ops.py) go in front of a call. Expects the wheels of `.whl` on PYTHONPATH (see
# ../shared/GPU.md); add `pip download --no-deps llama-models==0.3.0 -d .whl` (its test image), or the
# 20 VL parity GPU tests skip.
set -u
out=${1:?OUT_DIR}
what=${2:-tests}
TABLE4_BUDGET_S=${TABLE4_BUDGET_S:-560}
case $TABLE4_BUDGET_S in
  '' | *[!0-9]*)
    echo "TABLE4_BUDGET_S=$TABLE4_BUDGET_S: want whole seconds (default 560)" >&2
    exit 2
    ;;
esac
# REQUIRE_H200=1: stop at once (exit 3) on any other card. A call for `nvidia-h200` may be served by an
# H100, and the issues' targets are H200 figures: this spends only the machine's start on the wrong card.
case ${REQUIRE_H200:-0} in
  0 | 1) ;;
  *)
    echo "REQUIRE_H200=$REQUIRE_H200: want 0 or 1" >&2
    exit 2
    ;;
esac
if [ "${REQUIRE_H200:-0}" = 1 ]; then
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case $card in
    *H200*) ;;
    *)
      echo "REQUIRE_H200=1: this card is '${card:-none found}'; nothing run"
      exit 3
      ;;
  esac
fi
mkdir -p "$out"
# The device tool brings back at most 8 files, two folders deep: past that, pack OUT_DIR into one
# OUT_DIR.tar.gz on exit (unpack it with `tar -xzf`), so that no log is left behind.
pack_out() {
  local n
  n=$(find "$out" -type f | wc -l)
  if [ "$n" -gt 7 ]; then
    tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" && rm -rf "$out"
  fi
}
trap pack_out EXIT
here=$(cd "$(dirname "$0")" && pwd)
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
g1=$((ngpu > 1 ? 1 : 0))  # the second lane's GPU

bs1() {  # name model extra-flags...
  local name=$1 m=$2
  shift 2
  timeout 150 python3 -m hotloop.bench.offline latency --model "$m" --load-format dummy --dtype bfloat16 \
    --batch-size 1 --input-len 128 --output-len 512 --num-iters 3 --session-len 2048 --max-batch-size 8 \
    --output-json "$out/bs1_$name.json" "$@" >"$out/bs1_$name.log" 2>&1
  echo "[bs1 $name] rc=$? $(grep -o '"decode_ms_p50": [0-9.]*\|"decode_tokens_per_s": [0-9.]*' "$out/bs1_$name.json" 2>/dev/null | tr '\n' ' ')"
}
b256_rows() {  # setting...: issue 4's batch-256 row once per environment setting (NAME=VALUE), in turn,
  # while TABLE4_BUDGET_S seconds into the script leave time for one
  local v left i=0
  for v in "$@"; do
    i=$((i + 1))
    left=$((TABLE4_BUDGET_S - SECONDS))
    [ "$left" -gt 50 ] || break
    env "$v" timeout "$left" python3 "$here/run_gpu.py" --out "$out/b256_${i}_${v%%=*}" --skip-hf \
      --only llama3_b256_1k 2>&1 | grep -E "ceilings|b256|4,229|llama3_b256_1k\]" | sed "s/^/[$v] /"
  done
}
gpu_tests() {  # [tag [seconds [pytest paths and options...]]]: the GPU tests, every one by default
  local tag=${1:-gpu_tests} secs=${2:-450}
  shift 2 2>/dev/null || shift $#
  [ $# -eq 0 ] && set -- tests --ignore=tests/cli
  python3 -c "import xgrammar" 2>/dev/null ||
    echo "warning: no xgrammar here, so the JSON-mode GPU test fails (carry it: see this script's header)"
  python3 -c "import llama_models" 2>/dev/null ||
    echo "warning: no llama-models here, so the VL GPU tests skip (carry it: see this script's header)"
  # -v: one line per test, so a run cut by the timeout still says which tests failed
  timeout "$secs" python3 -m pytest -m gpu -n 8 "$@" -v --tb=short -rfE -p no:cacheprovider \
    --durations=10 >"$out/$tag.log" 2>&1
  echo "$tag rc=$? ($(grep -c " PASSED " "$out/$tag.log") passed)"
  grep -E " (FAILED|ERROR) " "$out/$tag.log" | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | sort -u | head -40
  tail -3 "$out/$tag.log" | grep -E "passed|failed"
}
serve() {  # gpu tag extra-flags...
  local gpu=$1 tag=$2
  shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout 420 python3 "$here/run_serve.py" --out "$out/serve_$tag" \
    --port $((23500 + gpu)) -- "$@" >"$out/serve_$tag.log" 2>&1
  echo "[serve_$tag] rc=$?"
  grep -E "Median TTFT|P99 TTFT|Median TPOT|P99 TPOT|Output token throughput|Failed|kernel_compile" "$out/serve_$tag.log"
}
serve_eager_ab() {  # setting...: issue 3's serving run once per HOTLOOP_PIECEWISE_EAGER_FROM setting, in turn,
  # while TABLE4_BUDGET_S seconds into the script leave 90 s for one (GPU 0)
  local v i=0
  for v in "$@"; do
    [ $((TABLE4_BUDGET_S - SECONDS)) -gt 90 ] || break
    i=$((i + 1))
    HOTLOOP_PIECEWISE_EAGER_FROM=$v serve 0 "eager_${v}_$i"
  done
}
step_kernels() {  # full-batch-steps: step_kernels.py on issue 4's batch-256 bench steps (GPU 0)
  timeout 170 python3 "$here/step_kernels.py" --model llama3-8b --load-format dummy --dtype bfloat16 \
    --batch-size 256 --input-len 1024 --output-len 160 --session-len 2048 --max-batch-size 256 \
    --max-prefill-token-num 16384 --full-batch-steps "$1" --out "$out/step_kernels_k$1.json" \
    >"$out/step_kernels_k$1.log" 2>&1
  echo "[step_kernels k$1] rc=$?"
  grep -vE "Warning|warn" "$out/step_kernels_k$1.log" | tail -30
}
hostprof() {  # model tag extra-flags...: where a batch-256 decode step's host time goes
  local m=$1 tag=$2
  shift 2
  timeout 200 python3 "$here/host_profile.py" --model "$m" --load-format dummy --dtype bfloat16 \
    --batch-size 256 --input-len 1024 --output-len 136 --steps 40 --session-len 2048 --max-batch-size 256 \
    --max-prefill-token-num 16384 --out "$out/hostprof_$tag.txt" "$@" >"$out/hostprof_$tag.log" 2>&1
  echo "[hostprof $tag] rc=$? $(head -9 "$out/hostprof_$tag.txt" 2>/dev/null | tr -d '\n ')"
}

tests_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests
}
tests_lane1() {
  export CUDA_VISIBLE_DEVICES=$g1
  bs1 llama3-8b_1 llama3-8b
  bs1 llama3-8b_2 llama3-8b
  bs1 smollm2-135m smollm2-135m
  bs1 awq llama3-8b --model-format awq
  local i
  for i in 1 2; do
    bs1 "kv16_$i" llama3-8b
    bs1 "kv8_$i" llama3-8b --quant-policy 8
  done
}
rows_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 500 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_b256_1k,llama3_offline \
    2>&1 | tail -12
  hostprof llama3-8b 8b
}
rows_lane1() {
  serve "$g1" plain
  export CUDA_VISIBLE_DEVICES=$g1
  timeout 330 python3 "$here/run_gpu.py" --out "$out/table_awq" --skip-hf --only llama3_awq_offline 2>&1 | tail -12
}
w4a16_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_w4a16_gemm.py \
    tests/kernels/test_w4a16_dequant.py >"$out/w4a16_tests.log" 2>&1
  echo "W4A16 GPU tests rc=$?"
  tail -15 "$out/w4a16_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  timeout 280 python3 "$here/awq_gemm.py" "$out/awq_gemm.json" >"$out/awq_gemm.log" 2>&1
  echo "awq_gemm rc=$?"
  grep -E "^(shape|qkv|o_|gate|down)" "$out/awq_gemm.log" | head -30
}
w4a16_lane1() {
  export CUDA_VISIBLE_DEVICES=$g1
  timeout 330 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_awq_offline 2>&1 | tail -12
  bs1 awq llama3-8b --model-format awq
}
kv_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests
  timeout 200 python3 "$here/kv_attention_sweep.py" --out "$out/sweep.json" \
    --prefill-configs "64,64,4,2;128,64,8,2;128,32,8,2;128,64,4,2;64,32,4,2;64,64,4,3" \
    --decode-configs "32,4,2;64,4,2;128,4,2;64,4,3;128,4,1" >"$out/sweep.log" 2>&1
  echo "attention sweep rc=$?"
  grep "relative error" "$out/sweep.log"
  sed -n '/best per case/,$p' "$out/sweep.log"
}
kv_lane1() {
  export CUDA_VISIBLE_DEVICES=$g1
  bash "$here/run_capacity.sh" kv_int8 "$out/cap" 430
  bash "$here/run_capacity.sh" bs1 "$out/cap" 80
}
offline() {  # tag extra-flags...: the 8B offline row, 1000 x 1024 / 1024
  local tag=$1
  shift
  timeout 250 python3 -m hotloop.bench.offline throughput --model llama3-8b --load-format dummy --dtype bfloat16 \
    --num-prompts 1000 --input-len 1024 --output-len 1024 --session-len 2048 --max-prefill-token-num 16384 \
    --output-json "$out/offline_$tag.json" "$@" >"$out/offline_$tag.log" 2>&1
  echo "[offline $tag] rc=$? $(grep -o '"output_tokens_per_s": [0-9.]*\|"steps": [0-9]*\|"kv_blocks": [0-9]*' "$out/offline_$tag.json" 2>/dev/null | tr '\n' ' ')"
}
serve_lane0() { serve 0 plain; }
serve_lane1() { serve "$g1" jit --jit-schedule; }
chunks_lane0() {
  serve 0 c8192
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 "$here/profile_step.py" --out "$out/profile.json" --cases "16 decodes,decode 16@,decode 1@" \
    >"$out/profile.log" 2>&1
  echo "profile_step rc=$?"
  grep -E "floor|host launch" "$out/profile.log"
  timeout 200 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_decode_advance.py \
    tests/engine/test_multi_step.py tests/executor tests/api/test_gpu_parity.py >"$out/verify_tests.log" 2>&1
  echo "engine GPU tests rc=$?"
  tail -15 "$out/verify_tests.log" | grep -E "passed|failed|FAILED|ERROR"
}
settle_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests
}
settle_lane1() {
  serve "$g1" jit --jit-schedule
  serve "$g1" plain
}
chunks_lane1() {
  serve "$g1" c512 --max-prefill-token-num 512
  serve "$g1" c256 --max-prefill-token-num 256
}
hostprof_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  hostprof llama3-8b 8b
}
hostprof_lane1() {
  export CUDA_VISIBLE_DEVICES=$g1
  local r
  for r in host-only gpu; do
    CUDA_VISIBLE_DEVICES= timeout 120 python3 "$here/host_step.py" --batch 256 --steps 200 --runner $r \
      --tokenizer smollm2-135m >"$out/host_step_$r.log" 2>&1
    echo "[host_step $r] rc=$? $(grep -o '"host_ms_per_step_p50": [0-9.]*' "$out/host_step_$r.log")"
  done
  hostprof smollm2-135m smollm2
}
multistep_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_decode_advance.py \
    tests/engine/test_multi_step.py tests/api/test_gpu_parity.py tests/models/test_one_row.py tests/executor \
    >"$out/multistep_tests.log" 2>&1
  echo "engine GPU tests rc=$?"
  tail -15 "$out/multistep_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  hostprof llama3-8b 8b_k1
  hostprof llama3-8b 8b_k8 --num-scheduler-steps 8
}
multistep_lane1() {
  export CUDA_VISIBLE_DEVICES=$g1
  bs1 smollm2_k1 smollm2-135m
  bs1 smollm2_k8 smollm2-135m --num-scheduler-steps 8
  bs1 llama3_k1 llama3-8b
  bs1 llama3_k8 llama3-8b --num-scheduler-steps 8
  local k
  for k in 1 8; do  # SmolLM2 at batch 256: a step short enough for the host to matter
    timeout 150 python3 -m hotloop.bench.offline latency --model smollm2-135m --load-format dummy --dtype bfloat16 \
      --batch-size 256 --input-len 1024 --output-len 256 --num-iters 2 --session-len 2048 --max-batch-size 256 \
      --max-prefill-token-num 16384 --num-scheduler-steps $k --output-json "$out/b256_smollm2_k$k.json" \
      >"$out/b256_smollm2_k$k.log" 2>&1
    echo "[b256 smollm2 k$k] rc=$? $(grep -o '"decode_ms_p50": [0-9.]*\|"decode_tokens_per_s": [0-9.]*\|"host_ms_per_step_p50": [0-9.]*\|"output_tokens_per_s": [0-9.]*' "$out/b256_smollm2_k$k.json" 2>/dev/null | tr '\n' ' ')"
  done
}

if [ "$what" = verify ]; then  # the engine's GPU tests (multi-step ones included), then the host profiles
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_decode_advance.py \
    tests/engine/test_multi_step.py tests/executor tests/api/test_gpu_parity.py >"$out/verify_tests.log" 2>&1
  echo "engine GPU tests rc=$?"
  tail -15 "$out/verify_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  hostprof llama3-8b 8b_k8 --num-scheduler-steps 8
  [ "${VERIFY_K1:-1}" = 1 ] && hostprof llama3-8b 8b_k1
  exit 0
fi
if [ "$what" = all ]; then  # one GPU: every GPU test (tests/cli too: it needs pexpect from .whl)
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests all_gpu_tests 540 tests
  exit 0
fi
if [ "$what" = open ]; then  # one GPU, in turn: issues 3 and 5's open rows
  export CUDA_VISIBLE_DEVICES=0
  serve 0 default
  HOTLOOP_DENSE_TUNE=1 serve 0 dense
  for i in 1 2; do
    bs1 awq$i llama3-8b --model-format awq
  done
  exit 0
fi
if [ "$what" = exact ]; then  # one GPU: large prefill / mixed steps eagerly over their exact rows, or padded
  export CUDA_VISIBLE_DEVICES=0
  if [ "${EXACT_SHORT:-0}" = 1 ]; then  # (little device time: the exact steps' own GPU tests only)
    gpu_tests exec_tests 60 tests/executor tests/api/test_gpu_parity.py -k "exact or piecewise"
  else
    gpu_tests exec_tests 100 tests/executor tests/api/test_gpu_parity.py tests/api/test_prompt_logprobs.py
  fi
  for v in off auto; do
    HOTLOOP_PIECEWISE_EAGER_FROM=$v timeout 150 python3 "$here/profile_step.py" --out "$out/profile_$v.json" \
      --cases "16 decodes@1k + 1x1024,16 decodes@1k + 1x600,prefill 1x1040" --iters 6 \
      >"$out/profile_$v.log" 2>&1
    echo "[profile_step $v] rc=$?"
    grep -E "floor|eager pieces|host launch|  [0-9.]+ ms +[0-9]+x" "$out/profile_$v.log"
  done
  # the baseline first (a cut run keeps it); a fixed threshold, as the server logs at warning level
  for v in off 1024; do
    left=$((TABLE4_BUDGET_S - SECONDS))
    [ "$left" -gt 120 ] || break
    HOTLOOP_PIECEWISE_EAGER_FROM=$v serve 0 "eager_$v"
  done
  exit 0
fi
if [ "$what" = exact2 ]; then  # one GPU: the exact steps' second A/B (the first, mode exact, chose 1,408 under auto)
  export CUDA_VISIBLE_DEVICES=0
  for v in off 1024 auto; do
    HOTLOOP_PIECEWISE_EAGER_FROM=$v timeout 150 python3 "$here/profile_step.py" --out "$out/profile_$v.json" \
      --cases "16 decodes@1k + 1x1024,16 decodes@1k + 2x1024" --iters 6 >"$out/profile_$v.log" 2>&1
    echo "[profile_step $v] rc=$?"
    grep -E "floor|eager pieces|  [0-9.]+ ms +[0-9]+x" "$out/profile_$v.log" | head -24
  done
  # serving, alternating: off (padded graphs) and auto (the default since the forty-fifth session: only steps
  # from the threshold measured at start, which the server logs at info level only: the profile_step run
  # above logs it for the same card)
  serve_eager_ab off auto off auto  # issue 3's serving run: exact-row steps (auto) against padded graphs (off)
  exit 0
fi
if [ "$what" = steps ]; then  # one GPU: issue 4's batch-256 bench steps by kernel and gap, then issue 3's serving run
  export CUDA_VISIBLE_DEVICES=0
  step_kernels 8  # the default rounds of 8 decode steps a launch
  step_kernels 1
  timeout 120 python3 "$here/profile_step.py" --out "$out/profile_b256.json" --cases "decode 256@1k" --iters 6 \
    >"$out/profile_b256.log" 2>&1
  echo "[profile_step decode 256@1k] rc=$?"
  grep -E "floor|  [0-9.]+ ms +[0-9]+x" "$out/profile_b256.log" | head -20
  serve_eager_ab auto off auto off  # issue 3's serving run: exact-row steps (auto) against padded graphs (off)
  exit 0
fi
if [ "$what" = probe ]; then  # one GPU: overlap_probe.py (prefill and decode steps on two streams), then serving
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 "$here/overlap_probe.py" --out "$out/overlap_probe.json" >"$out/overlap_probe.log" 2>&1
  echo "[overlap_probe] rc=$?"
  grep -vE "Warning|warn|capturing|INFO" "$out/overlap_probe.log" | tail -30
  serve_eager_ab auto off  # issue 3's serving run: exact-row steps (auto) against padded graphs (off)
  exit 0
fi
if [ "$what" = h200 ]; then  # one GPU: issue 4's batch-256 row and its steps by kernel, then issue 3's serving A/B
  export CUDA_VISIBLE_DEVICES=0
  b256_rows HOTLOOP_DECODE_GRID=heads
  step_kernels 8
  serve_eager_ab auto off auto off  # issue 3's serving run: exact-row steps (auto) against padded graphs (off)
  exit 0
fi
if [ "$what" = cutlass ]; then  # one GPU: CUTLASS persistent / stream-K GEMMs against cuBLAS (cutlass_probe.py)
  # needs build/cutlass_probe/libcutlass_probe.so (benchmarks/build_cutlass_probe.sh; carry it)
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 "$here/cutlass_probe.py" --out "$out/cutlass_probe.json" --m "${CUTLASS_M:-256,1040}" \
    >"$out/cutlass_probe.log" 2>&1
  echo "[cutlass_probe] rc=$?"
  grep -v Warning "$out/cutlass_probe.log"
  exit 0
fi
if [ "$what" = w4engine ]; then  # one GPU: the CUTLASS W4A16 GEMM in the engine (HOTLOOP_W4A16_KERNEL=cutlass)
  # carry the library built on the CPU machine (build/hl_cache: see this script's header)
  export CUDA_VISIBLE_DEVICES=0
  if [ -z "${HOTLOOP_CACHE:-}" ] && [ -d "$here/../build/hl_cache" ]; then export HOTLOOP_CACHE=$here/../build/hl_cache; fi
  [ "${W4_ENGINE_TESTS:-1}" = 1 ] &&
    gpu_tests cutlass_tests 200 tests/kernels/test_w4a16_cutlass.py tests/kernels/test_w4a16_cutlass_dequant.py
  for v in ${W4_ENGINE_KERNELS:-cutlass triton}; do
    left=$((TABLE4_BUDGET_S - SECONDS))
    [ "$left" -gt 60 ] || break
    # cutlass_fused: the CUTLASS layout's one-row GEMV with its PDL early loads and the folded SiLU;
    # bf16: the same rows' bf16 baseline (llama3_awq_offline -> llama3_offline)
    rows=${W4_ENGINE_ROWS:-llama3_awq_offline}
    case $v in
      cutlass_fused) set -- HOTLOOP_W4A16_KERNEL=cutlass HOTLOOP_W4C_GEMV_PDL=1 HOTLOOP_W4C_FUSED_SILU=1 ;;
      bf16) set -- HOTLOOP_W4A16_KERNEL=triton; rows=${rows//_awq/} ;;
      *) set -- HOTLOOP_W4A16_KERNEL="$v" ;;
    esac
    env "$@" timeout "$left" python3 "$here/run_gpu.py" --out "$out/rows_$v" --skip-hf \
      --only "$rows" 2>&1 | grep -vE "Warning|warn\(" | tail -20 | sed "s/^/[$v] /"
    # an offline row's wall time split between eager (prefill-carrying) and CUDA-graph steps
    for j in "$out/rows_$v"/*offline*.json; do
      [ -f "$j" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('[$v]', sys.argv[1].rsplit('/',1)[-1], 'elapsed', round(d['elapsed_s'],2), 'tok/s', round(d['output_tokens_per_s'],1), 'wall by step kind', d.get('wall_s_by_step_kind'), 'load_s', round(d['load_s'],1))" "$j"
    done
  done
  left=$((TABLE4_BUDGET_S - SECONDS))
  if [ -n "${W4_ENGINE_TABLE_M:-}" ] && [ "$left" -gt 30 ]; then  # every configuration against bf16 per M
    timeout "$left" python3 "$here/w4a16_cutlass_table.py" --out "$out/cutlass_table.json" --m "$W4_ENGINE_TABLE_M" \
      >"$out/cutlass_table.log" 2>&1
    echo "w4a16_cutlass_table rc=$?"
    grep -E "GB/s|M=|Error|error" "$out/cutlass_table.log" | tail -40
  fi
  exit 0
fi
if [ "$what" = w4steps ]; then  # one GPU: a batch-256 decode step's kernels, W4A16 (cutlass) against bf16
  export CUDA_VISIBLE_DEVICES=0
  if [ -z "${HOTLOOP_CACHE:-}" ] && [ -d "$here/../build/hl_cache" ]; then export HOTLOOP_CACHE=$here/../build/hl_cache; fi
  for v in ${W4_STEPS_KINDS:-cutlass bf16}; do
    left=$((TABLE4_BUDGET_S - SECONDS))
    [ "$left" -gt 60 ] || break
    case $v in
      bf16) set -- ;;
      *) set -- --model-format awq ;;
    esac
    HOTLOOP_W4A16_KERNEL=${v/bf16/triton} timeout "$left" python3 "$here/step_kernels.py" --model llama3-8b --load-format dummy \
      --dtype bfloat16 --batch-size "${W4_STEPS_BATCH:-256}" --input-len 1024 --output-len 160 --session-len 2048 \
      --max-batch-size "${W4_STEPS_BATCH:-256}" --max-prefill-token-num 16384 --top 40 "$@" \
      --out "$out/w4steps_$v.json" >"$out/w4steps_$v.log" 2>&1
    echo "[w4steps $v] rc=$?"
    grep -vE "Warning|warn" "$out/w4steps_$v.log" | tail -45 | cut -c1-150
  done
  exit 0
fi
if [ "$what" = buckets ]; then  # one GPU: the serving mix's padding (1,024 + 16 tokens) by prefill buckets
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests attention_tests 120 tests/kernels/test_attention_kernels.py
  timeout 120 python3 "$here/kv_attention_sweep.py" --out "$out/prefill_short.json" --no-decode --policies 0,8 \
    --prefill-lens 128,256,512,1008,1024 --prefill-configs "64,64,4,2;64,64,8,2;128,64,8,2;64,32,4,2" \
    >"$out/prefill_short.log" 2>&1
  echo "prefill sweep rc=$?"
  grep -vE "^\s*$" "$out/prefill_short.log" | tail -40
  timeout 120 python3 "$here/dense_gemm.py" "$out/gemm_m.json" --m 1008,1024,1040,1056,1088,1152 \
    >"$out/gemm_m.log" 2>&1
  echo "dense_gemm rc=$?"
  grep -E "ceilings|M=" "$out/gemm_m.log" | grep -v lm_head
  timeout 150 python3 "$here/profile_step.py" --out "$out/profile.json" \
    --cases "16 decodes@1k + 1x1024,16 decodes@1k + 1x1008,prefill 1x1040" >"$out/profile.log" 2>&1
  echo "[profile_step] rc=$?"
  grep -E "floor" "$out/profile.log"
  exit 0
fi
if [ "$what" = ncu ]; then  # one GPU: Nsight Compute on the W4A16 one-row kernels
  export CUDA_VISIBLE_DEVICES=0
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  echo "ncu: $NCU"
  python3 "$here/ncu_w4a16.py" && echo "warm run ok"
  timeout 400 "$NCU" --clock-control none --launch-skip 6 -k 'regex:w4a16|read_' --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    python3 "$here/ncu_w4a16.py" >"$out/ncu.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Compute \(SM\) Throughput|Registers Per|Block Limit" "$out/ncu.txt" | cut -c1-160 | head -120
  exit 0
fi
if [ "$what" = b256 ]; then  # one GPU: issue 4's batch-256 row, default / timed cuBLASLt / seq grid / default
  export CUDA_VISIBLE_DEVICES=0
  b256_rows HOTLOOP_DECODE_GRID=heads HOTLOOP_DENSE_TUNE=1 HOTLOOP_DECODE_GRID=seq HOTLOOP_DECODE_GRID=heads
  exit 0
fi
if [ "$what" = tma ]; then  # one GPU: batch-256 decode attention against a plain read of its bytes (forty-third session)
  export CUDA_VISIBLE_DEVICES=0
  timeout 170 python3 "$here/decode_tma_probe.py" --out "$out/tma_probe.json" 2>&1 | grep -v Warning | tee "$out/tma_probe.log"
  exit 0
fi
if [ "$what" = table4 ]; then  # one GPU: issue 4's rows and their transformers baselines (~8 minutes)
  timeout $((TABLE4_BUDGET_S + 30)) python3 "$here/run_gpu.py" --out "$out/table" \
    --only llama3_bs1,llama3_bs1_ms8,smollm2_bs1,smollm2_bs1_ms8,llama3_b256_1k,hf_llama3_bs1,hf_smollm2_bs1,hf_llama3_b64,llama3_offline \
    >"$out/table.txt" 2>&1
  echo "run_gpu rc=$?"
  cat "$out/table.txt"
  # then the batch-256 row with the timed cuBLASLt algorithms and with the old grid order, while time is left
  b256_rows HOTLOOP_DENSE_TUNE=1 HOTLOOP_DECODE_GRID=seq
  exit 0
fi
if [ "$what" = table ]; then
  timeout 540 python3 "$here/run_gpu.py" --out "$out/table" --gpus "$ngpu" \
    --skip llama3_offline_b256,llama3_awq_bs1_host_emb,llama3_offline_k1 >"$out/table.txt" 2>&1
  echo "run_gpu rc=$?"
  cat "$out/table.txt"
  exit 0
fi
case $what in
  tests | rows | w4a16 | kv | serve | chunks | settle | hostprof | multistep) ;;
  *)
    echo "unknown mode $what (see the modes at the top of $0)" >&2
    exit 2
    ;;
esac
if [ "$ngpu" -gt 1 ]; then
  "${what}_lane0" >"$out/lane0.txt" 2>&1 &
  "${what}_lane1" >"$out/lane1.txt" 2>&1 &
  wait
else
  "${what}_lane0" >"$out/lane0.txt" 2>&1
  "${what}_lane1" >"$out/lane1.txt" 2>&1
fi
cat "$out/lane0.txt" "$out/lane1.txt"
