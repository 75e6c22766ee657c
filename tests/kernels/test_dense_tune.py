"""cuBLASLt with a chosen algorithm (``kernels/cublaslt.py``) and the per-shape choice for captured
decode graphs (``kernels/dense_tune.py``), against ``F.linear`` and a float32 matmul."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from hotloop.kernels import cublaslt, dense_tune
from hotloop.utils import env as env_mod


def _operands(m: int, n: int, k: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(m * 131 + n * 7 + k)
    x = torch.randn(m, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
    return x, w


@pytest.mark.parametrize("bias", [False, True])
def test_cpu_linear_is_f_linear_even_while_tuning(bias: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dense_tune.ENV, "1")
    x, w = _operands(5, 24, 16, torch.float32, "cpu")
    b = torch.randn(24) if bias else None
    with dense_tune.tuning():
        got = dense_tune.linear(x, w, b)
    assert torch.equal(got, F.linear(x, w, b))
    assert not dense_tune.choices()


def test_tuning_block_nests_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dense_tune.ENV, "0")
    with dense_tune.tuning():
        assert dense_tune._state["tuning"] == 0  # off: the block times nothing
    monkeypatch.setenv(dense_tune.ENV, "1")
    assert dense_tune._state["tuning"] == 0
    with dense_tune.tuning():
        with dense_tune.tuning():
            assert dense_tune._state["tuning"] == 2
        assert dense_tune._state["tuning"] == 1
    assert dense_tune._state["tuning"] == 0
    with pytest.raises(RuntimeError), dense_tune.tuning():
        raise RuntimeError("boom")
    assert dense_tune._state["tuning"] == 0


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt-in: on only with ``HOTLOOP_DENSE_TUNE=1``."""
    monkeypatch.delenv(dense_tune.ENV, raising=False)
    assert not dense_tune.enabled()
    monkeypatch.setenv(dense_tune.ENV, "0")
    assert not dense_tune.enabled()
    monkeypatch.setenv(dense_tune.ENV, "1")
    assert dense_tune.enabled()
    said: list[str] = []
    monkeypatch.setattr(env_mod, "_warned", set())
    monkeypatch.setattr(dense_tune.logger, "warning", lambda msg, *args: said.append(msg % args))
    monkeypatch.setenv(dense_tune.ENV, "off")  # a wrong value: said once, read as off (the default)
    assert not dense_tune.enabled() and not dense_tune.enabled()
    assert said == ["HOTLOOP_DENSE_TUNE='off': use 0 or 1; taking 0"]


def test_summary_counts_the_shapes_that_took_an_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dense_tune, "_choices", {})
    assert dense_tune.summary() is None
    a = cublaslt.Algo((0,) * 8, 0, 1.0, 66, 1, 1, 1)
    monkeypatch.setattr(
        dense_tune,
        "_choices",
        {
            (0, torch.bfloat16, 256, 4096, 14336): dense_tune.Choice(a, 60.0, 52.5),
            (0, torch.bfloat16, 256, 4096, 4096): dense_tune.Choice(None, 17.8, 17.8),
        },
    )
    assert dense_tune.summary() == (
        "dense GEMMs: a timed cuBLASLt algorithm for 1 of 2 shapes (7.5 us less per launch of each, summed)"
    )


def test_operand_errors_name_the_operand() -> None:
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        cublaslt.heuristics(torch.device("cpu"), torch.float32, 4, 8, 8)
    with pytest.raises(ValueError, match="m=0"):
        cublaslt.heuristics(torch.device("cpu"), torch.bfloat16, 0, 8, 8)
    a = cublaslt.Algo((0,) * 8, 0, 1.0, 66, 1, 1, 1)
    x, w = _operands(4, 8, 16, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="weight \\[N, K\\]"):
        cublaslt.matmul(x, w[:, :8].contiguous(), a)
    with pytest.raises(ValueError, match="one dtype"):
        cublaslt.matmul(x, w.half(), a)
    assert not cublaslt.available(torch.device("cpu"))
    assert "algo 66" in a.describe()


def test_choice_times_only_in_a_warm_up_and_keeps_what_beats_f_linear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``_choice`` (CPU, with the timing and the capture state stubbed): nothing is timed outside a
    warm-up or inside a capture; a timed choice is remembered and stored; an algorithm is kept only
    when it beats ``F.linear`` by ``MIN_GAIN``."""
    a = cublaslt.Algo((1,) * 8, 0, 1.0, 66, 7, 1, 3)
    stored: dict[tuple, dense_tune.Choice] = {}
    monkeypatch.setattr(dense_tune, "_choices", {})
    monkeypatch.setattr(dense_tune, "_key", lambda x2, w: ("k", x2.shape[0]))
    monkeypatch.setattr(dense_tune, "_from_disk", lambda key: None)
    monkeypatch.setattr(dense_tune, "_to_disk", lambda key, c: stored.__setitem__(key, c))
    timed: list[int] = []
    monkeypatch.setattr(dense_tune, "_tune", lambda x2, w: timed.append(1) or dense_tune.Choice(a, 10.0, 9.0))
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setenv(dense_tune.ENV, "1")
    x, w = torch.zeros(4, 8), torch.zeros(16, 8)
    assert dense_tune._choice(x, w) is None and not timed  # not in a warm-up
    with dense_tune.tuning():
        capturing[0] = True
        assert dense_tune._choice(x, w) is None and not timed  # inside a capture
        capturing[0] = False
        c = dense_tune._choice(x, w)
    assert c is not None and c.algo == a and timed == [1] and stored == {("k", 4): c}
    assert dense_tune._choice(x, w) is c and timed == [1]  # remembered, also outside the warm-up


def test_tune_keeps_f_linear_unless_an_algorithm_wins_by_min_gain(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_tune``'s decision with the times stubbed: 3% faster is needed; a wrong output is skipped."""
    from hotloop.kernels import w4a16_gemm

    algos = [cublaslt.Algo((i,) * 8, 0, 1.0, 66, i, 1, 3) for i in (1, 2)]
    times = {"F": 10.0, 1: 9.8, 2: 9.0}
    wrong: set[int] = set()

    def fake_time(fn: object, device: object) -> float:
        d = getattr(fn, "args", None)
        return times["F"] if d is None else times[d[2].tile_id]

    monkeypatch.setattr(w4a16_gemm, "graph_time_us", fake_time)
    monkeypatch.setattr(cublaslt, "heuristics", lambda *a, **kw: algos)
    monkeypatch.setattr(
        cublaslt,
        "matmul",
        lambda x, w, a, out=None: F.linear(x, w) + (1.0 if a.tile_id in wrong else 0.0),
    )
    x, w = _operands(4, 8, 16, torch.float32, "cpu")
    c = dense_tune._tune(x, w)
    assert c.algo == algos[1] and (c.flinear_us, c.best_us) == (10.0, 9.0)
    wrong.add(2)  # the fastest computes something else: the next one wins by only 2%, so F.linear
    c = dense_tune._tune(x, w)
    assert c.algo is None and c.best_us == 10.0


def _gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if not cublaslt.available(torch.device("cuda")):
        pytest.skip("libcublasLt does not load here")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m", [1, 16, 256])
@pytest.mark.parametrize("n,k", [(4096, 4096), (6144, 4096), (4096, 14336), (1000, 200)])
def test_gpu_every_offered_algorithm_matches_float32(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    """Each algorithm the heuristic offers computes x @ W^T: within 16-bit rounding of float32."""
    _gpu()
    x, w = _operands(m, n, k, dtype, "cuda")
    ref = x.float() @ w.float().t()
    algos = cublaslt.heuristics(torch.device("cuda"), dtype, m, n, k)
    assert algos, "the heuristic offered no algorithm"
    scale = float(ref.abs().max())
    for a in algos:
        y = cublaslt.matmul(x, w, a)
        assert y.shape == (m, n) and y.dtype == dtype
        err = float((y.float() - ref).abs().max())
        assert err <= 8e-3 * scale + 1e-3, (a.describe(), err, scale)


@pytest.mark.gpu
def test_gpu_captured_launch_takes_the_chosen_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every offered algorithm acceptable (MIN_GAIN -1: even a 2x slower one), the warm-up
    chooses one, and the decode capture's launch runs it (counted) and replays what it computes
    eagerly; a capture outside ``decode_capture`` keeps F.linear."""
    _gpu()
    monkeypatch.setenv(dense_tune.ENV, "1")
    monkeypatch.setenv("HOTLOOP_TUNING_CACHE", "0")
    monkeypatch.setattr(dense_tune, "MIN_GAIN", -1.0)
    monkeypatch.setattr(dense_tune, "_choices", {})
    monkeypatch.setattr(dense_tune, "_disk", None)
    x, w = _operands(64, 4096, 4096, torch.bfloat16, "cuda")
    assert torch.equal(dense_tune.linear(x, w), F.linear(x, w))  # outside the decode capture: F.linear
    with dense_tune.decode_capture():
        assert torch.equal(dense_tune.linear(x, w), F.linear(x, w))  # eager, outside a warm-up
        assert not dense_tune.choices()
        with dense_tune.tuning():
            warm = dense_tune.linear(x, w)
    ((key, choice),) = dense_tune.choices().items()
    assert key[2:] == (64, 4096, 4096) and choice.algo is not None
    assert torch.equal(warm, cublaslt.matmul(x, w, choice.algo))
    real = cublaslt.matmul
    calls: list[int] = []

    def spy(*a: object, **kw: object) -> torch.Tensor:
        calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(cublaslt, "matmul", spy)

    def capture(active: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        xs = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), contextlib.ExitStack() as stack:
            if active:
                stack.enter_context(dense_tune.decode_capture())
            with torch.cuda.graph(g, stream=s):
                out = dense_tune.linear(xs, w)
        torch.cuda.current_stream().wait_stream(s)
        return g, xs, out

    g, xs, out = capture(active=True)
    assert len(calls) == 1
    xs.copy_(x * 0.5)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, real(x * 0.5, w, choice.algo))
    ref = F.linear(x * 0.5, w).float()
    assert float((out.float() - ref).abs().max()) <= 1e-2 * float(ref.abs().max())
    g, xs, out = capture(active=False)  # e.g. the piecewise graphs: F.linear
    assert len(calls) == 1
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, F.linear(x, w))


@pytest.mark.gpu
def test_gpu_unknown_shape_in_a_capture_and_switch_off_keep_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape not timed in a warm-up is never timed inside a capture: F.linear is captured. With
    the switch off nothing is timed at all."""
    _gpu()
    monkeypatch.setenv(dense_tune.ENV, "1")
    monkeypatch.setattr(dense_tune, "_choices", {})
    x, w = _operands(48, 1024, 512, torch.float16, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), dense_tune.decode_capture(), torch.cuda.graph(g, stream=s):
        out = dense_tune.linear(x, w)
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, F.linear(x, w))
    assert not dense_tune.choices()
    monkeypatch.setenv(dense_tune.ENV, "0")
    with dense_tune.decode_capture(), dense_tune.tuning():
        assert torch.equal(dense_tune.linear(x, w), F.linear(x, w))
    assert not dense_tune.choices()
