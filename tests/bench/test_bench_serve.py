"""``hotloop bench serve``: datasets, statistics and goodput on their own, then a small run against a
live ``hotloop serve`` on the CPU (which must also stop cleanly on SIGINT)."""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotloop.bench.datasets import arrival_gaps, random_dataset, synthetic_chat_dataset
from hotloop.bench.serve import RequestResult, parse_goodput, summarize
from hotloop.cli import bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from server_proc import ServerProcess, start_server  # noqa: E402


def test_random_dataset_lengths_and_seed() -> None:
    a = random_dataset(50, 100, 20, range_ratio=0.5, seed=7)
    assert a == random_dataset(50, 100, 20, range_ratio=0.5, seed=7)
    assert a != random_dataset(50, 100, 20, range_ratio=0.5, seed=8)
    assert all(50 <= r.prompt_len <= 150 and 10 <= r.output_len <= 30 for r in a)
    assert all(len(r.prompt.split()) == r.prompt_len for r in a)  # one word per planned token
    fixed = random_dataset(5, 8, 4, prefix_len=3, seed=1)
    assert {r.prompt_len for r in fixed} == {11} and {r.output_len for r in fixed} == {4}
    assert len({" ".join(r.prompt.split()[:3]) for r in fixed}) == 1  # the shared prefix
    with pytest.raises(ValueError):
        random_dataset(5, 8, 4, range_ratio=1.5)


def test_synthetic_chat_is_a_long_tailed_mix() -> None:
    d = synthetic_chat_dataset(2000, seed=3)
    ins = sorted(r.prompt_len for r in d)
    outs = sorted(r.output_len for r in d)
    assert 150 <= ins[1000] <= 215 and 130 <= outs[1000] <= 190  # medians near 180 and 160
    assert ins[-20] > 3 * ins[1000]  # a long tail
    assert min(ins) >= 4 and max(ins) <= 2048 and max(outs) <= 1024


def test_poisson_gaps() -> None:
    gaps = arrival_gaps(4000, 20.0, seed=0)
    assert abs(sum(gaps) / len(gaps) - 0.05) < 0.005
    assert arrival_gaps(3, math.inf) == [0.0, 0.0, 0.0]


def test_summary_percentiles_and_goodput() -> None:
    rs = [
        RequestResult(True, "", 10, 11, ttft=0.1 * i, latency=0.1 * i + 1.0, itl=[0.1] * 10)
        for i in range(1, 11)
    ]
    rs.append(RequestResult(False, "HTTP 500", 10))
    s = summarize(rs, 2.0, parse_goodput(["ttft:500", "tpot:100"]), [50, 99])
    assert s["completed"] == 10 and s["failed"] == 1 and s["errors"] == ["HTTP 500"]
    assert s["total_output_tokens"] == 110 and s["request_throughput"] == 5.0
    assert s["median_ttft_ms"] == pytest.approx(550.0) and s["p50_ttft_ms"] == pytest.approx(550.0)
    assert s["p99_ttft_ms"] == pytest.approx(991.0)
    assert s["mean_tpot_ms"] == pytest.approx(100.0)
    assert s["good_requests"] == 5 and s["request_goodput"] == 2.5  # ttft <= 500 ms: requests 1..5
    with pytest.raises(ValueError):
        parse_goodput(["latency:5"])


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = start_server(["--max-concurrent-requests", "4"])
    yield srv
    code = srv.stop(signal.SIGINT)
    assert code == 0, f"SIGINT did not shut the server down cleanly (exit {code}):\n{srv.log()[-3000:]}"


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hotloop")
    bench.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_bench_serve_against_hotloop(
    server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "random.json"
    code = _run_cli(
        [
            "bench",
            "serve",
            "--base-url",
            server.base_url,
            "--dataset-name",
            "random",
            "--num-prompts",
            "8",
            "--random-input-len",
            "16",
            "--random-output-len",
            "6",
            "--random-range-ratio",
            "0.25",
            "--max-concurrency",
            "4",
            "--ignore-eos",
            "--seed",
            "1",
            "--goodput",
            "ttft:60000",
            "tpot:60000",
            "--metric-percentiles",
            "50,99",
            "--result-file",
            str(out),
        ]
    )
    assert code == 0
    table = capsys.readouterr().out
    for label in (
        "Request throughput",
        "Output token throughput",
        "Median TTFT",
        "P99 TPOT",
        "Mean ITL",
        "Request goodput",
    ):
        assert label in table
    r = json.loads(out.read_text())
    assert r["completed"] == 8 and r["failed"] == 0 and r["good_requests"] == 8
    planned = random_dataset(8, 16, 6, range_ratio=0.25, seed=1)
    assert r["total_output_tokens"] == sum(p.output_len for p in planned)  # ignore_eos: exact counts
    assert r["config"]["model"] == "SmolLM2-135M-Instruct" and r["p99_ttft_ms"] >= r["median_ttft_ms"] > 0

    chat = tmp_path / "chat.json"
    code = _run_cli(
        [
            "bench",
            "serve",
            "--base-url",
            server.base_url,
            "--endpoint",
            "/v1/chat/completions",
            "--dataset-name",
            "synthetic-chat",
            "--num-prompts",
            "6",
            "--synthetic-input-median",
            "24",
            "--synthetic-output-median",
            "4",
            "--synthetic-max-output",
            "8",
            "--request-rate",
            "8",
            "--disable-tqdm",
            "--result-file",
            str(chat),
        ]
    )
    assert code == 0
    c = json.loads(chat.read_text())
    assert c["completed"] == 6 and c["total_input_tokens"] > 6 * 10 and c["config"]["request_rate"] == 8.0
