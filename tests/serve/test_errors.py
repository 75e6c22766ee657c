"""``serve/errors.py``: engine errors in the OpenAI routes' terms."""

from __future__ import annotations

import pytest

from hotloop.messages import RequestError
from hotloop.serve.errors import from_request_error


@pytest.mark.parametrize(
    ("message", "param", "want_message", "want_param"),
    [
        ("min_new_tokens=10 must be <= max_new_tokens=4", "min_new_tokens",
         "min_tokens=10 must be <= max_tokens=4", "min_tokens"),
        ("random_seed=-1 must be an integer in [0, 2**63)", "random_seed",
         "seed=-1 must be an integer in [0, 2**63)", "seed"),
        # a quoted value is not a field name: it stays
        ("json_schema is only used with response_format='json_schema'", "json_schema",
         "response_format.json_schema is only used with response_format='json_schema'",
         "response_format.json_schema"),
        ("top_k=-2 must be an integer >= 0", "top_k", "top_k=-2 must be an integer >= 0", "top_k"),
    ],
)  # fmt: skip
def test_openai_names_in_param_and_message(
    message: str, param: str, want_message: str, want_param: str
) -> None:
    e = from_request_error(RequestError(message, param=param))
    assert (e.status, e.message, e.param) == (400, want_message, want_param)
    native = from_request_error(RequestError(message, param=param), native=True)
    assert (native.message, native.param) == (message, param)  # /generate keeps the engine's names
