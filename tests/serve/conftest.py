"""One real ``hotloop serve`` process (default model, CPU, API keys on) shared by the live-server tests.

It is started once for the session because loading the model costs seconds; tests that need other
flags build an in-process app over the toy engine instead. Shutting it down with SIGTERM at the end
must exit 0 (a clean shutdown).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from server_proc import API_KEY, ServerProcess, start_server


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    srv = start_server(["--api-keys", "test-key-1", API_KEY])
    yield srv
    code = srv.stop(signal.SIGTERM)
    assert code == 0, f"SIGTERM did not shut the server down cleanly (exit {code}):\n{srv.log()[-3000:]}"
    assert "server stopped" in srv.log()


@pytest.fixture(scope="session")
def client(server: ServerProcess):
    from openai import OpenAI

    with OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def model_name(client) -> str:
    return str(client.models.list().data[0].id)


@pytest.fixture(scope="session")
def tokenizer(client):
    """The model's tokenizer loaded here, independently of the server."""
    from transformers import AutoTokenizer

    root = client.models.list().data[0].model_extra["root"]
    return AutoTokenizer.from_pretrained(root)
