"""``hotloop bench serve``: flags of the serving benchmark (vLLM's ``benchmark_serving`` names)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks", description="Benchmarks.")
    bench_sub = p.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    p.set_defaults(func=lambda _args: p.print_help() or 2)
    add_serve_parser(bench_sub)
    from hotloop.bench.offline import add_latency_parser, add_throughput_parser

    add_throughput_parser(bench_sub)
    add_latency_parser(bench_sub)


def add_serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    s = sub.add_parser(
        "serve",
        help="load-test an OpenAI-compatible server",
        description="Load-test any OpenAI-compatible server: Poisson arrivals or a concurrency cap; reports "
        "throughput, TTFT, TPOT, ITL and goodput.",
    )
    target = s.add_argument_group("target")
    target.add_argument(
        "--base-url", default=None, help="server URL, e.g. http://127.0.0.1:23333 (overrides --host/--port)"
    )
    target.add_argument("--host", default="127.0.0.1")
    target.add_argument("--port", type=int, default=23333)
    target.add_argument(
        "--endpoint",
        default="/v1/completions",
        help="/v1/completions or /v1/chat/completions (default: /v1/completions)",
    )
    target.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    target.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    target.add_argument(
        "--tokenizer",
        default=None,
        help="HF tokenizer folder for exact prompt lengths (default: ~1 token per English word)",
    )

    data = s.add_argument_group("dataset")
    data.add_argument("--dataset-name", choices=("random", "synthetic-chat"), default="random")
    data.add_argument("--num-prompts", type=int, default=1000)
    data.add_argument("--random-input-len", type=int, default=1024)
    data.add_argument("--random-output-len", type=int, default=128)
    data.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="lengths uniform in [L*(1-r), L*(1+r)] (default: 0, fixed lengths)",
    )
    data.add_argument(
        "--random-prefix-len", type=int, default=0, help="tokens of a prefix shared by every prompt"
    )
    data.add_argument(
        "--random-token-ids",
        type=int,
        default=None,
        metavar="VOCAB",
        help="random dataset: send prompts as token ids drawn from [0, VOCAB) for exact lengths "
        "(/v1/completions only)",
    )
    data.add_argument("--synthetic-input-median", type=float, default=180.0)
    data.add_argument("--synthetic-input-sigma", type=float, default=1.0)
    data.add_argument("--synthetic-output-median", type=float, default=160.0)
    data.add_argument("--synthetic-output-sigma", type=float, default=0.8)
    data.add_argument("--synthetic-max-input", type=int, default=2048)
    data.add_argument("--synthetic-max-output", type=int, default=1024)

    load = s.add_argument_group("load")
    load.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="requests per second, Poisson arrivals (default: inf, all at once)",
    )
    load.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument(
        "--ignore-eos", action="store_true", help="ask the server to ignore EOS (vLLM/hotloop extension)"
    )
    load.add_argument("--temperature", type=float, default=0.0)

    out = s.add_argument_group("report")
    out.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="NAME:MS",
        help="SLOs for goodput, e.g. ttft:500 tpot:50 (names: ttft, tpot, itl, e2el)",
    )
    out.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles (default: 99)")
    out.add_argument("--result-file", default=None, help="write the results as JSON here")
    out.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    out.add_argument(
        "--http-client",
        choices=("raw", "httpx"),
        default="raw",
        help="raw: a lean HTTP/1.1 streaming client (http:// only; less client time in the latencies); "
        "httpx: httpx (also used for https://)",
    )
    s.set_defaults(func=run)
    return s


def run(args: argparse.Namespace) -> int:
    from hotloop.bench.serve import run as run_bench

    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency={args.max_concurrency} must be >= 1")
    check_dataset_args(args)
    return run_bench(args)


def check_dataset_args(args: argparse.Namespace) -> None:
    """Dataset flags that the generators would take silently (a negative prefix length shrinks every
    prompt's recorded length) or that make every request fail after the run (empty prompts): refused
    before any request. (A --tokenizer that does not load is refused by ``run_bench`` where it loads it.)"""
    least = (
        ("--random-prefix-len", args.random_prefix_len, 0),
        ("--synthetic-max-input", args.synthetic_max_input, 1),
        ("--synthetic-max-output", args.synthetic_max_output, 1),
        ("--synthetic-input-sigma", args.synthetic_input_sigma, 0),
        ("--synthetic-output-sigma", args.synthetic_output_sigma, 0),
    )
    for flag, value, low in least:
        if not value >= low:  # (also NaN)
            raise ValueError(f"{flag} {value}: must be >= {low}")
    for flag, value in (
        ("--synthetic-input-median", args.synthetic_input_median),
        ("--synthetic-output-median", args.synthetic_output_median),
    ):
        if not value > 0:
            raise ValueError(f"{flag} {value}: must be > 0")
