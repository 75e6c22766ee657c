"""Shutting down with a stream still running: after the grace period the request is aborted, and its
stream ends with finish_reason ``abort`` and ``[DONE]`` (not cut off), with a clean log and exit 0."""

from __future__ import annotations

import json
import signal
import threading

import httpx2 as httpx
from server_proc import start_server


def test_sigint_with_a_stream_running_ends_it_cleanly() -> None:
    srv = start_server(["--shutdown-timeout", "2"])
    stopper = threading.Thread(target=srv.stop, args=(signal.SIGINT,), daemon=True)
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True, "stream": True}
        events: list[str] = []
        with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 3:  # generating: now stop the server (one SIGINT)
                    stopper.start()
        assert events[-1] == "[DONE]", events[-3:]
        reasons = [c["finish_reason"] for e in events[:-1] for c in json.loads(e)["choices"]]
        assert reasons[-1] == "abort" and reasons.count("abort") == 1, reasons[-3:]
        assert len(events) < 400  # it did not run to the end
    finally:
        if stopper.is_alive():
            stopper.join(60)
        code = srv.stop(signal.SIGKILL) if srv.proc.poll() is None else int(srv.proc.returncode)
    log = srv.log()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    assert "aborted 1 request(s)" in log and "server stopped" in log, log[-3000:]
