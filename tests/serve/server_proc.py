"""Start ``hotloop serve`` as a real process on 127.0.0.1 (a free port) and stop it with a signal."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx

REPO = Path(__file__).resolve().parents[2]
API_KEY = "test-key-2"

# Small enough for 2 shared CPU cores: a 512-token session and a 640 x 16-token KV pool (~450 MiB).
SMALL_ENGINE = [
    "--device",
    "cpu",
    "--session-len",
    "512",
    "--cache-block-seq-len",
    "16",
    "--cache-max-entry-count",
    "640",
    "--max-batch-size",
    "128",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` and wait; returns the exit status (kills it if it does not stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def start_server(extra: list[str] | None = None, timeout: float = 180.0) -> ServerProcess:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="hotloop-serve-", suffix=".log")[1])
    cmd = [
        sys.executable,
        "-m",
        "hotloop",
        "serve",
        "api_server",
        "--server-name",
        "127.0.0.1",
        "--server-port",
        str(port),
        *SMALL_ENGINE,
        *(extra or []),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    server = ServerProcess(proc, port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"the server did not become healthy within {timeout:.0f} s:\n{server.log()}")
