#!/usr/bin/env bash
# One device call that re-checks the open GPU items, one lane per GPU of an `nvidia-h200-x2` machine
# (on one GPU the lanes run one after the other). Each lane's output goes to OUT_DIR/lane0.txt and
# lane1.txt (printed at the end); the logs and JSON stay under OUT_DIR.
#
#   bash benchmarks/gpu_check.sh OUT_DIR [MODE]
#
# Wheels: ../shared/tools/device-wheels.sh fills .whl with the server's packages; the JSON-mode GPU test
# also needs `bash ../shared/tools/device-wheels.sh xgrammar` (keep xgrammar and apache_tvm_ffi, drop
# the torch / triton / nvidia wheels it pulls in: the device has them).
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
#   kvcuda   one GPU: the CUDA C int8 decode kernel's tests, kv_attention_sweep.py decode (bf16, int8 Triton
#            and CUDA), Nsight Compute on the CUDA kernel.
#   kvcap    two GPUs (one: no fp16 run): the KV-bound fp16 run beside the CUDA int8 kernel's tests, times and KV-bound int8 run.
#   kvvt     one GPU: the CUDA int8 kernel's O^T variants (HOTLOOP_KV_CUDA_VARIANT): tests, decode times;
#            with KVVT_BS1=1 also batch 1 with fp16 / int8 KV (run_capacity.sh bs1), twice.
#   kvprof   one GPU: the CUDA int8 kernel's GPU tests (every variant, the auto choice in the grids), the
#            quantized decode kernel and parity tests, profile_step.py's batch-1 and KV-bound cases with
#            fp16 and int8 KV, then batch 1 with fp16 / int8 KV (run_capacity.sh bs1).
#   kvsplit  one GPU: the CUDA int8 kernel's graph / replay / sliced / variant GPU tests (the auto choice),
#            the quantized engine parity tests, then decode attention at the KV-bound run's batches
#            (160 / 300 x 4,608, bf16 and int8) at 1, 2 and 4 splits.
#   kvsame   one GPU, the first of two calls on one lease (issue 6's same-host pair): the int8 kernel's GPU tests
#            (vt3w, graphs, replay, engine parity), the sweep of vt3w / vtw / probe3w at 1 and 2 splits, then the
#            KV-bound fp16 run; kvsame2, the next call on the same (warm) machine, runs the KV-bound int8 run.
#   floatk   (removed with its kernel, the 16-bit CUDA decode whose splits merged in a cluster: slower at
#            batch 1, benchmarks/results/gpu_2026-12-01e)
#   kvsame2  one GPU, right after kvsame on the same lease: the KV-bound int8 run, then batch 1 with fp16 and int8 KV.
#   kvfw     one GPU, issue 6's batch-1 gap and the early first tile (issue 4's 254 / 2,500): the GPU tests of the
#            int8 fused write (every fused kernel, unrotated and rotated input), the early prologues
#            (HOTLOOP_KV_CUDA_EARLY, HOTLOOP_DECODE_EARLY), the staged q/k/v GEMV and the engine's fused-write
#            parity at batch 8 and 1; then batch 1 (Llama-3-8B, 128 / 512) alternating, twice: fp16 KV, fp16
#            with HOTLOOP_DECODE_EARLY=1, int8 KV, int8 with HOTLOOP_KV_CUDA_FUSED_WRITE=1 (at batch 1: the
#            staged GEMV, the kernel quantizes and writes); then int8 with HOTLOOP_KV_CUDA_EARLY=1, and
#            SmolLM2-135M (8 steps a launch) plain and with HOTLOOP_DECODE_EARLY=1.
#   kvwarp   one GPU, the twentieth session's per-warp rings: the int8 CUDA decode GPU tests (every variant,
#            the seq grid, graphs, replay), the sweep of vt / vt3 / vtw / vt3w and the read probes at the
#            KV-bound and other batches, then the KV-bound int8 run (the twentieth session ran it with
#            vt3 then, in a call of its own, HOTLOOP_KV_CUDA_VARIANT=vt3w; vt3w is now the default).
#   s25a     one GPU: the short-context decode graphs (executor/cuda_graph.py): their GPU tests, the multi-step
#            and one-row GPU tests, short_context_sweep.py (SmolLM2-135M, Llama-3-8B), then batch 1 with them and
#            without (HOTLOOP_DECODE_SHORT_GRAPHS=0), SmolLM2 twice, Llama-3-8B once.
#   s25b     one GPU: short_context_sweep.py at batch 2 and 4 (short-context graphs for buckets 1, 2, 4), then
#            the multi-step and executor GPU tests.
#   s25c     one GPU: every GPU test (540 s at most).
#   s27c     one GPU: the short-context GPU tests, dense_gemv.py's LM head grid (short K: 64-1,024-wide steps,
#            up to 64 rows a program), then SmolLM2-135M batch 1 with the default LM head launch and the
#            grid's fastest (benchmarks/lm_head_ab.py), alternating, twice.
#   fr1      (removed with the decode kernel's fused rotary + KV write over a float cache: slower at batch 256,
#            benchmarks/results/gpu_2026-12-02d; code at `a021048`)
#   tg1      (removed with the tiled Triton GEMM it swept: no faster than cuBLAS at batch 256; code at `10c0ac6`)
#   lg1      one GPU, the decode graphs' logits in bf16 above 16 rows (issue 4): the graph / parity / layer / engine
#            GPU tests, the batch-256 step with this tree and with .ab/old (the tree before, carried), alternating,
#            twice, then profile_step.py's batch-256 case.
#   tk1      one GPU, issue 4's batch-256 GEMMs under torch's TunableOp: dense_gemm.py at M = 256 plain and tuning
#            (PYTORCH_TUNABLEOP_*; the file goes under OUT_DIR), then the batch-256 step with the tuned file and
#            without, alternating, twice.
#   sk1      (removed with the skinny MMA GEMM it timed: slower than cuBLAS, code at `c87d522`)
#   s27d     one GPU: the dense GEMV and one-row GPU tests, SmolLM2-135M batch 1 (8 steps a launch) with the LM head's
#            new launch (64 rows, 64-wide steps) and the old one (lm_head_ab.py), alternating, twice, then
#            Llama-3-8B batch 1 fp16 / int8 KV (8 steps a launch).
#   mw1      one GPU, issue 6's batch-1 row: Llama-3-8B batch 1 with fp16 KV, int8 KV and int8 with
#            HOTLOOP_KV_MERGE_WRITE=1 (the split merge quantizes, writes and attends to the step's token), then
#            their GPU tests (decode_merge_write, the CUDA int8 kernel, engine parity), then the three in reverse.
#   s32a     one GPU: the 8B batch-256 host profile with per-phase timers (1 and 8 steps a launch), the
#            multi-step / merge-write / int8 GPU tests, then w4a16_read_probe.py (its decode chain).
#   s32b     one GPU: run_gpu.py's batch-256 step with the full-batch rounds (default) and one step a
#            launch, then the 8B offline row both ways.
#   s32c     one GPU: the engine's GPU tests (the full-batch rounds are the default now), SmolLM2-135M offline at
#            batch 256 with the full-batch rounds and one step a launch, the 8B batch-256 host profile.
#   s32d     one GPU: the JSON-mode and multi-step GPU tests (carry xgrammar's wheel in .whl).
#   (s33b, s33d-s33h: the thirty-third session's other calls, removed; each ran at the commit that
#            benchmarks/results/gpu_2026-12-06d/README.md names)
#   s33a     one GPU: the tensor-core GEMV on the AutoAWQ layout (w4a16_gemv_tc): its GPU tests, the read probe
#            (every variant, the decode chain), then W4A16 batch 1 with and without it (HOTLOOP_W4A16_TC).
#   s33c     one GPU: the W4A16 GPU tests (kernels, the tuner with the tensor-core GEMV, quantize-and-serve), then
#            the ncu mode (Nsight Compute on each one-row kernel and read probe).
#   s33i     one GPU: W4A16 batch 1 with the CUDA-core GEMV's early loads through ld.global.nc (the default,
#            where ptxas issues the wait first) and through ld.global (HOTLOOP_W4A16_EARLY=ld), twice, then
#            the tensor-core GEMV's GPU tests and batch 1 with it (HOTLOOP_W4A16_TC=1).
#   s34a     one GPU: issue 3's serving run by prefill chunk (8,192, 256, 384, 256 with --jit-schedule), then
#            profile_step.py's serving-mix steps (16 decodes at 1k plus 128-1,024 prompt tokens, and alone).
#   s34c     one GPU: issue 4's batch-256 row with torch's default BLAS (cuBLAS) and with cuBLASLt preferred
#            (TORCH_BLAS_PREFER_CUBLASLT=1: other GEMM kernels may be chosen, e.g. tiles that fill the 132 SMs for
#            gate/up, whose 224 tiles of 256x128 take 1.7 waves), alternating, twice; then profile_step.py's
#            batch-256, batch-16 and serving-mix steps both ways (the GEMM kernels chosen).
#   s34d     one GPU: the W4A16 kernel GPU tests (the SiLU folded into the down projection's GEMV among them) and
#            the MLP's, then W4A16 batch 1 with the two launches (default) and with HOTLOOP_W4A16_FUSED_SILU=1,
#            alternating, twice.
#   s34b     one GPU: the W4A16 kernel and GEMM GPU tests (every early-load form, all included), then W4A16 batch 1
#            with the default early loads (8 rows through ld.global) and with every row early in the 16-row
#            variants (HOTLOOP_W4A16_EARLY=all), alternating, twice (each form tuned in its first run).
#   s35a     one GPU: the dense-tune GPU tests, then issue 4's batch-256 row with F.linear (default) and with the
#            timed cuBLASLt algorithms (HOTLOOP_DENSE_TUNE=1), alternating, twice; then profile_step.py's batch-256
#            and batch-16 steps both ways (which GEMM kernels run), and cublaslt_sweep.py at M = 256, 16.
#   s35b     one GPU: issue 3's serving run with today's defaults (the piecewise graphs' one q/k/v copy and the
#            folded W4A16 SiLU are in since the last H200 run), then with HOTLOOP_DENSE_TUNE=1; then W4A16
#            batch 1 with the folded SiLU (default) and without (HOTLOOP_W4A16_FUSED_SILU=0).
#   s35c     one GPU: the Triton decode kernel's heads-first grid (HOTLOOP_DECODE_GRID=heads): its GPU tests, the
#            bf16 decode sweep at batch 256 x 1k and 128 x 4k with seq and heads, alternating, twice, then issue 4's
#            batch-256 row both ways, twice.
#   s35d     one GPU: the add + RMSNorm folded into the W4A16 q/k/v and gate/up GEMVs (HOTLOOP_W4A16_FUSED_NORM=1):
#            the W4A16 kernel and Llama MLP / fold GPU tests, then W4A16 batch 1 without and with it, alternating,
#            twice.
#   s35e     one GPU: issue 4's batch-256 row with the defaults, HOTLOOP_DECODE_GRID=heads, heads plus
#            HOTLOOP_DENSE_TUNE=1, and the defaults again; W4A16 batch 1 without and with
#            HOTLOOP_W4A16_FUSED_NORM=1; then the GPU tests of those three changes (last: a call cut short
#            keeps the timed rows).
#   s32e     one GPU: the batch-1 GPU tests now pinned to one step a launch, the multi-step GPU tests, then
#            run_gpu.py's batch-256 row with the final full-batch rule.
#   mw1k8    one GPU: the same three with --num-scheduler-steps 8 (int8 with HOTLOOP_KV_MERGE_WRITE=0 and =1, now
#            the default), alternating twice.
#   s28d     one GPU: W4A16 batch 1 with the early weight loads (default) and without (HOTLOOP_W4A16_EARLY=0),
#            alternating, twice, each run tuning its own launches; then every GPU test of tests/kernels.
#   s28c     one GPU, at 20b524f (whose decode graphs above 8 rows were captured without PDL; reverted: no change
#            in the batch-256 row): the PDL, GPU parity, executor and engine GPU tests, the batch-256 row with that
#            and with every graph under PDL (HOTLOOP_PDL_MAX_DECODE_BATCH=100000), then profile_step.py's
#            serving-mix step (16 decodes + a 1,024-token prompt) with PDL on and off.
#   s28b     one GPU: W4A16 batch 1 with the early loads as the default (tuned with them), profile_step.py's
#            batch-256 and batch-16 decode steps with PDL on and off, the batch-256 row, then 8B batch 1 fp16 /
#            int8 KV (8 steps a launch).
#   s28a     one GPU: the CUDA W4A16 GEMV's GPU tests (128-thread blocks, early weight loads), the short-context
#            and AWQ-serving GPU tests, the early kernel's SASS, w4a16_read_probe.py, then W4A16 batch 1 with
#            HOTLOOP_W4A16_EARLY=0 / 1, alternating, twice.
#   s27e     one GPU: dense_gemv.py's SmolLM2-135M projections, the short-K grid (64 / 128-wide steps, 8-64 rows)
#            against the default launch, over weights that together exceed the L2.
#   s26b     one GPU: grid_sync_probe.py (a kernel boundary against a grid barrier), then the GPU tests of tests/kernels.
#   s26c     one GPU: every GPU test outside tests/kernels (and tests/cli).
#   s27b     one GPU: the multi-step and executor GPU tests (int8 short-context graphs), short_context_sweep.py
#            over an int8 cache (Llama-3-8B), then 8B batch 1 fp16 / int8 KV twice, int8 with
#            HOTLOOP_ONE_ROW_ROPE_QUANT=1 and without short graphs once.
#   smolattn one GPU: SmolLM2-135M's decode attention at batch 1 (9 heads, 3 KV heads, head dim 64; 128-640
#            tokens of context), bf16: every split count with larger tiles and more warps, the merge
#            launched and fused (issue 4's 2,500 tokens/s: could one launch per layer replace two?).
#   replay   GPU 0: the launch-replay and piecewise GPU tests, the serving-mix steps of profile_step.py with
#            the attention launches replayed and not (HOTLOOP_LAUNCH_REPLAY=0), then the serving run.
#            GPU 1: the serving run with --max-prefill-token-num 512. (Host time matters: run it on one GPU.)
#   diag     the prefill kernel with and without the unmasked loop below the diagonal: the sweep at 1,024 and
#            4,096 tokens (bf16, int8), then the prefill GPU tests with both.
#   settle   every GPU test, then the serving run with --jit-schedule and plain (one GPU, in turn).
#   next     GPU 0: every GPU test. GPU 1: issue 4's offline row (run_gpu.py --only llama3_offline), then the
#            prefill and serving-mix steps of profile_step.py (the twelfth session's untimed changes).
#   split    every GPU test, -v, in two halves: the attention and KV kernels' tests on GPU 0, the rest on GPU 1.
#   confirm  the GPU parity tests, decode attention by split count at batch 1-64 (bf16, int8), the serving-mix
#            step profile, then the serving run (one GPU: the serving run needs the host to itself).
#   splits2  the GPU parity tests, decode attention by split count (CUDA-graph timing), the decode-16 step with
#            at most 16 and 1 splits, then the serving run (one GPU).
#   final    the attention, launch-replay, piecewise, compile-watch and parity GPU tests, then the serving
#            runs with 8,192- and 2,048-token steps, which print hotloop:kernel_compiles (one GPU).
#   serve1   the serving run alone.
#   tiles    bf16 decode attention at batch 8 / 16, every tile at 2 / 4 / 8 splits, merge launched and
#            fused (decode_plan's next question: the 128-token tiles with the fused merge); the decode-16 step.
#   cuda     the CUDA C W4A16 GEMV: its GPU tests, awq_gemm.py at M = 1 (every tuner candidate's time),
#            then W4A16 batch 1 with it, without it (HOTLOOP_CUDA_KERNELS=0), and with it again (one GPU).
#   cuda2    the same tests and awq_gemm.py, W4A16 batch 1 twice, then the W4A16 batch-1 step's kernels
#            (profile_step.py --model-format awq).
#   cuda3    the W4A16 GPU tests (CUDA GEMV and Triton), then W4A16 batch 1 with the CUDA GEMV and without
#            it (HOTLOOP_CUDA_KERNELS=0), alternating, twice.
#   read     the every-candidate W4A16 GPU test, then w4a16_read_probe.py (plain and GEMV-pattern reads vs the GEMV).
#   all      every GPU test, tests/cli included (one GPU, 8 workers).
#   ncusass  Nsight Compute on the tensor-core GEMV (w4a16_gemv_tc, (4, 16, 8)): instruction statistics and per-SASS-line counters.
#   ncu      Nsight Compute on one launch of each W4A16 one-row kernel and read probe (benchmarks/ncu_w4a16.py).
#   fresh    the quantized-KV and attention kernels' GPU tests and the quantized-KV engine GPU tests, the prefill
#            sweep at 1,024 / 4,096 tokens (a quantized prefill with its own keys from k_new / v_new and
#            without), then Nsight Compute on the decode (batch 128 x 4k) and prefill kernels
#            (benchmarks/ncu_attention.py; one GPU).
#   kvpair   issue 6's KV-bound offline runs side by side, one GPU each: fp16 KV on GPU 0, int8 on GPU 1
#            (run_capacity.sh kv_fp16 / kv_int8; an nvidia-h200-x2 machine).
#   fresh2   the same GPU tests (the quantized engine parity cases of test_gpu_parity.py only), then the prefill
#            sweep (int8 / int4, the cache loop compiled out and kept; one GPU).
#   freshab  GPU 0: the quantized prefill's GPU tests and the prefill sweep (bf16 / int8 / int4). GPU 1: the
#            KV-bound int8 run with HOTLOOP_KV_FRESH_PREFILL=0 (the prompt's keys read back from the cache).
#   plan     the decode-attention GPU tests, the decode-16 step, then the serving run (one GPU).
#   merge    decode attention at batch 8-24 with the split merge fused and launched
#            (HOTLOOP_DECODE_FUSED_MERGE), bf16 tiles at batch 16, then the decode-16 step both ways.
#   last     the serving runs with 8,192- and 2,048-token steps, then batch 1 with fp16 KV, int8 KV with
#            HOTLOOP_ONE_ROW_ROPE_QUANT=1, and int8 KV, in turn, twice, then dense_gemm.py at M 16 and 32
#            (cuBLAS / cuBLASLt, either weight layout; one GPU: host time matters).
#   skinny   GPU 0: the skinny GEMM's GPU tests, then benchmarks/skinny_gemm.py (8B and SmolLM2 shapes).
#            GPU 1: decode steps at batch 16 / 32, then the engine's GPU tests. (At 0f306b8, where
#            HOTLOOP_SKINNY_GEMM=1 / 0 routed the dense layers through the kernel or not; it is gone.)
#   batch    GPU 0: dense_gemm.py (cuBLAS calls per projection at M 256-512), then the bf16 offline row at
#            --max-batch-size 384 and 320. GPU 1: the W4A16 offline row at 384, then bf16 at 448 with
#            --cache-max-entry-count 0.92 (issue 4's offline target; issue 5's W4A16-vs-bf16 row).
#   steady   GPU 0: the GPU tests that run the engine (greedy parity, one-row path, runner). GPU 1: the 8B
#            batch-256 host profile, then 8B and SmolLM2 batch 1 (the steady-decode input path).
#   table    the whole issue-4 table (`run_gpu.py --gpus 2`, transformers baseline included), less the
#            256-sequence offline, host-embedding and multi-step offline rows (measured in other calls).
#   probe    host_block_probe.py, then the 8B batch-256 host profile with 8 steps and SmolLM2 batch 1.
#   verify   the engine's GPU tests (multi-step decode's included), then the 8B batch-256 host profile
#            with 8 and 1 steps per launch, one after the other on one GPU.
#   msrows   GPU 0: the multi-step rows beside their one-step twins (batch 1, batch 256) and the
#            multi-step offline row. GPU 1: the 8B batch-256 host profile with 1 and 8 steps per launch,
#            then the one-step offline row.
#   hostprof GPU 0: host_profile.py, 8B at batch 256. GPU 1: host_step.py (CPU only), then SmolLM2's
#            batch-256 host profile.
#   multistep GPU 0: the GPU tests that run the engine (multi-step decode's included), then the 8B
#            batch-256 host profile with 1 and 8 decode steps per launch. GPU 1: batch 1 (SmolLM2, 8B)
#            and SmolLM2 at batch 256, each with 1 and 8 steps per launch.
#   s23a     one GPU, in turn: the GPU tests never run yet (JSON mode in the graphs, the rope GEMV's launch
#            trigger, the int8 CUDA kernel and quantized parity cut off in the twenty-second session), the 8B
#            batch-256 host profile with 1 and 8 steps per launch (issue 4's host row, the byte-chunk decode
#            not yet timed on a GPU host), then SmolLM2-135M batch 1 with 8 steps per launch, twice.
#   s23b     one GPU, in turn: the GPU tests of the merge in the o projection and JSON mode, SmolLM2-135M batch 1
#            (8 steps a launch) with HOTLOOP_ONE_ROW_MERGE=0 / 1 alternating and four launch configurations of
#            the merged GEMV, then call s23a's test selection again, verbose (it timed out before its summary).
#   s23c     one GPU, in turn: the merged GEMV's and the rope trigger's GPU tests, then SmolLM2-135M batch 1 (8 steps
#            a launch) with the merge launch and with the by-split merge in the o projection (four launches).
#   s24a     one GPU, in turn: the merged o projection's GPU tests and SmolLM2 splits (16 / 8 / 4 / 16, one round), then
#            profile_step.py's prefill / mixed cases at 1,008, 1,024 and 1,040 rows and decode at 16.
#   s24b     one GPU, in turn: merge / split GPU tests, then SmolLM2 batch 1 with the merged path capped at 8
#            splits against 16, merge configs 32 / 8 outputs, one step a launch, 1,536-token
#            prompts at 8 and 16 splits, and Llama-3-8B batch 1.
#
# One-off A/B modes of earlier sessions (fusions, pdl, qrope_ab, splits, ...) are in this file's
# history: each results README under benchmarks/results/ names the commit its calls ran at.
# Batch-1 rows are `hotloop bench latency --load-format dummy --dtype bfloat16 --batch-size 1
# --input-len 128 --output-len 512 --num-iters 3` (the `bs1` helper); environment switches (see
# hotloop/kernels/ops.py) go in front of a call. Expects the wheels of `.whl` on PYTHONPATH (see
# ../shared/GPU.md); add `pip download --no-deps llama-models==0.3.0 -d .whl` (its test image), or the
# 20 VL parity GPU tests skip.
set -u
out=${1:?OUT_DIR}
what=${2:-tests}
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
profile_ab() {  # VAR tag cases value...: profile_step.py's cases once per value of the environment variable VAR
  local var=$1 tag=$2 cases=$3 v
  shift 3
  for v in "$@"; do
    env "$var=$v" timeout 150 python3 "$here/profile_step.py" --out "$out/profile_$tag$v.json" \
      --cases "$cases" >"$out/profile_$tag$v.log" 2>&1
    echo "profile_step $var=$v rc=$?"
    grep -E "floor" "$out/profile_$tag$v.log"
  done
}
gpu_tests() {  # [tag [seconds [pytest paths and options...]]]: the GPU tests, every one by default
  local tag=${1:-gpu_tests} secs=${2:-450}
  shift 2 2>/dev/null || shift $#
  [ $# -eq 0 ] && set -- tests --ignore=tests/cli
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
batch_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 "$here/dense_gemm.py" "$out/dense_gemm.json" >"$out/dense_gemm.log" 2>&1
  echo "dense_gemm rc=$?"
  cat "$out/dense_gemm.log"
  offline b384 --max-batch-size 384
  offline b320 --max-batch-size 320
}
batch_lane1() {
  export CUDA_VISIBLE_DEVICES=$g1
  offline awq_b384 --max-batch-size 384 --model-format awq
  offline b448_c092 --max-batch-size 448 --cache-max-entry-count 0.92
}
steady_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/api/test_gpu_parity.py \
    tests/models/test_one_row.py tests/executor >"$out/steady_tests.log" 2>&1
  echo "engine GPU tests rc=$?"
  tail -15 "$out/steady_tests.log" | grep -E "passed|failed|FAILED|ERROR"
}
steady_lane1() {
  export CUDA_VISIBLE_DEVICES=$g1
  hostprof llama3-8b 8b
  bs1 llama3-8b llama3-8b
  bs1 smollm2-135m smollm2-135m
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
replay_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  python3 -c "import torch; from hotloop.kernels import launch_replay as r; print('launch replay available:', r.available(torch.device('cuda', 0)))" 2>&1 | tail -3
  timeout 200 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_launch_replay.py \
    tests/executor tests/api/test_gpu_parity.py tests/kernels/test_attention_kernels.py >"$out/replay_tests.log" 2>&1
  echo "replay GPU tests rc=$?"
  tail -15 "$out/replay_tests.log" | grep -E "passed|failed|FAILED|ERROR"
  timeout 150 python3 "$here/profile_step.py" --out "$out/profile.json" --cases "16 decodes,prefill 1x128" \
    >"$out/profile.log" 2>&1
  echo "profile_step (replay) rc=$?"
  grep -E "floor|host launch" "$out/profile.log"
  HOTLOOP_LAUNCH_REPLAY=0 timeout 100 python3 "$here/profile_step.py" --out "$out/profile_noreplay.json" \
    --cases "16 decodes@1k + 1x256" >"$out/profile_noreplay.log" 2>&1
  echo "profile_step (no replay) rc=$?"
  grep -E "floor|host launch" "$out/profile_noreplay.log"
  serve 0 c8192
}
diag_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 110 python3 "$here/kv_attention_sweep.py" --out "$out/sweep.json" --no-decode --policies 0,8 \
    --prefill-lens 1024,4096 \
    --prefill-configs "64,64,4,2,0;64,64,4,2,1;128,32,8,2,0;128,32,8,2,1;128,64,8,2,1;64,64,4,3,1" >"$out/sweep.log" 2>&1
  echo "sweep rc=$?"
  grep -E "prefill T=|relative error" "$out/sweep.log"
  timeout 100 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_attention_kernels.py \
    tests/kernels/test_kv_quant_kernels.py -k "prefill" >"$out/diag_tests.log" 2>&1
  echo "prefill GPU tests rc=$?"
  tail -15 "$out/diag_tests.log" | grep -E "passed|failed|FAILED|ERROR"
}
diag_lane1() { :; }
next_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests
}
next_lane1() {
  export CUDA_VISIBLE_DEVICES=$g1
  timeout 330 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_offline 2>&1 | tail -12
  timeout 150 python3 "$here/profile_step.py" --out "$out/profile.json" --cases "prefill 1x1024,16 decodes,decode 16@1k" \
    >"$out/profile.log" 2>&1
  echo "profile_step rc=$?"
  grep -E "floor|host launch" "$out/profile.log"
}
split_lane0() {  # the attention and KV kernels' GPU tests
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests tests_kernels_attn 330 tests/kernels/test_kv_quant_kernels.py tests/kernels/test_attention_kernels.py \
    tests/kernels/test_launch_replay.py
}
split_lane1() {  # every other GPU test
  export CUDA_VISIBLE_DEVICES=$g1
  gpu_tests tests_rest 330 tests --ignore=tests/cli --ignore=tests/kernels/test_kv_quant_kernels.py \
    --ignore=tests/kernels/test_attention_kernels.py --ignore=tests/kernels/test_launch_replay.py
}
confirm_lane0() {  # the GPU parity tests, then decode attention by context split at small batches
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests parity_tests 200 tests/api/test_gpu_parity.py tests/models/test_one_row.py
  timeout 150 python3 "$here/kv_attention_sweep.py" --out "$out/splits.json" --quick --no-prefill \
    --policies 0,8 --decode-shapes 1x1024,4x1024,8x1024,16x1024,32x1024,64x1024 --splits 1,2,4,8,16 \
    >"$out/splits.log" 2>&1
  echo "split sweep rc=$?"
  sed -n '/best per case/,$p' "$out/splits.log"
}
splits2_lane0() {  # the GPU parity tests, decode attention by split count timed in CUDA graphs, decode-16 steps
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests parity_tests 200 tests/api/test_gpu_parity.py tests/models/test_one_row.py
  timeout 180 python3 "$here/kv_attention_sweep.py" --out "$out/splits.json" --quick --no-prefill \
    --policies 0,8 --decode-shapes 1x1024,4x1024,16x1024,32x1024,64x1024 --splits 1,2,4,8,16 \
    >"$out/splits.log" 2>&1
  echo "split sweep rc=$?"
  grep -E "splits|best" "$out/splits.log" | grep -v "relative error"
  for ms in 1; do  # (16, the default: 5.84 ms in the confirm call)
    HOTLOOP_DECODE_MAX_SPLITS=$ms timeout 100 python3 "$here/profile_step.py" --out "$out/profile_ms$ms.json" \
      --cases "decode 16@1k" >"$out/profile_ms$ms.log" 2>&1
    echo "decode 16 with at most $ms splits: $(grep -E "floor" "$out/profile_ms$ms.log")"
  done
}
splits2_lane1() {  # the serving run (with the warm-up of every prefill configuration)
  serve "$g1" c8192
}
skinny_lane0() {  # the skinny GEMM's GPU tests, then it against cuBLAS per projection and M (8B, SmolLM2)
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests skinny_tests 150 tests/kernels/test_skinny_gemm.py
  for m in llama3 smollm2; do
    timeout 150 python3 "$here/skinny_gemm.py" "$out/skinny_$m.json" --model "$m" >"$out/skinny_$m.log" 2>&1
    echo "skinny_gemm.py $m rc=$?"
    grep -E "step GEMMs|M= *16 " "$out/skinny_$m.log"
  done
}
skinny_lane1() {  # decode steps at batch 16 and 32 with the skinny GEMM and without, then the engine's GPU tests
  export CUDA_VISIBLE_DEVICES=$g1
  profile_ab HOTLOOP_SKINNY_GEMM sk "decode 16@1k,decode 32@1k" 1 0
  gpu_tests engine_tests 200 tests/api/test_gpu_parity.py tests/models/test_one_row.py tests/executor \
    tests/engine/test_multi_step.py
}
tiles_lane0() {  # bf16 decode attention at batch 8 / 16: tiles x split counts, merge launched and fused
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 "$here/kv_attention_sweep.py" --out "$out/tiles.json" --no-prefill --policies 0 \
    --decode-shapes 8x1024,16x1024 --decode-configs "64,4,3;128,4,3;128,8,2;128,4,2" --splits 2,4,8 \
    --cross --fuse-merge both >"$out/tiles.log" 2>&1
  echo "tile sweep rc=$?"
  grep -E "decode B=.* ms|best|default" "$out/tiles.log"
}
tiles_lane1() {  # the decode-16 step as the engine runs it now
  export CUDA_VISIBLE_DEVICES=$g1
  timeout 150 python3 "$here/profile_step.py" --out "$out/profile.json" --cases "decode 16@1k" \
    >"$out/profile.log" 2>&1
  echo "profile_step rc=$?"
  grep -E "floor" "$out/profile.log"
}
serve1_lane0() { serve 0 c8192; }
serve1_lane1() { :; }
plan_lane0() {  # decode_plan's fused merge at batch 8-16: the decode-attention GPU tests, the decode-16 step
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests decode_tests 150 tests/kernels/test_attention_kernels.py -k decode
  timeout 150 python3 "$here/profile_step.py" --out "$out/profile.json" --cases "decode 16@1k" \
    >"$out/profile.log" 2>&1
  echo "profile_step rc=$?"
  grep -E "floor" "$out/profile.log"
}
plan_lane1() {  # then the serving run
  serve "$g1" c8192
}
merge_lane0() {  # decode attention at batch 8-24: the split merge fused or launched, and the bf16 tiles at batch 16
  export CUDA_VISIBLE_DEVICES=0
  local fm
  for fm in 0 1; do
    HOTLOOP_DECODE_FUSED_MERGE=$fm timeout 120 python3 "$here/kv_attention_sweep.py" --out "$out/merge$fm.json" \
      --quick --no-prefill --policies 0,8 --decode-shapes 8x1024,16x1024,24x1024 --splits 1,2,4,8 \
      >"$out/merge$fm.log" 2>&1
    echo "sweep HOTLOOP_DECODE_FUSED_MERGE=$fm rc=$?"
    grep -E "decode B=.* ms" "$out/merge$fm.log"
  done
  timeout 120 python3 "$here/kv_attention_sweep.py" --out "$out/tiles16.json" --no-prefill --policies 0 \
    --decode-shapes 16x1024 --decode-configs "32,4,3;64,4,3;64,4,4;64,8,3;128,4,2;128,8,2;32,2,3;64,2,3;128,4,3" \
    >"$out/tiles16.log" 2>&1
  echo "tile sweep rc=$?"
  grep -E "decode B=.* ms" "$out/tiles16.log"
}
merge_lane1() {  # the decode-16 and -24 steps with the merge fused and launched
  export CUDA_VISIBLE_DEVICES=$g1
  profile_ab HOTLOOP_DECODE_FUSED_MERGE fm "decode 16@1k" 0 1
}
last_lane0() {  # the serving run, whole prompts (8,192-token steps) and 2,048-token steps
  serve 0 c8192
  serve 0 c2048 --max-prefill-token-num 2048
}
last_lane1() {  # batch 1 with fp16 KV, int8 KV, and int8 KV with the rope + quantized write in the q/k/v GEMV
  export CUDA_VISIBLE_DEVICES=$g1
  local i
  for i in 1 2; do
    bs1 "kv16_$i" llama3-8b
    HOTLOOP_ONE_ROW_ROPE_QUANT=1 bs1 "kv8q_$i" llama3-8b --quant-policy 8
    bs1 "kv8_$i" llama3-8b --quant-policy 8
  done
  timeout 120 python3 "$here/dense_gemm.py" "$out/dense_m16.json" --m 16,32 >"$out/dense_m16.log" 2>&1
  echo "dense_gemm.py rc=$?"
  grep -E "ceilings|M=" "$out/dense_m16.log"
}
final_lane0() {  # the attention, launch-replay, piecewise-graph, compile-watch and parity GPU tests
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests attn_tests 270 tests/kernels/test_attention_kernels.py tests/kernels/test_launch_replay.py \
    tests/executor/test_piecewise_graph.py tests/kernels/test_compile_watch.py tests/api/test_gpu_parity.py \
    tests/models/test_one_row.py
}
final_lane1() {  # the serving run, whole prompts (8,192-token steps) and 2,048-token steps
  serve "$g1" c8192
  # at most two 1,024-token prompts per step: bursts of arrivals no longer make one long step for
  # every running decode (p99 TPOT), while each prompt still prefills whole (TTFT)
  serve "$g1" c2048 --max-prefill-token-num 2048
}
confirm_lane1() {  # the serving-mix step profile, then the serving run
  export CUDA_VISIBLE_DEVICES=$g1
  timeout 150 python3 "$here/profile_step.py" --out "$out/profile.json" --cases "prefill 1x1024,16 decodes,decode 16@1k" \
    >"$out/profile.log" 2>&1
  echo "profile_step rc=$?"
  grep -E "floor|host launch" "$out/profile.log"
  serve "$g1" c8192
}
settle_lane0() {
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests
}
settle_lane1() {
  serve "$g1" jit --jit-schedule
  serve "$g1" plain
}
replay_lane1() {
  serve "$g1" c512 --max-prefill-token-num 512
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
if [ "$what" = probe ]; then  # which host calls block on the GPU, then the 8B batch-256 host profile, 1 and 8 steps
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python3 "$here/host_block_probe.py" --out "$out/host_block_probe.json" 2>&1 | tee "$out/host_block_probe.log"
  hostprof llama3-8b 8b_k8 --num-scheduler-steps 8
  bs1 smollm2_k8 smollm2-135m --num-scheduler-steps 8
  bs1 smollm2_k1 smollm2-135m
  exit 0
fi
cuda_gemv_checks() {  # the CUDA GEMV's GPU tests, then awq_gemm.py at M = 1 (every tuner candidate's time)
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/kernels/test_w4a16_cuda.py \
    >"$out/cuda_tests.log" 2>&1
  echo "CUDA GEMV GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/cuda_tests.log" | cut -c1-300 | head -20
  timeout 200 python3 "$here/awq_gemm.py" "$out/awq_gemm.json" --m 1 >"$out/awq_gemm.log" 2>&1
  echo "awq_gemm rc=$?"
  sed -n '/^tuner/,$p' "$out/awq_gemm.log" | cut -c1-600
}
if [ "$what" = cuda ]; then  # one GPU, in turn
  cuda_gemv_checks
  bs1 awq llama3-8b --model-format awq
  HOTLOOP_CUDA_KERNELS=0 bs1 awq_triton llama3-8b --model-format awq
  bs1 awq_2 llama3-8b --model-format awq
  exit 0
fi
if [ "$what" = cuda2 ]; then  # one GPU, in turn
  cuda_gemv_checks
  bs1 awq llama3-8b --model-format awq
  bs1 awq_2 llama3-8b --model-format awq
  timeout 200 python3 "$here/profile_step.py" --model-format awq --cases "decode 1@128" \
    --out "$out/profile_awq.json" >"$out/profile_awq.log" 2>&1
  echo "profile rc=$?"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(k, round(v['ms_p50'],3), [(r['kernel'][:60], round(r['ms'],3), r['calls']) for r in v['kernels']]) for k,v in d.items()]" "$out/profile_awq.json"
  exit 0
fi
if [ "$what" = read ]; then  # one GPU
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
    "tests/kernels/test_w4a16_gemm.py::test_gpu_every_candidate_and_variant" >"$out/cand_tests.log" 2>&1
  echo "candidate tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/cand_tests.log" | cut -c1-300 | head -20
  timeout 240 python3 "$here/w4a16_read_probe.py" "$out/read_probe.json" >"$out/read_probe.log" 2>&1
  echo "read probe rc=$?"
  cut -c1-300 "$out/read_probe.log" | tail -60
  exit 0
fi
if [ "$what" = all ]; then  # one GPU: every GPU test (tests/cli too: it needs pexpect from .whl)
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests all_gpu_tests 540 tests
  exit 0
fi
if [ "$what" = ncusass ]; then  # one GPU: the tensor-core GEMV's instructions and stalls, per SASS line
  export CUDA_VISIBLE_DEVICES=0
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  timeout 250 "$NCU" --clock-control none -k regex:w4a16_gemv_tc_bf16 --launch-skip 2 --launch-count 1 \
    --section InstructionStats --section SourceCounters --section WarpStateStats --print-details all \
    python3 "$here/ncu_w4a16.py" >"$out/ncu_details.txt" 2>&1
  echo "ncu details rc=$?"
  grep -iE "Executed Instructions|Issued Instructions|stall|Avg. Executed|Branch" "$out/ncu_details.txt" | cut -c1-160 | head -30
  timeout 250 "$NCU" --clock-control none -k regex:w4a16_gemv_tc_bf16 --launch-skip 2 --launch-count 1 \
    --section SourceCounters --page source --print-source sass --csv \
    python3 "$here/ncu_w4a16.py" >"$out/ncu_sass.csv" 2>&1
  echo "ncu sass rc=$? lines=$(wc -l <"$out/ncu_sass.csv")"
  head -3 "$out/ncu_sass.csv" | cut -c1-400
  exit 0
fi
if [ "$what" = fresh ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_quant_kernels.py \
    tests/kernels/test_attention_kernels.py tests/kernels/test_launch_replay.py tests/api/test_gpu_parity.py \
    tests/api/test_kv_quant_engine.py >"$out/fresh_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/fresh_tests.log" | cut -c1-300 | head -40
  timeout 120 python3 "$here/kv_attention_sweep.py" --out "$out/sweep.json" --quick --no-decode \
    --prefill-lens 1024,4096 >"$out/sweep.log" 2>&1
  echo "sweep rc=$?"
  grep -E "prefill T=" "$out/sweep.log" | cut -c1-200
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  timeout 200 "$NCU" --clock-control none --launch-skip 5 -k 'regex:_decode_kernel|_prefill_kernel' \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section InstructionStats --section LaunchStats \
    python3 "$here/ncu_attention.py" >"$out/ncu_attn.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "^  [_a-zA-Z0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Eligible Warps|Warp Cycles Per Issued|Compute \(SM\) Throughput|Registers Per|Block Limit|Executed Instructions |Grid Size|Shared Memory Configuration Size|L1/TEX Hit|L2 Hit" "$out/ncu_attn.txt" | cut -c1-160 | head -150
  exit 0
fi
if [ "$what" = kvcuda ]; then  # one GPU: the CUDA C int8 decode kernel's tests, its times beside Triton's, ncu
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_int8_decode_cuda.py \
    tests/kernels/test_kv_quant_kernels.py tests/kernels/test_launch_replay.py \
    "tests/api/test_gpu_parity.py::test_quantized_kv_graphs_equal_eager" -k "decode or replay or quantized or layer" \
    >"$out/kvcuda_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvcuda_tests.log" | cut -c1-300 | head -40
  timeout 150 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_decode.json" --quick --no-prefill \
    --policies 0,8 --decode-shapes 256x1024,128x4096,16x4096,1x4096 --splits 1,2,4,16 >"$out/sweep_decode.log" 2>&1
  echo "decode sweep rc=$?"
  grep -E "decode B=|default vs" "$out/sweep_decode.log" | cut -c1-200
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  timeout 120 "$NCU" --clock-control none --launch-skip 1 --launch-count 1 -k regex:kv_int8_decode \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section LaunchStats python3 "$here/ncu_attention.py" >"$out/ncu_cuda.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "^  [_a-zA-Z0-9]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Registers Per|Block Limit|Grid Size" "$out/ncu_cuda.txt" | cut -c1-160 | head -40
  exit 0
fi
if [ "$what" = kvcap ]; then  # two GPUs: GPU 0 the KV-bound fp16 run; GPU 1 the CUDA int8 kernel's tests, its
  # decode times, then the KV-bound int8 run (side by side: one host)
  if [ "$ngpu" -gt 1 ]; then
    CUDA_VISIBLE_DEVICES=0 bash "$here/run_capacity.sh" kv_fp16 "$out/cap" 520 >"$out/lane0.txt" 2>&1 &
  else
    echo "one GPU: the fp16 run is left out" >"$out/lane0.txt"
  fi
  (
    export CUDA_VISIBLE_DEVICES=$g1
    timeout 120 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_int8_decode_cuda.py \
      -k "sliced or graph or replay or triton or (test_decode_gpu and (64 or 16))" >"$out/kvcuda_tests.log" 2>&1
    echo "GPU tests rc=$?"
    grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvcuda_tests.log" | cut -c1-300 | head -20
    timeout 60 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_decode.json" --quick --no-prefill \
      --policies 8 --decode-shapes 128x4096,320x4096,1x4096 >"$out/sweep_decode.log" 2>&1
    echo "decode sweep rc=$?"
    grep -E "decode B=" "$out/sweep_decode.log" | grep -v "default vs" | cut -c1-200
    bash "$here/run_capacity.sh" kv_int8 "$out/cap" 400
  ) >"$out/lane1.txt" 2>&1
  wait
  cat "$out/lane0.txt" "$out/lane1.txt"
  exit 0
fi
if [ "$what" = kvvt ]; then  # one GPU: the CUDA int8 kernel's variants (tests, then decode times beside Triton's)
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_int8_decode_cuda.py \
    -k "variants or sliced or graph or replay" >"$out/kvvt_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvvt_tests.log" | cut -c1-300 | head -40
  timeout 150 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_decode.json" --quick --no-prefill \
    --policies 8 --decode-shapes 256x1024,128x4096,320x4096,16x4096,1x4096 >"$out/sweep_decode.log" 2>&1
  echo "decode sweep rc=$?"
  grep -E "decode B=" "$out/sweep_decode.log" | grep -v "default vs" | cut -c1-200
  if [ -n "${KVVT_BS1:-}" ]; then  # then issue 6's batch-1 A/B, fp16 / int8 KV alternating, twice
    for i in 1 2; do bash "$here/run_capacity.sh" bs1 "$out/bs1_$i" 150; done
    grep -ho '"decode_tokens_per_s": [0-9.]*' "$out"/bs1_*/bs1_q*.json
  fi
  exit 0
fi
if [ "$what" = s24b ]; then
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 8 -v -rfE -p no:cacheprovider tests/models/test_one_row.py \
    tests/kernels/test_dense_gemv.py tests/kernels/test_attention_kernels.py -k "merge or split" \
    >"$out/s24b_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/s24b_tests.log" | cut -c1-300 | head -30
  HOTLOOP_DECODE_MAX_SPLITS=8 bs1 smol_def1 smollm2-135m --num-scheduler-steps 8
  HOTLOOP_DECODE_MAX_SPLITS=16 bs1 smol_m16 smollm2-135m --num-scheduler-steps 8
  HOTLOOP_DECODE_MAX_SPLITS=8 bs1 smol_def2 smollm2-135m --num-scheduler-steps 8
  HOTLOOP_DECODE_MAX_SPLITS=8 HOTLOOP_ONE_ROW_MERGE_CONFIG=32,1024,8 bs1 smol_c32 smollm2-135m --num-scheduler-steps 8
  HOTLOOP_DECODE_MAX_SPLITS=8 HOTLOOP_ONE_ROW_MERGE_CONFIG=8,1024,8 bs1 smol_c8 smollm2-135m --num-scheduler-steps 8
  HOTLOOP_DECODE_MAX_SPLITS=8 bs1 smol_def_k1 smollm2-135m
  HOTLOOP_DECODE_MAX_SPLITS=8 bs1 smol_long8 smollm2-135m --num-scheduler-steps 8 --input-len 1536 --session-len 4096
  HOTLOOP_DECODE_MAX_SPLITS=16 bs1 smol_long16 smollm2-135m --num-scheduler-steps 8 --input-len 1536 --session-len 4096
  bs1 llama_def llama3-8b --num-scheduler-steps 8
  exit 0
fi
if [ "$what" = s25a ]; then
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -n 8 -v -rfE -p no:cacheprovider tests/engine/test_multi_step.py \
    tests/executor tests/models/test_one_row.py >"$out/s25a_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/s25a_tests.log" | cut -c1-300 | head -30
  timeout 240 python3 "$here/short_context_sweep.py" --out "$out/short_context_sweep.json" \
    --windows 16:48,64:64,128:128,256:256,640:128 --reps 3 >"$out/short_context_sweep.log" 2>&1
  echo "[sweep] rc=$?"
  grep -E "tokens|Error|error" "$out/short_context_sweep.log" | tail -20
  for r in 1 2; do
    bs1 "smol_short_$r" smollm2-135m --num-scheduler-steps 8
    HOTLOOP_DECODE_SHORT_GRAPHS=0 bs1 "smol_full_$r" smollm2-135m --num-scheduler-steps 8
  done
  bs1 llama_short llama3-8b --num-scheduler-steps 8
  HOTLOOP_DECODE_SHORT_GRAPHS=0 bs1 llama_full llama3-8b --num-scheduler-steps 8
  exit 0
fi
if [ "$what" = s25b ]; then
  export CUDA_VISIBLE_DEVICES=0
  timeout 400 python3 "$here/short_context_sweep.py" --out "$out/short_context_b24.json" --batches 2,4 \
    --buckets 1,2,4 --windows 64:64,256:256,640:128 --reps 2 >"$out/short_context_b24.log" 2>&1
  echo "[sweep b2/b4] rc=$?"
  grep -E "contexts|Error|error" "$out/short_context_b24.log" | tail -20
  timeout 150 python3 -m pytest -m gpu -n 8 -v -rfE -p no:cacheprovider tests/engine/test_multi_step.py \
    tests/executor >"$out/s25b_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/s25b_tests.log" | cut -c1-300 | head -30
  exit 0
fi
if [ "$what" = s25c ]; then
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests gpu_tests 540
  exit 0
fi
if [ "$what" = s24a ]; then
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -n 8 -v -rfE -p no:cacheprovider tests/models/test_one_row.py \
    tests/kernels/test_dense_gemv.py -k "merge" >"$out/merge2_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/merge2_tests.log" | cut -c1-300 | head -30
  for sp in 16 8 4 16; do
    HOTLOOP_DECODE_MAX_SPLITS=$sp bs1 "smol_s${sp}" smollm2-135m --num-scheduler-steps 8
  done
  timeout 200 python3 "$here/profile_step.py" --out "$out/profile_tiles.json" \
    --cases "prefill 1x10,mixed 16 decodes@1k + 1x10,decode 16@1k" >"$out/profile_tiles.log" 2>&1
  echo "[profile_tiles] rc=$?"
  grep -E "ms   floor" "$out/profile_tiles.log"
  exit 0
fi
if [ "$what" = s23c ]; then
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 8 -v -rfE -p no:cacheprovider tests/kernels/test_dense_gemv.py \
    tests/models/test_one_row.py -k "merge or trigger" >"$out/s23c_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/s23c_tests.log" | cut -c1-300 | head -30
  HOTLOOP_ONE_ROW_MERGE=0 bs1 smol_off_1 smollm2-135m --num-scheduler-steps 8
  for c in 8,1024,8 4,1024,4 16,1024,8 2,1024,8; do
    HOTLOOP_ONE_ROW_MERGE=1 HOTLOOP_ONE_ROW_MERGE_CONFIG=$c bs1 "smol_on_${c//,/_}" smollm2-135m --num-scheduler-steps 8
  done
  HOTLOOP_ONE_ROW_MERGE=0 bs1 smol_off_2 smollm2-135m --num-scheduler-steps 8
  exit 0
fi
if [ "$what" = s23b ]; then
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 8 -v -rfE -p no:cacheprovider tests/api/test_json_mode.py \
    tests/kernels/test_dense_gemv.py tests/models/test_one_row.py -k "json or merge" >"$out/s23b_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/s23b_tests.log" | cut -c1-300 | head -30
  for i in 1 2; do
    HOTLOOP_ONE_ROW_MERGE=0 bs1 "smol_off_$i" smollm2-135m --num-scheduler-steps 8
    HOTLOOP_ONE_ROW_MERGE=1 bs1 "smol_on_$i" smollm2-135m --num-scheduler-steps 8
  done
  for c in 2,64,4 8,64,4 16,64,4 4,128,4; do
    HOTLOOP_ONE_ROW_MERGE=1 HOTLOOP_ONE_ROW_MERGE_CONFIG=$c bs1 "smol_on_${c//,/_}" smollm2-135m --num-scheduler-steps 8
  done
  HOTLOOP_ONE_ROW_MERGE=1 bs1 smol_on_k1 smollm2-135m
  HOTLOOP_ONE_ROW_MERGE=0 bs1 smol_off_k1 smollm2-135m
  timeout 150 python3 -m pytest -m gpu -n 8 -v -rfE -p no:cacheprovider tests/kernels/test_dense_gemv.py \
    tests/kernels/test_kv_int8_decode_cuda.py tests/api/test_gpu_parity.py \
    -k "trigger or rope or int8 or quantized or early or cuda" >"$out/s23b_tests2.log" 2>&1
  echo "GPU tests (2) rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/s23b_tests2.log" | cut -c1-300 | head -30
  exit 0
fi
if [ "$what" = s23a ]; then
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/api/test_json_mode.py \
    tests/kernels/test_dense_gemv.py tests/kernels/test_kv_int8_decode_cuda.py tests/api/test_gpu_parity.py \
    -k "json or trigger or rope or int8 or quantized or early or cuda" >"$out/s23a_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/s23a_tests.log" | cut -c1-300 | head -30
  hostprof llama3-8b 8b_k1
  hostprof llama3-8b 8b_k8 --num-scheduler-steps 8
  bs1 smol_1 smollm2-135m --num-scheduler-steps 8
  bs1 smol_2 smollm2-135m --num-scheduler-steps 8
  exit 0
fi
if [ "$what" = kvdef ]; then  # one GPU, in turn: the early prologue on by default for one-wave grids
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_int8_decode_cuda.py \
    tests/kernels/test_launch_replay.py tests/api/test_gpu_parity.py -k "int8 or quantized or early or replay or cuda" \
    >"$out/kvdef_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvdef_tests.log" | cut -c1-300 | head -30
  bs1 q8 llama3-8b --quant-policy 8
  HOTLOOP_KV_CUDA_EARLY=0 bs1 q8late llama3-8b --quant-policy 8
  exit 0
fi
if [ "$what" = kvearly ]; then  # one GPU, in turn: the early prologues, alternating
  export CUDA_VISIBLE_DEVICES=0
  for i in 1 2 3; do
    bs1 "q8_$i" llama3-8b --quant-policy 8
    HOTLOOP_KV_CUDA_EARLY=1 bs1 "q8early_$i" llama3-8b --quant-policy 8
  done
  for i in 1 2; do
    bs1 "smol_$i" smollm2-135m --num-scheduler-steps 8
    HOTLOOP_DECODE_EARLY=1 bs1 "smolearly_$i" smollm2-135m --num-scheduler-steps 8
  done
  exit 0
fi
if [ "$what" = kvfw2 ]; then  # one GPU, in turn: where the staged int8 batch-1 path loses its overlap
  export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_dense_gemv.py \
    -k "staged or rope" >"$out/kvfw2_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvfw2_tests.log" | cut -c1-300 | head -20
  bs1 q8 llama3-8b --quant-policy 8
  HOTLOOP_KV_CUDA_FUSED_WRITE=1 HOTLOOP_ROPE_TRIGGER=early bs1 q8fwE llama3-8b --quant-policy 8
  HOTLOOP_ROPE_TRIGGER=early bs1 q0E llama3-8b
  HOTLOOP_PDL=0 bs1 q8nopdl llama3-8b --quant-policy 8
  HOTLOOP_PDL=0 HOTLOOP_KV_CUDA_FUSED_WRITE=1 bs1 q8fwnopdl llama3-8b --quant-policy 8
  HOTLOOP_KV_CUDA_FUSED_WRITE=1 HOTLOOP_KV_CUDA_VARIANT=vt3 bs1 q8fwvt3 llama3-8b --quant-policy 8
  bs1 q0 llama3-8b
  exit 0
fi
if [ "$what" = kvfw ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_int8_decode_cuda.py \
    tests/kernels/test_dense_gemv.py tests/kernels/test_attention_kernels.py tests/api/test_gpu_parity.py \
    -k "fused_write or early or staged" >"$out/kvfw_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvfw_tests.log" | cut -c1-300 | head -40
  for i in 1 2; do
    bs1 "q0_$i" llama3-8b
    HOTLOOP_DECODE_EARLY=1 bs1 "q0early_$i" llama3-8b
    bs1 "q8_$i" llama3-8b --quant-policy 8
    HOTLOOP_KV_CUDA_FUSED_WRITE=1 bs1 "q8fw_$i" llama3-8b --quant-policy 8
  done
  HOTLOOP_KV_CUDA_EARLY=1 bs1 q8early llama3-8b --quant-policy 8
  bs1 smol_ms8 smollm2-135m --num-scheduler-steps 8
  HOTLOOP_DECODE_EARLY=1 bs1 smol_ms8early smollm2-135m --num-scheduler-steps 8
  exit 0
fi
if [ "$what" = kvprof ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_int8_decode_cuda.py \
    tests/kernels/test_kv_quant_kernels.py tests/api/test_gpu_parity.py -k "cuda or decode or layer or quantized" \
    >"$out/kvprof_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvprof_tests.log" | cut -c1-300 | head -40
  for q in 0 8; do
    timeout 170 python3 "$here/profile_step.py" --out "$out/profile_q$q.json" --quant-policy "$q" --iters 5 \
      --session-len 5120 --max-batch-size 512 --max-prefill-token-num 16896 --cases "1@384,kvbound" \
      >"$out/profile_q$q.log" 2>&1
    echo "profile q$q rc=$?"
    grep -E "^(decode|kvbound|mixed)|^      " "$out/profile_q$q.log" | cut -c1-160
  done
  bash "$here/run_capacity.sh" bs1 "$out/bs1" 150 >/dev/null 2>&1
  grep -ho '"decode_tokens_per_s": [0-9.]*' "$out"/bs1/bs1_q*.json
  exit 0
fi
if [ "$what" = kvsplit ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 230 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_int8_decode_cuda.py \
    tests/api/test_gpu_parity.py -k "graph or replay or sliced or variants or quantized" \
    >"$out/kvsplit_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvsplit_tests.log" | cut -c1-300 | head -40
  timeout 120 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_split.json" --quick --no-prefill \
    --policies 0,8 --decode-shapes 300x4608,160x4608 --splits 1,2,4 --cuda-variants ",vt,vt3" \
    >"$out/sweep_split.log" 2>&1
  echo "split sweep rc=$?"
  grep -E "decode B=" "$out/sweep_split.log" | grep -v "default vs" | cut -c1-200
  exit 0
fi
if [ "$what" = kvsame ]; then  # one GPU; then, in the next call on the same lease, run_capacity.sh kv_int8
  export CUDA_VISIBLE_DEVICES=0
  timeout 110 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_int8_decode_cuda.py \
    tests/api/test_gpu_parity.py -k "(variants and vt3w) or graph or replay or quantized_kv or fused_write" \
    >"$out/kvsame_tests.log" 2>&1  # (at most 110 s, the sweep 90: the fp16 run after them needs about 340)
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvsame_tests.log" | cut -c1-300 | head -30
  timeout 90 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_same.json" --quick --no-prefill \
    --policies 8 --decode-shapes 300x4608,160x4608,128x4096 \
    --splits 1,2 --cuda-variants "vt3w,vtw,probe3w" --cuda-grids heads >"$out/sweep_same.log" 2>&1
  echo "sweep rc=$?"
  grep -E "decode B=" "$out/sweep_same.log" | grep -v "default vs" | cut -c1-200
  bash "$here/run_capacity.sh" kv_fp16 "$out/cap" $((578 - SECONDS))
  exit 0
fi
if [ "$what" = kvsame2 ]; then  # one GPU, the call after kvsame on the same lease
  export CUDA_VISIBLE_DEVICES=0
  bash "$here/run_capacity.sh" kv_int8 "$out/cap" 300
  bash "$here/run_capacity.sh" bs1 "$out/bs1" 120 >/dev/null 2>&1
  for f in "$out"/bs1/bs1_q*.json; do echo "$f $(grep -o '"decode_tokens_per_s": [0-9.]*' "$f")"; done
  exit 0
fi
if [ "$what" = kvwarp ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  git -C "$here/.." log --oneline -1 2>/dev/null || true
  timeout 170 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_int8_decode_cuda.py \
    -k "variants or seq_grid or graph or replay" >"$out/kvwarp_tests.log" 2>&1
  trc=$?
  echo "GPU tests rc=$trc"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/kvwarp_tests.log" | cut -c1-300 | head -30
  timeout 120 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_warp.json" --quick --no-prefill \
    --policies 8 --decode-shapes 300x4608,160x4608,128x4096,16x4096,1x4096 \
    --cuda-variants "vt,vt3,vtw,vt3w,probe3,probe3w" --cuda-grids heads >"$out/sweep_warp.log" 2>&1
  echo "sweep rc=$?"
  grep -E "decode B=" "$out/sweep_warp.log" | grep -v "default vs" | cut -c1-200
  # the KV-bound int8 run, default variant (vt3w at these batches since the twentieth session)
  bash "$here/run_capacity.sh" kv_int8 "$out/cap" $((575 - SECONDS))
  exit 0
fi
if [ "$what" = s27b ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests s27b_tests 200 tests/engine/test_multi_step.py tests/executor
  timeout 200 python3 "$here/short_context_sweep.py" --out "$out/sweep_int8.json" --models llama3-8b \
    --quant-policy 8 --windows 16:48,128:128,256:256,512:128 --reps 3 >"$out/sweep_int8.log" 2>&1
  echo "[sweep int8] rc=$?"
  grep -E "contexts|Error" "$out/sweep_int8.log" | tail -6
  for r in 1 2; do
    bs1 "8b_fp16_$r" llama3-8b
    bs1 "8b_int8_$r" llama3-8b --quant-policy 8
    [ "$r" = 1 ] && HOTLOOP_ONE_ROW_ROPE_QUANT=1 bs1 "8b_int8_ropequant_$r" llama3-8b --quant-policy 8
    [ "$r" = 1 ] && HOTLOOP_DECODE_SHORT_GRAPHS=0 bs1 "8b_int8_noshort_$r" llama3-8b --quant-policy 8
  done
  exit 0
fi
if [ "$what" = lg1 ]; then  # one GPU, in turn; needs .ab/old (the tree before, carried)
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests lg1_tests 170 tests/api/test_gpu_parity.py tests/executor tests/layers tests/engine \
    tests/kernels/test_greedy_argmax.py
  b256() {  # name tree: the batch-256 decode step (run_gpu.py's llama3_b256_1k flags) with hotloop from tree
    (cd "$2" && timeout 150 python3 -m hotloop.bench.offline latency --model llama3-8b --load-format dummy \
      --dtype bfloat16 --batch-size 256 --input-len 1024 --output-len 96 --num-iters 1 --session-len 2048 \
      --max-batch-size 256 --max-prefill-token-num 16384 --output-json "$out/b256_$1.json" >"$out/b256_$1.log" 2>&1)
    echo "[b256 $1] rc=$? $(grep -o '"decode_ms_p50": [0-9.]*\|"decode_ms_mean": [0-9.]*' "$out/b256_$1.json" 2>/dev/null | tr '\n' ' ')"
  }
  b256 new_1 "$PWD"
  b256 old_1 "$PWD/.ab/old"
  b256 new_2 "$PWD"
  b256 old_2 "$PWD/.ab/old"
  timeout 100 python3 "$here/profile_step.py" --out "$out/profile_b256.json" --cases "decode 256@1k" \
    >"$out/profile_b256.log" 2>&1
  echo "profile_step rc=$?"
  grep -E "floor" "$out/profile_b256.log"
  exit 0
fi
if [ "$what" = tk1 ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  b256() {  # name: the batch-256 decode step (run_gpu.py's llama3_b256_1k flags)
    timeout 150 python3 -m hotloop.bench.offline latency --model llama3-8b --load-format dummy \
      --dtype bfloat16 --batch-size 256 --input-len 1024 --output-len 96 --num-iters 1 --session-len 2048 \
      --max-batch-size 256 --max-prefill-token-num 16384 --output-json "$out/b256_$1.json" >"$out/b256_$1.log" 2>&1
    echo "[b256 $1] rc=$? $(grep -o '"decode_ms_p50": [0-9.]*\|"decode_ms_mean": [0-9.]*' "$out/b256_$1.json" 2>/dev/null | tr '\n' ' ')"
  }
  export PYTORCH_TUNABLEOP_FILENAME=$out/tunableop%d.csv
  timeout 120 python3 "$here/dense_gemm.py" "$out/dg_plain.json" --m 256 >"$out/dg_plain.log" 2>&1
  echo "dense_gemm plain rc=$?"; grep "M= 256" "$out/dg_plain.log"
  PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=1 timeout 200 python3 "$here/dense_gemm.py" "$out/dg_tuned.json" \
    --m 256 >"$out/dg_tuned.log" 2>&1
  echo "dense_gemm TunableOp rc=$?"; grep -E "M= 256|tunableop" "$out/dg_tuned.log" | cut -c1-300
  ls "$out" | grep -i tunable
  for i in 1 2; do
    PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=0 b256 "tuned_$i"
    b256 "plain_$i"
  done
  exit 0
fi
if [ "$what" = s28d ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  export HOTLOOP_TUNING_CACHE=0  # each run tunes its W4A16 launches with its own setting
  for i in 1 2; do
    bs1 "awq_early_$i" llama3-8b --model-format awq
    HOTLOOP_W4A16_EARLY=0 bs1 "awq_wait_$i" llama3-8b --model-format awq
  done
  unset HOTLOOP_TUNING_CACHE
  gpu_tests s28d_tests 240 tests/kernels
  exit 0
fi
if [ "$what" = s28c ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests s28c_tests 240 tests/kernels/test_pdl.py tests/api/test_gpu_parity.py tests/executor tests/engine
  timeout 150 python3 "$here/run_gpu.py" --out "$out/b256_new" --skip-hf --only llama3_b256_1k >"$out/b256_new.txt" 2>&1
  echo "run_gpu (graphs above 8 rows without PDL) rc=$?"
  grep -E "b256" "$out/b256_new.txt" | head -3
  HOTLOOP_PDL_MAX_DECODE_BATCH=100000 timeout 150 python3 "$here/run_gpu.py" --out "$out/b256_old" --skip-hf \
    --only llama3_b256_1k >"$out/b256_old.txt" 2>&1
  echo "run_gpu (every graph with PDL) rc=$?"
  grep -E "b256" "$out/b256_old.txt" | head -3
  profile_ab HOTLOOP_PDL mixed_pdl "mixed 16 decodes@1k + 1x1024" 1 0
  exit 0
fi
if [ "$what" = s28b ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  bs1 awq_early llama3-8b --model-format awq
  grep -h -o "tuned.*cuda[^,]*" "$out/bs1_awq_early.log" | head -4
  profile_ab HOTLOOP_PDL b256_pdl "decode 256,decode 16@" 1 0
  timeout 200 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_b256_1k >"$out/table.txt" 2>&1
  echo "run_gpu rc=$?"
  tail -6 "$out/table.txt"
  bs1 8b_fp16_k8 llama3-8b --num-scheduler-steps 8
  bs1 8b_int8_k8 llama3-8b --num-scheduler-steps 8 --quant-policy 8
  exit 0
fi
if [ "$what" = s28a ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests s28a_tests 200 tests/kernels/test_w4a16_cuda.py tests/engine/test_multi_step.py \
    tests/lite/test_auto_awq.py -k "gpu or short_context"
  cubin=$(ls -t "${HOTLOOP_CACHE:-$HOME/.cache/hotloop}"/cuda/*.cubin 2>/dev/null | head -1)
  for f in w4a16_gemv_bf16_nl4_r32_e8 w4a16_gemv_bf16_nl4_r32; do
    /usr/local/cuda/bin/cuobjdump -sass -fun "$f" "$cubin" 2>/dev/null | grep -n -E "LDG|ACQ|DEPBAR|CCTL|griddep|PREEXIT|BAR.SYNC|WAIT" \
      | head -24 >"$out/sass_$f.txt"
    echo "[sass $f] $(wc -l <"$out/sass_$f.txt") lines"
  done
  timeout 200 python3 "$here/w4a16_read_probe.py" "$out/read_probe.json" >"$out/read_probe.log" 2>&1
  echo "[read_probe] rc=$?"
  grep -E "gemv_nl|chain|best us" "$out/read_probe.log" | cut -c1-200
  for i in 1 2; do
    bs1 "awq_$i" llama3-8b --model-format awq
    HOTLOOP_W4A16_EARLY=1 bs1 "awq_early_$i" llama3-8b --model-format awq
  done
  grep -h -o "w4a16.*cuda[^,]*" "$out"/bs1_awq_1.log | head -8
  exit 0
fi
if [ "$what" = s27c ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests s27c_tests 120 tests/engine/test_multi_step.py -k short_context
  timeout 240 python3 "$here/dense_gemv.py" "$out/dense_gemv_lm_head.json" --sections lm_head >"$out/dense_gemv_lm_head.log" 2>&1
  echo "[dense_gemv lm_head] rc=$?"
  grep -E "lm_head" "$out/dense_gemv_lm_head.log"
  for r in 1 2; do
    bs1 "smol_$r" smollm2-135m
    timeout 150 python3 "$here/lm_head_ab.py" "$out/dense_gemv_lm_head.json" smollm2-135m -- --model smollm2-135m \
      --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 512 --num-iters 3 \
      --session-len 2048 --max-batch-size 8 --output-json "$out/bs1_smol_head_$r.json" >"$out/bs1_smol_head_$r.log" 2>&1
    echo "[bs1 smol_head_$r] rc=$? $(head -1 "$out/bs1_smol_head_$r.log" | cut -c1-120) $(grep -o '"decode_tokens_per_s": [0-9.]*' "$out/bs1_smol_head_$r.json" 2>/dev/null)"
  done
  exit 0
fi
if [ "$what" = s27d ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests s27d_tests 150 tests/kernels/test_dense_gemv.py tests/models/test_one_row.py
  echo '{"models": {"smollm2-135m": {"lm_head": {"best": {"block_n": 4, "block_k": 1024, "num_warps": 4, "us": 26.4}}}}}' \
    >"$out/old_head.json"
  for r in 1 2; do
    bs1 "smol_k8_$r" smollm2-135m --num-scheduler-steps 8
    timeout 150 python3 "$here/lm_head_ab.py" "$out/old_head.json" smollm2-135m -- --model smollm2-135m \
      --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 512 --num-iters 3 \
      --session-len 2048 --max-batch-size 8 --num-scheduler-steps 8 --output-json "$out/bs1_smol_oldhead_$r.json" \
      >"$out/bs1_smol_oldhead_$r.log" 2>&1
    echo "[bs1 smol_oldhead_$r] rc=$? $(grep -o '"decode_tokens_per_s": [0-9.]*' "$out/bs1_smol_oldhead_$r.json" 2>/dev/null)"
  done
  bs1 8b_fp16_k8 llama3-8b --num-scheduler-steps 8
  bs1 8b_int8_k8 llama3-8b --num-scheduler-steps 8 --quant-policy 8
  exit 0
fi
if [ "$what" = s27e ]; then  # one GPU
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 "$here/dense_gemv.py" "$out/dense_gemv_proj_smol.json" --sections proj --models smollm2-135m \
    --short-k-only >"$out/dense_gemv_proj_smol.log" 2>&1
  echo "[dense_gemv proj] rc=$?"
  grep -E "smollm2" "$out/dense_gemv_proj_smol.log"
  exit 0
fi
if [ "$what" = s26b ]; then  # one GPU
  export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 "$here/grid_sync_probe.py" --out "$out/grid_sync.json" --n 576,1536 --block-n 16,4 \
    >"$out/grid_sync.log" 2>&1
  echo "[grid_sync] rc=$?"
  cat "$out/grid_sync.log" | tail -30
  gpu_tests kernels 420 tests/kernels
  exit 0
fi
if [ "$what" = s26c ]; then  # one GPU
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests rest 560 tests --ignore=tests/cli --ignore=tests/kernels
  exit 0
fi
if [ "$what" = mw1 ]; then  # one GPU: issue 6's batch-1 row with the merge write (decode_merge_write.py)
  export CUDA_VISIBLE_DEVICES=0
  bs1 kv16_1 llama3-8b
  HOTLOOP_KV_MERGE_WRITE=0 bs1 kv8_1 llama3-8b --quant-policy 8
  HOTLOOP_KV_MERGE_WRITE=1 bs1 kv8mw_1 llama3-8b --quant-policy 8
  timeout 170 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_decode_merge_write.py \
    tests/kernels/test_kv_int8_decode_cuda.py "tests/api/test_gpu_parity.py::test_int8_merge_write_keeps_tokens" \
    "tests/api/test_gpu_parity.py::test_int8_fused_write_keeps_tokens" >"$out/mw_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/mw_tests.log" | cut -c1-300 | head -40
  HOTLOOP_KV_MERGE_WRITE=1 bs1 kv8mw_2 llama3-8b --quant-policy 8
  HOTLOOP_KV_MERGE_WRITE=0 bs1 kv8_2 llama3-8b --quant-policy 8
  bs1 kv16_2 llama3-8b
  exit 0
fi
if [ "$what" = s32a ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  hostprof llama3-8b 8b_k1
  hostprof llama3-8b 8b_k8 --num-scheduler-steps 8
  for f in 8b_k1 8b_k8; do python3 -c "import json,sys; t=open(sys.argv[1]).read(); d=json.JSONDecoder().raw_decode(t)[0]; [print(k, v) for k, v in d.get('phases', {}).items()]" "$out/hostprof_$f.txt"; done
  gpu_tests s32_tests 200 -n 1 tests/engine/test_multi_step.py tests/kernels/test_decode_merge_write.py \
    tests/api/test_gpu_parity.py -k "int8 or merge or multi"
  timeout 200 python3 "$here/w4a16_read_probe.py" "$out/read_probe.json" >"$out/read_probe.log" 2>&1
  echo "read probe rc=$?"
  tail -30 "$out/read_probe.log"
  exit 0
fi
if [ "$what" = s32b ]; then  # one GPU, in turn: the full-batch rounds (default) against one step a launch
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_b256_1k,llama3_b256_1k_k1 \
    >"$out/table.txt" 2>&1
  echo "run_gpu rc=$?"
  grep -E "ceilings|decode step|host ms|one step" "$out/table.txt" | cut -c1-200
  offline b384_full --max-batch-size 384
  offline b384_k1 --max-batch-size 384 --full-batch-steps 1
  exit 0
fi
if [ "$what" = s32c ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests s32c_tests 280 -n 4 tests/api/test_gpu_parity.py tests/engine tests/executor tests/api/test_json_mode.py
  for tag in full k1; do
    extra=()
    [ "$tag" = k1 ] && extra=(--full-batch-steps 1)
    timeout 100 python3 -m hotloop.bench.offline throughput --model smollm2-135m --load-format dummy --dtype bfloat16 \
      --num-prompts 1024 --input-len 1024 --output-len 256 --session-len 2048 --max-batch-size 256 \
      --max-prefill-token-num 16384 --output-json "$out/smol_b256_$tag.json" "${extra[@]}" >"$out/smol_b256_$tag.log" 2>&1
    echo "[smol b256 $tag] rc=$? $(grep -o '"output_tokens_per_s": [0-9.]*\|"steps": [0-9]*' "$out/smol_b256_$tag.json" 2>/dev/null | tr '\n' ' ')"
  done
  hostprof llama3-8b 8b_full
  python3 -c "import json,sys; t=open(sys.argv[1]).read(); d=json.JSONDecoder().raw_decode(t)[0]; ph=d.pop('phases', {}); print({k: v for k, v in d.items()}); [print(k, v) for k, v in ph.items()]" "$out/hostprof_8b_full.txt"
  exit 0
fi
if [ "$what" = s32d ]; then  # one GPU: JSON mode in the decode graphs (needs xgrammar among the wheels), multi-step
  export CUDA_VISIBLE_DEVICES=0
  python3 -c "import xgrammar; print('xgrammar', xgrammar.__version__)"
  gpu_tests s32d_tests 240 -n 4 tests/api/test_json_mode.py tests/engine/test_multi_step.py
  exit 0
fi
if [ "$what" = s33a ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 -m pytest -m gpu -q -s -rfE -p no:cacheprovider tests/kernels/test_w4a16_gemv_tc.py \
    >"$out/tc_tests.log" 2>&1
  echo "tc tests rc=$?"
  grep -E "rel max err|^(E  |FAILED|ERROR)|passed|failed" "$out/tc_tests.log" | cut -c1-200 | head -90
  timeout 170 python3 "$here/w4a16_read_probe.py" "$out/read_probe.json" >"$out/read_probe.log" 2>&1
  echo "read probe rc=$?"
  grep -E '"tc_|chain|best us|stream_u4_b4"' "$out/read_probe.log" | cut -c1-220
  HOTLOOP_W4A16_TC=1 bs1 awq_tc llama3-8b --model-format awq
  HOTLOOP_W4A16_TC=0 bs1 awq_notc llama3-8b --model-format awq
  exit 0
fi
if [ "$what" = s33c ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_w4a16_gemv_tc.py \
    tests/kernels/test_w4a16_gemm.py tests/kernels/test_w4a16_cuda.py tests/lite/test_auto_awq.py >"$out/w4_tests.log" 2>&1
  echo "W4A16 GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/w4_tests.log" | cut -c1-200 | head -30
  what=ncu
fi
if [ "$what" = s35a ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 -m pytest -m gpu -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_dense_tune.py \
    >"$out/dense_tests.log" 2>&1
  echo "dense-tune GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/dense_tests.log" | cut -c1-200 | head -12
  for i in 1 2; do
    for t in 0 1; do
      HOTLOOP_DENSE_TUNE=$t timeout 200 python3 "$here/run_gpu.py" --out "$out/b256_t${t}_$i" --skip-hf \
        --only llama3_b256_1k 2>&1 | grep -E "b256|4,229" | sed "s/^/[HOTLOOP_DENSE_TUNE=$t] /"
      grep -h "dense GEMMs" "$out/b256_t${t}_$i/"*.log 2>/dev/null | tail -1
    done
  done
  profile_ab HOTLOOP_DENSE_TUNE dense "decode 256@,decode 16@" 0 1
  timeout 120 python3 "$here/cublaslt_sweep.py" --m 256,16 --out "$out/sweep.json" 2>&1 | tail -12
  exit 0
fi
if [ "$what" = s35b ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  serve 0 default
  HOTLOOP_DENSE_TUNE=1 serve 0 dense
  for i in 1 2; do
    bs1 awq_silu$i llama3-8b --model-format awq
    HOTLOOP_W4A16_FUSED_SILU=0 bs1 awq_two$i llama3-8b --model-format awq
  done
  exit 0
fi
if [ "$what" = s35c ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -m gpu -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_attention_kernels.py \
    >"$out/attn_tests.log" 2>&1
  echo "attention GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/attn_tests.log" | cut -c1-200 | head -12
  for i in 1 2; do
    for g in seq heads; do
      HOTLOOP_DECODE_GRID=$g timeout 90 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_${g}_$i.json" \
        --policies 0 --no-prefill --decode-shapes 256x1024,128x4096 --decode-configs "64,4,3;64,8,3;32,4,4;128,8,2" 2>&1 \
        | grep -E "decode B=" | cut -c1-180 | sed "s/^/[HOTLOOP_DECODE_GRID=$g] /"
    done
  done
  for i in 1 2; do
    for g in seq heads; do
      HOTLOOP_DECODE_GRID=$g timeout 200 python3 "$here/run_gpu.py" --out "$out/b256_${g}_$i" --skip-hf \
        --only llama3_b256_1k 2>&1 | grep -E "b256|4,229" | sed "s/^/[HOTLOOP_DECODE_GRID=$g] /"
    done
  done
  exit 0
fi
if [ "$what" = s35d ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 180 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_w4a16_cuda.py \
    tests/models/test_llama_mlp.py >"$out/norm_tests.log" 2>&1
  echo "W4A16 kernel and fold GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/norm_tests.log" | cut -c1-200 | head -20
  for i in 1 2; do
    bs1 awq$i llama3-8b --model-format awq
    HOTLOOP_W4A16_FUSED_NORM=1 bs1 awq_norm$i llama3-8b --model-format awq
  done
  exit 0
fi
if [ "$what" = s35e ]; then  # one GPU, in turn; the timed rows first (a call cut short keeps them)
  export CUDA_VISIBLE_DEVICES=0
  row() {  # tag env...: issue 4's batch-256 row
    local tag=$1
    shift
    env "$@" timeout 170 python3 "$here/run_gpu.py" --out "$out/b256_$tag" --skip-hf --only llama3_b256_1k 2>&1 \
      | grep -E "b256|4,229" | sed "s/^/[$tag] /"
  }
  row default HOTLOOP_DECODE_GRID=seq
  row heads HOTLOOP_DECODE_GRID=heads
  row heads_tune HOTLOOP_DECODE_GRID=heads HOTLOOP_DENSE_TUNE=1
  row default2 HOTLOOP_DECODE_GRID=seq
  bs1 awq llama3-8b --model-format awq
  HOTLOOP_W4A16_FUSED_NORM=1 bs1 awq_norm llama3-8b --model-format awq
  timeout 150 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_attention_kernels.py \
    tests/kernels/test_dense_tune.py tests/kernels/test_w4a16_cuda.py tests/models/test_llama_mlp.py \
    >"$out/tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/tests.log" | cut -c1-200 | head -20
  exit 0
fi
if [ "$what" = s34c ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  for i in 1 2; do
    for lt in 0 1; do
      TORCH_BLAS_PREFER_CUBLASLT=$lt timeout 200 python3 "$here/run_gpu.py" --out "$out/b256_lt${lt}_$i" --skip-hf \
        --only llama3_b256_1k 2>&1 | grep -E "b256" | sed "s/^/[TORCH_BLAS_PREFER_CUBLASLT=$lt] /"
    done
  done
  for lt in 0 1; do
    TORCH_BLAS_PREFER_CUBLASLT=$lt timeout 150 python3 "$here/profile_step.py" --out "$out/profile_lt$lt.json" \
      --cases "decode 256@,decode 16@,16 decodes@1k + 1x1024" >"$out/profile_lt$lt.log" 2>&1
    echo "profile_step TORCH_BLAS_PREFER_CUBLASLT=$lt rc=$?"
    grep -E "floor|nvjet|gemm|Gemm|splitK" "$out/profile_lt$lt.log" | head -24
  done
  exit 0
fi
if [ "$what" = s34d ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_w4a16_cuda.py \
    tests/models/test_llama_mlp.py >"$out/silu_tests.log" 2>&1
  echo "W4A16 kernel and MLP GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/silu_tests.log" | cut -c1-200 | head -20
  for i in 1 2; do
    bs1 awq$i llama3-8b --model-format awq
    HOTLOOP_W4A16_FUSED_SILU=1 bs1 awq_silu$i llama3-8b --model-format awq
  done
  exit 0
fi
if [ "$what" = s34b ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_w4a16_cuda.py \
    tests/kernels/test_w4a16_gemm.py >"$out/w4_tests.log" 2>&1
  echo "W4A16 GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/w4_tests.log" | cut -c1-200 | head -20
  # each form is tuned in its first run: the tuner's stored one-row key holds the early form
  for i in 1 2; do
    bs1 awq_ld$i llama3-8b --model-format awq
    HOTLOOP_W4A16_EARLY=all bs1 awq_all$i llama3-8b --model-format awq
  done
  exit 0
fi
if [ "$what" = s34a ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  serve 0 c8192
  serve 0 c256 --max-prefill-token-num 256
  serve 0 c384 --max-prefill-token-num 384
  serve 0 c256j --max-prefill-token-num 256 --jit-schedule
  timeout 150 python3 "$here/profile_step.py" --out "$out/profile.json" --cases "16 decodes,decode 16@" \
    >"$out/profile.log" 2>&1
  echo "profile_step rc=$?"
  grep -E "floor" "$out/profile.log"
  exit 0
fi
if [ "$what" = s33i ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  for i in 1 2; do
    HOTLOOP_W4A16_EARLY=1 bs1 awq_early$i llama3-8b --model-format awq
    HOTLOOP_W4A16_EARLY=ld bs1 awq_early_ld$i llama3-8b --model-format awq
  done
  timeout 90 python3 -m pytest -m gpu -n 4 -q -s -rfE -p no:cacheprovider tests/kernels/test_w4a16_gemv_tc.py \
    tests/kernels/test_w4a16_cuda.py >"$out/tc_tests.log" 2>&1
  echo "tc tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed|tuner, float32" "$out/tc_tests.log" | cut -c1-200 | head -20
  HOTLOOP_CACHE=$out/cache_tc HOTLOOP_W4A16_TC=1 bs1 awq_tc llama3-8b --model-format awq
  HOTLOOP_CACHE=$out/cache_tc HOTLOOP_W4A16_TC=1 HOTLOOP_W4A16_EARLY=ld bs1 awq_tc_ld llama3-8b --model-format awq
  exit 0
fi
if [ "$what" = s32e ]; then  # one GPU: the tests pinned to one step a launch, the multi-step tests, the batch-256 row
  export CUDA_VISIBLE_DEVICES=0
  gpu_tests s32e_tests 170 -n 4 tests/models/test_one_row.py tests/engine/test_multi_step.py \
    tests/api/test_gpu_parity.py -k "one_row or multi_step or short_context or merge_write"
  timeout 120 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf --only llama3_b256_1k >"$out/table.txt" 2>&1
  echo "run_gpu rc=$?"
  grep -E "ceilings|decode step|host ms" "$out/table.txt" | cut -c1-200
  exit 0
fi
if [ "$what" = mw1k8 ]; then  # one GPU: mw1's three batch-1 runs with 8 steps a launch, alternating twice
  export CUDA_VISIBLE_DEVICES=0
  for local_i in 1 2; do
    bs1 "k8_kv16_$local_i" llama3-8b --num-scheduler-steps 8
    HOTLOOP_KV_MERGE_WRITE=0 bs1 "k8_kv8_$local_i" llama3-8b --num-scheduler-steps 8 --quant-policy 8
    HOTLOOP_KV_MERGE_WRITE=1 bs1 "k8_kv8mw_$local_i" llama3-8b --num-scheduler-steps 8 --quant-policy 8
  done
  exit 0
fi
if [ "$what" = smolattn ]; then  # one GPU
  export CUDA_VISIBLE_DEVICES=0
  timeout 500 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_smol.json" --no-prefill --policies 0 \
    --heads 9,3,64 --decode-shapes 1x128,1x384,1x640 --splits 1,2,4,8,16 --cross --fuse-merge both \
    --decode-configs "32,4,2;64,4,2;128,4,2;128,8,2;256,8,2;256,8,3;512,8,2" >"$out/sweep_smol.log" 2>&1
  echo "sweep rc=$?"
  for c in 128 384 640; do  # the twelve fastest of each context, then the default ((64, 4, 3), 16 splits, merge launched)
    grep -E "decode B=1 ctx=$c " "$out/sweep_smol.log" | grep -v "default vs" | sort -t: -k2 -n | cut -c1-160 | head -12
    grep -E "decode B=1 ctx=$c q0 \(64, 4, 3\) splits 16: " "$out/sweep_smol.log" | cut -c1-160
  done
  exit 0
fi
if [ "$what" = kvpair ]; then  # two GPUs, side by side
  git -C "$here/.." log --oneline -1 2>/dev/null || true
  CUDA_VISIBLE_DEVICES=0 bash "$here/run_capacity.sh" kv_fp16 "$out/cap" 560 >"$out/lane0.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=$g1 bash "$here/run_capacity.sh" kv_int8 "$out/cap" 560 >"$out/lane1.txt" 2>&1 &
  wait
  cat "$out/lane0.txt" "$out/lane1.txt"
  exit 0
fi
if [ "$what" = fresh2 ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_quant_kernels.py \
    tests/kernels/test_attention_kernels.py tests/kernels/test_launch_replay.py \
    "tests/api/test_gpu_parity.py::test_quantized_kv_graphs_equal_eager" >"$out/fresh_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/fresh_tests.log" | cut -c1-300 | head -40
  timeout 100 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_prefill.json" --quick --no-decode \
    --policies 8,4 --prefill-lens 1024,4096 >"$out/sweep_prefill.log" 2>&1
  echo "prefill sweep rc=$?"
  grep -E "prefill T=" "$out/sweep_prefill.log" | cut -c1-200
  exit 0
fi
if [ "$what" = freshab ]; then  # two GPUs: the fresh prefill's tests and kernel times; the KV-bound int8 run without it
  (
    export CUDA_VISIBLE_DEVICES=$g1
    HOTLOOP_KV_FRESH_PREFILL=0 bash "$here/run_capacity.sh" kv_int8 "$out/cap_nofresh" 480
  ) >"$out/lane1.txt" 2>&1 &
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m pytest -m gpu -n 8 -q -rfE -p no:cacheprovider tests/kernels/test_kv_quant_kernels.py \
    tests/kernels/test_launch_replay.py "tests/api/test_gpu_parity.py::test_quantized_kv_graphs_equal_eager" \
    -k "fresh or prefill or write or layer or replay or quantized" >"$out/fresh_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/fresh_tests.log" | cut -c1-300 | head -40
  timeout 100 python3 "$here/kv_attention_sweep.py" --out "$out/sweep_prefill.json" --quick --no-decode \
    --policies 0,8,4 --prefill-lens 1024,4096 >"$out/sweep_prefill.log" 2>&1
  echo "prefill sweep rc=$?"
  grep -E "prefill T=" "$out/sweep_prefill.log" | cut -c1-200
  wait
  cat "$out/lane1.txt"
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
if [ "$what" = cuda3 ]; then  # one GPU, in turn
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -n 4 -q -rfE -p no:cacheprovider tests/kernels/test_w4a16_cuda.py \
    tests/kernels/test_w4a16_gemm.py >"$out/cuda_tests.log" 2>&1
  echo "GPU tests rc=$?"
  grep -E "^(E  |FAILED|ERROR)|passed|failed" "$out/cuda_tests.log" | cut -c1-300 | head -40
  for i in 1 2; do
    bs1 "awq_$i" llama3-8b --model-format awq
    HOTLOOP_CUDA_KERNELS=0 bs1 "awq_triton_$i" llama3-8b --model-format awq
  done
  rm -f "$out"/*.json
  exit 0
fi
if [ "$what" = msrows ]; then
  (
    export CUDA_VISIBLE_DEVICES=$g1
    hostprof llama3-8b 8b_k1
    hostprof llama3-8b 8b_k8 --num-scheduler-steps 8
    offline b384_k1 --max-batch-size 384 --full-batch-steps 1  # one step a launch throughout
  ) >"$out/lane1.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=0 timeout 540 python3 "$here/run_gpu.py" --out "$out/table" --skip-hf \
    --only llama3_b256_1k,llama3_b256_1k_k1,llama3_bs1,llama3_bs1_ms8,smollm2_bs1,smollm2_bs1_ms8,llama3_offline_k1 \
    >"$out/table.txt" 2>&1
  echo "run_gpu rc=$?"
  wait
  cat "$out/table.txt" "$out/lane1.txt"
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
  tests | rows | w4a16 | kv | serve | chunks | replay | settle | diag | next | split | confirm | splits2 | final | last | merge | plan | serve1 | tiles | skinny | hostprof | batch | steady | multistep) ;;
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
