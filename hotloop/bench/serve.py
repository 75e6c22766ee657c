"""``hotloop bench serve``: load-test any OpenAI-compatible server (hotloop, vLLM, LMDeploy, SGLang).

Sends streaming requests to ``/v1/completions`` or ``/v1/chat/completions`` with Poisson arrivals
(``--request-rate``) and/or a cap on requests in flight (``--max-concurrency``), and measures per
request the time to first token (TTFT), the time per output token after the first (TPOT), the gaps
between streamed chunks (ITL) and the end-to-end latency. Token counts come from the server's
``usage`` (``stream_options.include_usage``) when it sends one. Goodput counts requests per second
that met every SLO given with ``--goodput ttft:MS tpot:MS e2el:MS``.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from hotloop.bench.datasets import BenchRequest, arrival_gaps, random_dataset, synthetic_chat_dataset
from hotloop.bench.output import check_writable

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older environments
    import httpx  # type: ignore[no-redef]

METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> float | None:
        if self.output_len <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 0.5, "tpot": 0.05}`` (seconds)."""
    slos: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition(":")
        if not sep or name not in METRICS:
            raise ValueError(
                f"--goodput {item!r}: expected NAME:MILLISECONDS with NAME one of {', '.join(METRICS)}"
            )
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
        if ms <= 0:
            raise ValueError(f"--goodput {item!r}: the limit must be > 0 ms")
        slos[name] = ms / 1000.0
    return slos


def _payload(
    chat: bool, model: str, req: BenchRequest, ignore_eos: bool, temperature: float
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": req.output_len,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


async def send_request(
    client: Any,
    url: str,
    chat: bool,
    model: str,
    req: BenchRequest,
    headers: dict[str, str],
    ignore_eos: bool,
    temperature: float = 0.0,
) -> RequestResult:
    """Stream one request and time it."""
    res = RequestResult(prompt_len=req.prompt_len)
    start = time.perf_counter()
    last = start
    chunks = 0
    usage: dict[str, Any] | None = None
    try:
        async with client.stream(
            "POST", url, json=_payload(chat, model, req, ignore_eos, temperature), headers=headers
        ) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                res.error = f"HTTP {resp.status_code}: {body[:300]}"
                return res
            async for line in _sse_lines(resp):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if "error" in msg:
                    res.error = str(msg["error"])
                    return res
                if msg.get("usage"):
                    usage = msg["usage"]
                for choice in msg.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if text:
                        now = time.perf_counter()
                        if chunks == 0:
                            res.ttft = now - start
                        else:
                            res.itl.append(now - last)
                        last = now
                        chunks += 1
        res.latency = time.perf_counter() - start
        if usage:
            res.output_len = int(usage.get("completion_tokens") or chunks)
            res.prompt_len = int(usage.get("prompt_tokens") or req.prompt_len)
        else:
            res.output_len = chunks
        res.success = chunks > 0 or res.output_len > 0
        if not res.success:
            res.error = "the stream ended without output"
    except Exception as e:  # noqa: BLE001 - a failed request is a result, not a crash
        res.error = f"{type(e).__name__}: {e}"
    return res


async def fetch_model(client: Any, base_url: str, headers: dict[str, str]) -> str:
    resp = await client.get(f"{base_url}/v1/models", headers=headers)
    if resp.status_code == 401:
        what = "refused the API key" if headers.get("Authorization") else "needs an API key"
        raise RuntimeError(f"{base_url} {what} (401): pass the server's key with --api-key")
    if resp.status_code != 200:
        raise RuntimeError(f"{base_url}/v1/models answered {resp.status_code}: {resp.text[:300]}")
    data = resp.json().get("data") or []
    if not data:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return str(data[0]["id"])


async def run_load(
    base_url: str,
    endpoint: str,
    requests: list[BenchRequest],
    *,
    model: str | None = None,
    api_key: str | None = None,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 0,
    ignore_eos: bool = False,
    temperature: float = 0.0,
    progress: bool = True,
    timeout: float = 600.0,
    http_client: str = "raw",
) -> tuple[list[RequestResult], float, str]:
    """Send every request; returns (results in request order, wall time in seconds, model).

    ``http_client``: ``raw`` streams through ``raw_http.RawClient`` (lean, for ``http://`` URLs;
    ``https://`` falls back to httpx), ``httpx`` through httpx."""
    from tqdm import tqdm

    from hotloop.bench.raw_http import RawClient

    if http_client not in ("raw", "httpx"):
        raise ValueError(f"--http-client={http_client!r} must be 'raw' or 'httpx'")

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    chat = endpoint.rstrip("/").endswith("chat/completions")
    limits = httpx.Limits(max_connections=max_concurrency or len(requests), max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        model = model or await fetch_model(client, base_url, headers)
        url = base_url.rstrip("/") + endpoint
        streamer: Any = RawClient(timeout) if http_client == "raw" and RawClient.supports(url) else client
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        bar = tqdm(total=len(requests), disable=not progress, desc="requests", unit="req")

        async def one(req: BenchRequest) -> RequestResult:
            if sem is None:
                r = await send_request(streamer, url, chat, model, req, headers, ignore_eos, temperature)
            else:
                async with sem:
                    r = await send_request(streamer, url, chat, model, req, headers, ignore_eos, temperature)
            bar.update(1)
            return r

        tasks = []
        start = time.perf_counter()
        for req, gap in zip(requests, arrival_gaps(len(requests), request_rate, seed), strict=True):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.ensure_future(one(req)))
        results = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - start
        bar.close()
    return results, duration, model


def _stats(values: list[float], percentiles: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, **{f"p{_pct_name(p)}": 0.0 for p in percentiles}}
    ordered = sorted(values)
    out = {
        "mean": statistics.fmean(ordered),
        "median": statistics.median(ordered),
        "std": statistics.pstdev(ordered) if len(ordered) > 1 else 0.0,
    }
    for p in percentiles:
        out[f"p{_pct_name(p)}"] = _percentile(ordered, p)
    return out


def _pct_name(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def _percentile(ordered: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(ordered) == 1:
        return ordered[0]
    k = (len(ordered) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def meets_slos(r: RequestResult, slos: dict[str, float]) -> bool:
    values = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.latency, "itl": max(r.itl) if r.itl else 0.0}
    return r.success and all(values[k] <= v for k, v in slos.items())


def summarize(
    results: list[RequestResult],
    duration: float,
    slos: dict[str, float] | None = None,
    percentiles: list[float] | None = None,
) -> dict[str, Any]:
    """Throughput and latency statistics (latencies in milliseconds)."""
    percentiles = percentiles or [99.0]
    ok = [r for r in results if r.success]
    inp = sum(r.prompt_len for r in ok)
    outp = sum(r.output_len for r in ok)
    ms = 1000.0
    summary: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "total_input_tokens": inp,
        "total_output_tokens": outp,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": outp / duration if duration else 0.0,
        "total_token_throughput": (inp + outp) / duration if duration else 0.0,
    }
    series = {
        "ttft": [r.ttft * ms for r in ok],
        "tpot": [t * ms for r in ok if (t := r.tpot) is not None],
        "itl": [g * ms for r in ok for g in r.itl],
        "e2el": [r.latency * ms for r in ok],
    }
    for name, values in series.items():
        for stat, value in _stats(values, percentiles).items():
            summary[f"{stat}_{name}_ms"] = value
    if slos:
        good = sum(1 for r in ok if meets_slos(r, slos))
        summary["goodput_slos_ms"] = {k: v * ms for k, v in slos.items()}
        summary["good_requests"] = good
        summary["request_goodput"] = good / duration if duration else 0.0
    errors = [r.error for r in results if not r.success]
    if errors:
        summary["errors"] = errors[:10]
    return summary


def format_table(s: dict[str, Any], percentiles: list[float] | None = None) -> str:
    percentiles = percentiles or [99.0]
    w = 44
    lines = ["{:=^60}".format(" Serving Benchmark Result ")]

    def row(label: str, value: Any) -> None:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{label:<{w}}{text:>16}")

    row("Successful requests:", s["completed"])
    row("Failed requests:", s["failed"])
    row("Benchmark duration (s):", s["duration_s"])
    row("Total input tokens:", s["total_input_tokens"])
    row("Total generated tokens:", s["total_output_tokens"])
    row("Request throughput (req/s):", s["request_throughput"])
    if "request_goodput" in s:
        row("Request goodput (req/s):", s["request_goodput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total token throughput (tok/s):", s["total_token_throughput"])
    titles = {
        "ttft": "Time to First Token",
        "tpot": "Time per Output Token (excl. 1st token)",
        "itl": "Inter-token Latency",
        "e2el": "End-to-end Latency",
    }
    for name, title in titles.items():
        lines.append(f"{title:-^60}")
        key = name.upper()
        row(f"Mean {key} (ms):", s[f"mean_{name}_ms"])
        row(f"Median {key} (ms):", s[f"median_{name}_ms"])
        for p in percentiles:
            row(f"P{_pct_name(p)} {key} (ms):", s[f"p{_pct_name(p)}_{name}_ms"])
    lines.append("=" * 60)
    return "\n".join(lines)


async def _sse_lines(resp: Any) -> Any:
    """Lines of an SSE body, split on ``\n`` only (SSE's rule). ``str.splitlines``-based readers
    also split on U+2028 and friends, which JSON leaves unescaped inside strings."""
    buf = b""
    async for chunk in resp.aiter_bytes():
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            yield raw.rstrip(b"\r").decode("utf-8", "replace")
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", "replace")


def build_requests(args: Any, tokenizer: Any | None = None) -> list[BenchRequest]:
    if args.dataset_name == "random":
        return random_dataset(
            args.num_prompts,
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
            args.random_prefix_len,
            args.seed,
            tokenizer,
            token_id_vocab=getattr(args, "random_token_ids", None),
        )
    return synthetic_chat_dataset(
        args.num_prompts,
        args.seed,
        args.synthetic_input_median,
        args.synthetic_input_sigma,
        args.synthetic_output_median,
        args.synthetic_output_sigma,
        args.synthetic_max_input,
        args.synthetic_max_output,
        tokenizer,
    )


def _check_reachable(base_url: str) -> None:
    """A one-line error before the run when nothing answers at ``base_url``."""
    try:
        httpx.get(base_url.rstrip("/") + "/v1/models", timeout=10.0)
    except httpx.HTTPError as e:
        raise RuntimeError(
            f"no server answers at {base_url} ({type(e).__name__}: {e}); start one, or pass --host / --port / "
            "--base-url"
        ) from e


def run(args: Any) -> int:
    """Entry point of ``hotloop bench serve`` (``args`` from ``hotloop.cli.bench``)."""
    slos = parse_goodput(args.goodput)
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",") if p.strip()]
    except ValueError:
        raise ValueError(
            f"--metric-percentiles {args.metric_percentiles!r}: must be numbers separated by commas, e.g. 50,90,99"
        ) from None
    if not all(0.0 < p < 100.0 for p in percentiles):
        raise ValueError(f"--metric-percentiles {args.metric_percentiles!r}: each must lie in (0, 100)")
    check_writable(args.result_file, "--result-file")
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        except (OSError, ValueError) as e:  # (transformers' own error names no flag)
            raise ValueError(
                f"--tokenizer {args.tokenizer!r}: cannot load a tokenizer from it ({str(e).splitlines()[0]}); "
                "pass a Hugging Face model or tokenizer folder, or leave the flag out (~1 token per word)"
            ) from None
    if getattr(args, "random_token_ids", None) and args.endpoint.rstrip("/").endswith("chat/completions"):
        raise ValueError("--random-token-ids sends token-id prompts, which only /v1/completions accepts")
    requests = build_requests(args, tokenizer)
    base_url = args.base_url or f"http://{args.host}:{args.port}"
    rate = math.inf if args.request_rate is None else args.request_rate
    _check_reachable(base_url)
    results, duration, model = asyncio.run(
        run_load(
            base_url,
            args.endpoint,
            requests,
            model=args.model,
            api_key=args.api_key,
            request_rate=rate,
            max_concurrency=args.max_concurrency,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
            temperature=args.temperature,
            progress=not args.disable_tqdm,
            http_client=args.http_client,
        )
    )
    summary = summarize(results, duration, slos, percentiles)
    print(format_table(summary, percentiles))
    failed = [r.error for r in results if not r.success]
    if failed:  # (the table has only their count: say why, once per distinct reason)
        reasons = list(dict.fromkeys(str(e) for e in failed))
        print(f"{len(failed)} requests failed; the first reasons:", file=sys.stderr)
        for reason in reasons[:3]:
            print(f"  {reason[:300]}", file=sys.stderr)
    if args.result_file:
        record = {
            "config": {
                "base_url": base_url,
                "endpoint": args.endpoint,
                "model": model,
                "dataset": args.dataset_name,
                "num_prompts": args.num_prompts,
                "request_rate": "inf" if math.isinf(rate) else rate,
                "max_concurrency": args.max_concurrency,
                "seed": args.seed,
                "ignore_eos": args.ignore_eos,
            },
            **summary,
            "requests": [{k: v for k, v in asdict(r).items() if k != "itl"} for r in results],
        }
        with open(args.result_file, "w") as f:
            json.dump(record, f, indent=2)
        print(f"results written to {args.result_file}")
    return 0 if summary["completed"] else 1
