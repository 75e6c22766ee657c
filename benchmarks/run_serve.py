"""The issue-3 serving benchmark in one command: start ``hotloop serve``, load it, stop it.

    PYTHONPATH=$PWD python3 benchmarks/run_serve.py --out $OUT/serve            # the issue's workload
    PYTHONPATH=$PWD python3 benchmarks/run_serve.py --out $OUT/serve --num-prompts 50   # smaller

Server: Llama-3-8B shape with dummy weights on the GPU. Client: ``hotloop bench serve``, 1024 random
token ids in, 128 out with EOS ignored, Poisson arrivals. Extra server flags go after ``--``.
Writes ``serve.json`` (the client's result, with the server command) and ``server.log``.

The issue-6 prefix-caching workload (a 2,048-token shared system prompt, 256 requests with distinct
64-token suffixes, all sent at once), with caching off and on:

    python3 benchmarks/run_serve.py --out $OUT/prefix_off --prefix-len 2048 --input-len 64 \
        --num-prompts 256 --request-rate inf -- --session-len 4096
    python3 benchmarks/run_serve.py --out $OUT/prefix_on --prefix-len 2048 --input-len 64 \
        --num-prompts 256 --request-rate inf -- --session-len 4096 --enable-prefix-caching
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ENV = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the server was not healthy after {timeout:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="serve-out")
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--port", type=int, default=23333)
    ap.add_argument("--num-prompts", type=int, default=500)
    ap.add_argument("--request-rate", type=float, default=16.0)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--prefix-len", type=int, default=0, help="tokens of a prefix shared by every prompt")
    ap.add_argument("--vocab", type=int, default=128000, help="random prompt ids are drawn below this")
    ap.add_argument("server_args", nargs="*", help="extra flags for hotloop serve (after --)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = [
        sys.executable, "-m", "hotloop", "serve", "api_server", args.model, "--load-format", "dummy",
        "--session-len", "2048", "--max-batch-size", "256", "--server-name", "127.0.0.1",
        "--server-port", str(args.port), "--log-level", "warning", *args.server_args,
    ]  # fmt: skip
    client = [
        sys.executable, "-m", "hotloop", "bench", "serve", "--port", str(args.port),
        "--random-token-ids", str(args.vocab), "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--request-rate", str(args.request_rate),
        "--num-prompts", str(args.num_prompts), "--random-prefix-len", str(args.prefix_len), "--ignore-eos", "--seed", "0", "--goodput", "ttft:45", "tpot:7",
        "--result-file", str(out / "serve.json"), "--disable-tqdm",
    ]  # fmt: skip
    with open(out / "server.log", "w") as log:
        proc = subprocess.Popen(server, stdout=log, stderr=subprocess.STDOUT, env=ENV)
        try:
            t0 = time.monotonic()
            wait_healthy(args.port, proc, 600)
            print(f"server healthy after {time.monotonic() - t0:.0f} s", flush=True)
            rc = subprocess.call(client, env=ENV)
            # the server's own view: TTFT, queue time and step histograms, for comparison with the client
            with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/metrics", timeout=10) as r:
                (out / "metrics.txt").write_bytes(r.read())
            for line in (out / "metrics.txt").read_text().splitlines():
                if line.startswith("hotloop:kernel_compile"):  # a compile while serving stalls its step
                    print(line, flush=True)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    path = out / "serve.json"
    if path.exists():
        d = json.loads(path.read_text())
        d["server_command"] = " ".join(server[2:])
        path.write_text(json.dumps(d, indent=1))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
