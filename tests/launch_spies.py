"""A spy on the CUDA int8 decode launch (``kv_int8_decode_cuda.launch``), shared by the kernel and
engine tests: each call's outcome and its arguments by name, so a test can tell which path a step
took (the fused write, the merge write's ``exclude_newest``) without counting positions."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from hotloop.kernels import kv_int8_decode_cuda

# the real launcher's signature, taken at import (before any test patches ``launch``): calls are bound
# to it even when the spy wraps a stand-in
_SIGNATURE = inspect.signature(kv_int8_decode_cuda.launch)


def spy_int8_decode_launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, dict[str, Any]]]:
    """Patch ``kv_int8_decode_cuda.launch``; returns the list that collects ``(launched, arguments)``
    per call (defaults filled in)."""
    real = kv_int8_decode_cuda.launch
    seen: list[tuple[bool, dict[str, Any]]] = []

    def spy(*args: Any, **kwargs: Any) -> bool:
        ok = real(*args, **kwargs)
        bound = _SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        seen.append((bool(ok), dict(bound.arguments)))
        return ok

    monkeypatch.setattr(kv_int8_decode_cuda, "launch", spy)
    return seen
