"""Triton compile counting (``kernels/compile_watch.py``): the hooks' bookkeeping on the CPU (the
hooks called as Triton calls them), and on the GPU a real compile after the warm-up is reported."""

from __future__ import annotations

import logging
import random
import types
from typing import Any

import pytest
import torch

from hotloop.kernels import compile_watch

triton = pytest.importorskip("triton")
from triton import knobs  # noqa: E402


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Any:
    """caplog, attached to the ``hotloop`` logger (which does not propagate to the root)."""
    root = logging.getLogger("hotloop")
    root.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.INFO)
    yield caplog
    root.removeHandler(caplog.handler)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A fresh watch, with Triton's JIT hooks set to recorders that the watch must chain to."""
    seen: list[dict[str, Any]] = []

    def earlier_cache_hook(**kwargs: Any) -> Any:
        seen.append({"hook": "cache", **kwargs})
        return None

    def earlier_post_hook(**kwargs: Any) -> Any:
        seen.append({"hook": "post", **kwargs})
        return None

    monkeypatch.setattr(compile_watch, "_watch", compile_watch._Watch())
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", earlier_cache_hook)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", earlier_post_hook)
    return seen


_KERNELS: dict[str, Any] = {}  # one stand-in JITFunction per name, as Triton passes the same one


def _compile(key: Any, name: str, seconds: float, clock: list[float]) -> Any:
    """What Triton does around one compile: the cache hook, the compile, the post-compile hook."""
    jit = _KERNELS.setdefault(name, object())
    fn = types.SimpleNamespace(module="hotloop.kernels.x", name=name, jit_function=jit)
    info = {"key": key, "constants": {"BLOCK_N": 64}, "num_warps": 4, "num_stages": 2}
    kw = dict(key=key, repr=name, fn=fn, compile=info, is_manual_warmup=False, already_compiled=False)
    out = knobs.runtime.jit_cache_hook(**kw)
    clock[0] += seconds
    knobs.runtime.jit_post_compile_hook(**kw)
    return out


def test_counts_before_and_after_arming_and_chains_earlier_hooks(
    fresh: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, logs: pytest.LogCaptureFixture
) -> None:
    clock = [100.0]
    monkeypatch.setattr(compile_watch.time, "perf_counter", lambda: clock[0])
    assert compile_watch.install()
    assert compile_watch.install()  # once per process: a second call changes nothing
    assert _compile("k1", "_prefill_kernel", 1.5, clock) is None  # a None answer: Triton compiles
    assert _compile("k2", "_decode_kernel", 0.25, clock) is None
    assert compile_watch.stats() == compile_watch.CompileStats(2, 1.75, 0, 0.0)
    assert not [r for r in logs.records if "compiled" in r.getMessage()]
    compile_watch.arm()
    _compile("k3", "_prefill_kernel", 1.25, clock)
    _compile("k4", "_merge_kernel", 0.01, clock)  # a disk-cache load: reported all the same
    s = compile_watch.stats()
    assert (s.startup, s.serving) == (2, 2) and s.serving_s == pytest.approx(1.26)
    warned = [r for r in logs.records if "after the warm-up" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING, logging.WARNING]
    assert "_prefill_kernel" in warned[0].getMessage() and "_merge_kernel" in warned[1].getMessage()
    assert "1.25 s" in warned[0].getMessage() and "0.01 s" in warned[1].getMessage()
    assert "{'BLOCK_N': 64}" in warned[0].getMessage() and "num_warps 4" in warned[0].getMessage()
    compile_watch.disarm()  # another engine starting in the process: its compiles are start-up
    _compile("k5", "_prefill_kernel", 0.5, clock)
    s = compile_watch.stats()
    assert (s.startup, s.serving) == (3, 2)
    assert len([r for r in logs.records if "after the warm-up" in r.getMessage()]) == 2
    assert compile_watch._watch.started == {}  # every start was matched by its end
    # every call reached the hooks that were set before
    assert [(x["hook"], x["key"]) for x in fresh] == [
        ("cache", "k1"), ("post", "k1"), ("cache", "k2"), ("post", "k2"),
        ("cache", "k3"), ("post", "k3"), ("cache", "k4"), ("post", "k4"), ("cache", "k5"), ("post", "k5"),
    ]  # fmt: skip


def test_two_kernels_with_one_key_are_timed_apart(
    fresh: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton's key names the specialization, not the kernel: two kernels compiling the same key
    (nested, as a compile that launches another would) keep their own start times."""
    clock = [0.0]
    monkeypatch.setattr(compile_watch.time, "perf_counter", lambda: clock[0])
    compile_watch.install()
    a = types.SimpleNamespace(name="a", jit_function=object())
    b = types.SimpleNamespace(name="b", jit_function=object())
    kw: dict[str, Any] = dict(key="same", repr="", compile={}, is_manual_warmup=False, already_compiled=False)
    knobs.runtime.jit_cache_hook(fn=a, **kw)
    clock[0] = 1.0
    knobs.runtime.jit_cache_hook(fn=b, **kw)
    clock[0] = 1.5
    knobs.runtime.jit_post_compile_hook(fn=b, **kw)
    clock[0] = 3.0
    knobs.runtime.jit_post_compile_hook(fn=a, **kw)
    assert compile_watch.stats().startup_s == pytest.approx(0.5 + 3.0)


def test_an_earlier_cache_hook_can_still_skip_the_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_watch, "_watch", compile_watch._Watch())
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: True)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    compile_watch.install()
    fn = types.SimpleNamespace(name="x", jit_function=object())
    kw = dict(key="k", repr="x", fn=fn, compile={}, is_manual_warmup=False, already_compiled=False)
    assert knobs.runtime.jit_cache_hook(**kw) is True
    assert compile_watch._watch.started == {}  # no post-compile call follows a skip: nothing left


@pytest.mark.gpu
def test_a_real_compile_after_the_warm_up_is_reported(
    fresh: list[dict[str, Any]], logs: pytest.LogCaptureFixture
) -> None:
    import triton.language as tl

    @triton.jit
    def _probe(x_ptr, C: tl.constexpr):
        tl.store(x_ptr, C)

    compile_watch.install()
    x = torch.zeros(1, dtype=torch.int32, device="cuda")
    _probe[(1,)](x, C=1)
    before = compile_watch.stats()
    assert before.startup >= 1 and before.serving == 0
    compile_watch.arm()
    value = random.randrange(2, 1 << 20)  # a constexpr no earlier run compiled
    _probe[(1,)](x, C=value)
    _probe[(1,)](x, C=value)  # in the process's cache now: no second report
    torch.cuda.synchronize()
    assert int(x.item()) == value
    assert compile_watch.stats().serving == 1
    assert any("_probe" in r.getMessage() and "after the warm-up" in r.getMessage() for r in logs.records)
