"""Vision-language serving speed: LLaVA-1.5-7B shape (random weights), N concurrent single-image chat
requests, hotloop beside transformers' ``generate`` on the same requests.

    PYTHONPATH=$PWD python3 benchmarks/vl_speed.py --out $OUT/vl          # 64 requests x 128 tokens, GPU
    PYTHONPATH=$PWD python3 benchmarks/vl_speed.py --out $OUT/vl --quick  # 8 requests x 16 tokens
    PYTHONPATH=$PWD python3 benchmarks/vl_speed.py --tiny --out /tmp/vl   # CPU smoke test, tiny LLaVA

Workload: each request is one user turn ``<image>\\n<question>`` through the model's chat template
with one 336x336 image of random pixels (576 image tokens, ~590 prompt tokens), greedy, a fixed
number of output tokens (EOS ignored). All requests arrive at once.

- hotloop (``--engine hotloop``): the ``llava-1.5-7b`` preset with ``load_format='dummy'``, served by
  ``AsyncEngine`` as the server does: per request, the chat template and tokenizer, then image
  loading/preprocessing and placeholder expansion off the event loop, then a streamed request.
  TTFT = first streamed token - the request's arrival (preprocessing included). One warm-up round
  of a few image requests runs first.
- transformers (``--engine hf``): ``LlavaForConditionalGeneration`` built from the same config.json
  on the device with random weights, ``LlavaProcessor`` on the same texts and images, and one padded
  ``generate`` per ``--hf-batch-size`` requests (all of them by default). TTFT of a request = the
  time its batch's first token reached a streamer, from the start (processing included).
- Output tokens/s = all output tokens / the time from the first arrival to the last token.

Each engine runs in its own process (the engine takes most of the GPU's memory for KV blocks); the
parent (this script without ``--engine``) runs both, writes ``vl_speed.json`` (with each run's JSON
and log beside it) under ``--out`` and prints a table last. ``--tiny`` writes a tiny LLaVA config
(CLIP 336/14 with 2 narrow layers, a 2-layer 64-wide Llama, the preset's tokenizer) and runs both
engines on the CPU in float32 with the same request and token counts.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from anywhere without installing hotloop
    sys.path.insert(1, str(ROOT))

PRESET = "llava-1.5-7b"
QUESTIONS = (
    "What is in this image?",
    "Describe the picture in detail.",
    "What colours dominate this photo?",
    "Is there any text in the image? Read it out.",
    "Write a short caption for this image.",
    "How many objects can you see?",
    "What might have happened just before this picture was taken?",
    "Describe the texture of the image.",
)
# Ceilings measured on the H200 (shared GPU.md): device-to-device copy and a bf16 matmul.
H200_COPY_BPS = 4229e9
H200_BF16_FLOPS = 783e12
ENV = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}


# -- the workload (the same in both processes) -----------------------------------------------------------
def make_requests(n: int, image_size: int, seed: int) -> list[tuple[str, Any]]:
    """``n`` (question, RGB ``PIL.Image`` of random pixels) pairs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [
        (
            QUESTIONS[i % len(QUESTIONS)],
            Image.fromarray(rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8), "RGB"),
        )
        for i in range(n)
    ]


def chat_messages(question: str, placeholder: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{placeholder}\n{question}"}]


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(ttfts: list[float], num_tokens: int, total_s: float) -> dict[str, Any]:
    return {
        "ttft_ms_p50": 1e3 * percentile(ttfts, 50),
        "ttft_ms_p99": 1e3 * percentile(ttfts, 99),
        "ttft_ms_mean": 1e3 * statistics.fmean(ttfts) if ttfts else float("nan"),
        "ttft_ms_max": 1e3 * max(ttfts) if ttfts else float("nan"),
        "output_tokens": num_tokens,
        "total_s": total_s,
        "output_tokens_per_s": num_tokens / total_s if total_s > 0 else float("nan"),
    }


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# -- hotloop -------------------------------------------------------------------------------------------------
def run_hotloop(args: argparse.Namespace, device: str, dtype: str) -> dict[str, Any]:
    from hotloop import pipeline
    from hotloop.config import EngineConfig
    from hotloop.engine.async_engine import AsyncEngine
    from hotloop.messages import GenerationConfig

    t_build = time.perf_counter()
    cfg = EngineConfig(
        device=device,
        dtype=dtype,
        load_format="dummy",
        session_len=args.session_len,
        max_batch_size=args.max_batch_size,
        max_prefill_token_num=args.max_prefill_token_num,
        cache_max_entry_count=(
            args.cache_max_entry_count if args.cache_max_entry_count <= 1 else int(args.cache_max_entry_count)
        ),
        eager_mode=args.eager,
    )
    pipe = pipeline(args.model_dir, cfg)
    vl = pipe.vl
    if vl is None:
        raise SystemExit(f"{args.model_dir} is not a vision-language model")
    build_s = time.perf_counter() - t_build
    requests = make_requests(args.num_requests, args.image_size, args.seed)
    warm = make_requests(min(args.warmup_requests, args.num_requests), args.image_size, args.seed + 1)

    async def one(engine: AsyncEngine, rid: str, question: str, image: Any, max_new: int) -> dict[str, Any]:
        arrival = time.perf_counter()
        ids = pipe.encode(chat_messages(question, vl.placeholder))
        ids, mm = await asyncio.to_thread(vl.expand, ids, [image])  # as the server does
        stream = engine.add_request(rid, ids, GenerationConfig(max_new_tokens=max_new, ignore_eos=True), mm)
        first: float | None = None
        n = 0
        async for out in stream:
            if out.new_token_ids and first is None:
                first = time.perf_counter()
            n += len(out.new_token_ids)
        done = time.perf_counter()
        return {
            "prompt_tokens": len(ids),
            "image_tokens": sum(m.length for m in mm),
            "output_tokens": n,
            "arrival": arrival,
            "ttft_s": (first if first is not None else done) - arrival,
            "e2e_s": done - arrival,
            "finish": done,
        }

    async def serve(engine: AsyncEngine, reqs: list[tuple[str, Any]], max_new: int, tag: str) -> Any:
        t0 = time.perf_counter()
        outs = await asyncio.gather(
            *(one(engine, f"{tag}-{i}", q, img, max_new) for i, (q, img) in enumerate(reqs))
        )
        return outs, time.perf_counter() - t0

    async def main() -> tuple[list[dict[str, Any]], float, float, int]:
        engine = AsyncEngine(pipe.engine)
        try:
            t = time.perf_counter()
            if warm:  # compiles and warms the image and prefill paths
                await serve(engine, warm, min(4, args.output_len), "warmup")
            warm_s = time.perf_counter() - t
            steps = getattr(pipe.engine, "num_steps", 0)
            outs, total = await serve(engine, requests, args.output_len, "req")
        finally:
            engine.shutdown()
        return outs, total, warm_s, steps

    outs, total_s, warm_s, steps0 = asyncio.run(main())
    tokens = sum(o["output_tokens"] for o in outs)
    if any(o["output_tokens"] != args.output_len for o in outs):
        raise SystemExit(f"requests ended early: {[o['output_tokens'] for o in outs]}")
    res = summary([o["ttft_s"] for o in outs], tokens, total_s)
    tpot = [(o["e2e_s"] - o["ttft_s"]) / max(o["output_tokens"] - 1, 1) for o in outs]
    res.update(
        engine="hotloop",
        build_s=build_s,
        warmup_s=warm_s,
        tpot_ms_p50=1e3 * percentile(tpot, 50),
        e2e_ms_p50=1e3 * percentile([o["e2e_s"] for o in outs], 50),
        prompt_tokens=[o["prompt_tokens"] for o in outs],
        image_tokens=outs[0]["image_tokens"],
        engine_steps=getattr(pipe.engine, "num_steps", 0) - steps0,
        preemptions=getattr(getattr(pipe.engine, "scheduler", None), "num_preemptions", None),
        num_kv_blocks=pipe.engine.num_total_blocks,
        ttft_ms=[1e3 * o["ttft_s"] for o in outs],
    )
    pipe.close()
    return res


# -- transformers -------------------------------------------------------------------------------------------
def run_hf(args: argparse.Namespace, device: str, dtype_name: str) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoProcessor, LlavaForConditionalGeneration
    from transformers.generation.streamers import BaseStreamer

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    t_build = time.perf_counter()
    config = AutoConfig.from_pretrained(args.model_dir)
    torch.manual_seed(0)
    with torch.device(device):  # weights are created (and initialised) on the device, in dtype
        model = LlavaForConditionalGeneration._from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    processor = AutoProcessor.from_pretrained(args.model_dir)
    processor.tokenizer.padding_side = "left"
    tok = processor.tokenizer
    placeholder = getattr(processor, "image_token", "<image>")
    sync(device)
    build_s = time.perf_counter() - t_build

    class Stamps(BaseStreamer):
        """Times of ``generate``'s streamer calls: the prompt first, then one per new token."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    def generate(reqs: list[tuple[str, Any]], max_new: int, t0: float) -> tuple[list[float], int, int]:
        """-> (TTFT of each request from t0, the first request's prompt length, the padded length)."""
        texts = [
            tok.apply_chat_template(chat_messages(q, placeholder), add_generation_prompt=True, tokenize=False)
            for q, _img in reqs
        ]
        inputs = processor(text=texts, images=[img for _q, img in reqs], padding=True, return_tensors="pt")
        inputs = inputs.to(device)
        inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
        stamps = Stamps()
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                streamer=stamps,
            )
        sync(device)
        if out.shape[1] - inputs["input_ids"].shape[1] != max_new:
            raise SystemExit(
                f"generate made {out.shape[1] - inputs['input_ids'].shape[1]} tokens, not {max_new}"
            )
        # the streamer gets the prompt, then each step's tokens: the first new token is max_new from the end
        first = stamps.times[-max_new] if len(stamps.times) >= max_new else time.perf_counter()
        return (
            [first - t0] * len(reqs),
            int(inputs["attention_mask"][0].sum()),
            int(inputs["input_ids"].shape[1]),
        )

    warm = make_requests(min(args.warmup_requests, args.num_requests), args.image_size, args.seed + 1)
    t = time.perf_counter()
    if warm:
        generate(warm, min(4, args.output_len), time.perf_counter())
    warm_s = time.perf_counter() - t
    requests = make_requests(args.num_requests, args.image_size, args.seed)
    batch = args.hf_batch_size or len(requests)
    ttfts: list[float] = []
    prompt_len = padded = 0
    t0 = time.perf_counter()
    for start in range(0, len(requests), batch):
        got, length, width = generate(requests[start : start + batch], args.output_len, t0)
        ttfts += got
        if start == 0:
            prompt_len, padded = length, width
    total_s = time.perf_counter() - t0
    res = summary(ttfts, len(requests) * args.output_len, total_s)
    res.update(
        engine="transformers",
        build_s=build_s,
        warmup_s=warm_s,
        batch_size=batch,
        prompt_tokens_first=prompt_len,
        padded_prompt_len=padded,
        transformers=__import__("transformers").__version__,
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        ttft_ms=[1e3 * x for x in ttfts],
    )
    if device == "cuda":
        res["max_memory_allocated_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    return res


# -- the parent: both engines, floors, the table ---------------------------------------------------------
def tiny_preset() -> Any:
    """The ``llava-1.5-7b`` preset shrunk for the CPU: same tokenizer, image size and patch (576 image
    tokens), two narrow CLIP layers and a two-layer 64-wide Llama."""
    from hotloop.models.presets import PRESETS, Preset

    base = PRESETS[PRESET]
    cfg = copy.deepcopy(base.config)
    cfg["torch_dtype"] = "float32"
    cfg["vision_config"].update(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    cfg["text_config"].update(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        torch_dtype="float32",
    )
    return Preset(cfg, base.tokenizer, base.preprocessor, base.processor)


def model_folder(args: argparse.Namespace, out: Path) -> Path:
    from hotloop.models.presets import is_preset, preset_dir, write_preset

    if args.tiny:
        folder = out / "tiny-llava"
        write_preset(folder, tiny_preset())
        return folder
    if is_preset(args.model):
        return preset_dir(args.model)
    return Path(args.model)


def floors(folder: Path, n: int, prompt_len: int, out_len: int) -> dict[str, float]:
    """Lower bounds on the H200 from GPU.md's ceilings: every text weight (less the embedding table)
    and every cached K/V read once per decode step; the prefill's matmul FLOPs (text and vision)."""
    cfg = json.loads((folder / "config.json").read_text())
    t, v = cfg["text_config"], cfg["vision_config"]
    h, inter, layers, vocab = (
        t["hidden_size"],
        t["intermediate_size"],
        t["num_hidden_layers"],
        t["vocab_size"],
    )
    head_dim = h // t["num_attention_heads"]
    kv_dim = t.get("num_key_value_heads", t["num_attention_heads"]) * head_dim
    per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * inter
    weight_bytes = 2 * (layers * per_layer + vocab * h)  # bf16: decoder layers + LM head
    kv_per_token = 2 * layers * kv_dim * 2
    avg_ctx = prompt_len + out_len / 2
    step_s = (weight_bytes + n * avg_ctx * kv_per_token) / H200_COPY_BPS
    vh, vi = v["hidden_size"], v["intermediate_size"]
    vis_tokens = (v["image_size"] // v["patch_size"]) ** 2 + 1
    vis_flops = 2 * vis_tokens * (v["num_hidden_layers"] - 1) * (4 * vh * vh + 2 * vh * vi)
    prefill_flops = n * (2 * prompt_len * layers * per_layer + vis_flops)
    prefill_s = prefill_flops / H200_BF16_FLOPS
    total_s = prefill_s + out_len * step_s
    return {
        "decode_step_ms": 1e3 * step_s,
        "prefill_all_ms": 1e3 * prefill_s,
        "output_tokens_per_s": n * out_len / total_s,
    }


def run_child(
    engine: str, args: argparse.Namespace, folder: Path, out: Path, timeout: int
) -> dict[str, Any] | None:
    js, log = out / f"{engine}.json", out / f"{engine}.log"
    cmd = [
        sys.executable, __file__, "--engine", engine, "--model-dir", str(folder), "--output-json", str(js),
        "--num-requests", str(args.num_requests), "--output-len", str(args.output_len),
        "--image-size", str(args.image_size), "--seed", str(args.seed), "--device", args.device,
        "--dtype", args.dtype, "--warmup-requests", str(args.warmup_requests),
        "--session-len", str(args.session_len), "--max-batch-size", str(args.max_batch_size),
        "--max-prefill-token-num", str(args.max_prefill_token_num),
        "--cache-max-entry-count", str(args.cache_max_entry_count), "--hf-batch-size", str(args.hf_batch_size),
    ]  # fmt: skip
    if args.eager:
        cmd.append("--eager")
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=ENV, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = -9
    print(f"[{engine}] rc={rc} in {time.perf_counter() - t0:.0f} s", flush=True)
    if rc != 0 or not js.exists():
        print(log.read_text()[-4000:], flush=True)
        return None
    data: dict[str, Any] = json.loads(js.read_text())
    return data


def parent(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = model_folder(args, out)
    runs: dict[str, dict[str, Any] | None] = {}
    if not args.skip_hotloop:
        runs["hotloop"] = run_child("hotloop", args, folder, out, args.timeout_hotloop)
    if not args.skip_hf:
        runs["transformers"] = run_child("hf", args, folder, out, args.timeout_hf)
    h, hf = runs.get("hotloop"), runs.get("transformers")
    prompt_len = 0
    if h is not None:
        prompt_len = int(statistics.median(h["prompt_tokens"]))
    elif hf is not None:
        prompt_len = int(hf["prompt_tokens_first"])
    floor = (
        floors(folder, args.num_requests, prompt_len, args.output_len) if not args.tiny and prompt_len else {}
    )
    rows = [
        ("TTFT p50 ms", "ttft_ms_p50", None),
        ("TTFT p99 ms", "ttft_ms_p99", floor.get("prefill_all_ms")),
        ("output tokens/s", "output_tokens_per_s", floor.get("output_tokens_per_s")),
        ("total s", "total_s", None),
    ]
    workload = {
        "model": "tiny LLaVA (CPU smoke test)" if args.tiny else args.model,
        "num_requests": args.num_requests,
        "images_per_request": 1,
        "image_size": args.image_size,
        "prompt_tokens": prompt_len,
        "output_len": args.output_len,
        "device": args.device,
        "dtype": args.dtype,
    }
    table = [
        {
            "row": label,
            "hotloop": None if h is None else h.get(key),
            "transformers": None if hf is None else hf.get(key),
            "h200_bound": bound,
        }
        for label, key, bound in rows
    ]
    result = {"workload": workload, "floors_h200": floor, "runs": runs, "table": table}
    (out / "vl_speed.json").write_text(json.dumps(result, indent=2))

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:,.1f}"

    print(
        f"\n{workload['model']}: {args.num_requests} concurrent requests x 1 image "
        f"{args.image_size}x{args.image_size}, ~{prompt_len} prompt tokens, {args.output_len} output tokens"
    )
    print(f"{'':18} {'hotloop':>10} {'transformers':>13} {'speed-up':>9} {'H200 bound':>11}")
    for r in table:
        hv, tv = r["hotloop"], r["transformers"]
        ratio = "-"
        if hv and tv:
            ratio = f"{(hv / tv if 'tokens/s' in r['row'] else tv / hv):.1f}x"
        print(f"{r['row']:18} {fmt(hv):>10} {fmt(tv):>13} {ratio:>9} {fmt(r['h200_bound']):>11}")
    return 0 if all(r is not None for r in runs.values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out/vl"))
    ap.add_argument("--model", default=PRESET, help="a preset name or a LLaVA folder (config.json)")
    ap.add_argument("--quick", action="store_true", help="8 requests x 16 output tokens")
    ap.add_argument("--tiny", action="store_true", help="a tiny LLaVA on the CPU in float32 (smoke test)")
    ap.add_argument("--num-requests", type=int, default=None, help="default 64 (8 with --quick)")
    ap.add_argument("--output-len", type=int, default=None, help="default 128 (16 with --quick)")
    ap.add_argument("--image-size", type=int, default=336)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="default cuda (cpu with --tiny)")
    ap.add_argument("--dtype", default=None, help="default bfloat16 (float32 with --tiny)")
    ap.add_argument("--warmup-requests", type=int, default=4)
    ap.add_argument("--session-len", type=int, default=2048)
    ap.add_argument("--max-batch-size", type=int, default=128)
    ap.add_argument("--max-prefill-token-num", type=int, default=8192)
    ap.add_argument(
        "--cache-max-entry-count",
        type=float,
        default=0.8,
        help="KV pool: a fraction of free memory, or blocks",
    )
    ap.add_argument("--eager", action="store_true", help="hotloop without decode CUDA graphs")
    ap.add_argument("--hf-batch-size", type=int, default=0, help="transformers batch (0: all requests)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-hotloop", action="store_true")
    ap.add_argument("--timeout-hotloop", type=int, default=330)
    ap.add_argument("--timeout-hf", type=int, default=240)
    ap.add_argument("--engine", choices=("hotloop", "hf"), default=None, help="(internal) run one engine")
    ap.add_argument("--model-dir", default=None, help="(internal) the resolved model folder")
    ap.add_argument("--output-json", default=None, help="(internal) where one engine's run goes")
    args = ap.parse_args()
    if args.num_requests is None:
        args.num_requests = 8 if args.quick else 64
    if args.output_len is None:
        args.output_len = 16 if args.quick else 128
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    if args.engine is None:
        return parent(args)
    run = run_hotloop if args.engine == "hotloop" else run_hf
    res = run(args, args.device, args.dtype)
    res.update(num_requests=args.num_requests, output_len=args.output_len, image_size=args.image_size)
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, list)}, indent=2))
    with open(args.output_json, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
