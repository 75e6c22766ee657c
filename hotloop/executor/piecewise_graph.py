"""Piecewise CUDA graphs for prefill and mixed steps: everything but attention, replayed per layer.

An eager step of a Llama-family model costs tens of milliseconds of host time (about 10 launches a
layer, each through Python), more than the GPU needs for a few hundred tokens. Attention cannot be
captured once for all steps (its launch depends on how the tokens split into sequences), but the
rest of a layer is row-wise: the same kernels whatever the batch, for a given token count. So for
padded token counts ``T`` (buckets) the runner captures ``L + 1`` pieces per bucket:

- piece 0: embedding, then layer 0's input norm and q/k/v projection;
- piece i: layer i-1's o_proj, norm and MLP, then layer i's input norm and q/k/v projection;
- piece L: layer L-1's o_proj, norm and MLP, then the final norm.

Pieces communicate through static buffers (token ids, q/k/v, residual, attention output, hidden).
Between two pieces the eager part runs attention (rotary + KV write + the paged kernels) on the
step's real tokens only: the first layer's launches go through the launchers and are recorded, the
other layers' are replayed onto their own caches (``kernels/launch_replay.py``, a few microseconds a
launch instead of tens); the padding rows of the buffers hold stale values that no real row reads
(every captured op is row-wise). All graphs share one memory pool and are replayed in the order
they were captured (largest bucket first), which lets a piece reuse the previous one's scratch.

``capture=False`` runs the same pieces over the same buffers without graphs (for the CPU tests).

Large steps at their exact count (``eager_from``, through ``HOTLOOP_PIECEWISE_EAGER_FROM``: ``auto``
by default, the smallest bucket whose replay takes ``EAGER_MARGIN`` times the eager pieces' host time,
measured after the capture by ``_measure_eager_from``; a token count; or ``off``): a graph runs its
bucket's padded rows, up to 12.5% more GEMM work than the step's tokens need. Where a step's GPU time
is well above the host time of launching its pieces eagerly, the pieces run eagerly over the step's
own rows instead, rounded up to a multiple of 16 (attention is still replayed). Why ``auto`` is the
default (the measurements): ``eager_from_env``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from hotloop.kernels import launch_replay
from hotloop.kernels.paged_decode_attention import FUSE_MERGE
from hotloop.layers.attention import AttentionMetadata, PagedAttention
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

EAGER_ENV = "HOTLOOP_PIECEWISE_EAGER_FROM"
# a step runs its pieces eagerly only where its bucket's replay takes this many times the host time
# of launching the pieces eagerly (so that the host stays ahead of the GPU with time to spare)
EAGER_MARGIN = 2.5


def eager_from_env() -> int | str | None:
    """``HOTLOOP_PIECEWISE_EAGER_FROM``: ``"auto"`` (unset or empty: the default; the threshold is
    measured after the capture, and is None where no bucket's replay is long enough, as for small
    models, whose steps are host-bound), a token count >= 1, or None (``off``, ``0``, ``none``: every
    step replays its bucket's graphs).

    Why ``auto`` is the default (docs/performance.md; benchmarks/results/gpu_2026-12-07d): on two H100
    hosts with Llama-3-8B it measured 1,152 and 1,280 tokens, so a single 1,024-token prompt's mixed
    step keeps its graphs while steps carrying two or more prompts run over their own rows (51.6 against
    57.3 ms), and issue 3's serving run was ahead of ``off`` in every alternating run on every latency
    figure (p99 TTFT 115-131 against 139-140 ms, p99 ITL 41.5-43.9 against 54.7-56.1, medians 0.4-5%
    lower).
    A fixed 1,024 is worse: an eager step's launches take 9-12 ms of host time in front of the first
    token (median TTFT 48.6 -> 54.6 ms, gpu_2026-12-06k). Not yet measured on an H200."""
    raw = os.environ.get(EAGER_ENV, "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    if raw in ("off", "0", "none"):
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{EAGER_ENV}={raw!r} must be a token count >= 1 (steps of that many tokens or more run "
            "eagerly at their exact count), 'off', or 'auto' (the default: measured at start)"
        )
    return value


def token_buckets(max_tokens: int, smallest: int = 16) -> list[int]:
    """Padded token counts: 16, 32, 48, ... with eight steps per power of two (at most 12.5%
    padding past 128 tokens), ending at ``max_tokens``.

    32 steps per power of two were timed against 8 on an H100 (thirty-ninth session,
    benchmarks/results/gpu_2026-12-06j): the serving mix's 1,024 + 16 tokens then pad to 1,056 rows
    instead of 1,152, but cuBLAS ran the 8B GEMMs no faster at 1,056 rows than at 1,152 (660 against
    645 us a layer; 600 at exactly 1,040); the mixed step took 29.37 against 29.58 ms, serving's median
    TPOT was 10.98 against 11.14 ms (one run each), and the capture took 16.3 s against 5.0."""
    sizes = []
    b = smallest
    while b < max_tokens:
        sizes.append(b)
        step = max(smallest, (1 << (b.bit_length() - 1)) // 8)
        b += step
    sizes.append(max_tokens)
    return sizes


def supports(model: Any) -> bool:
    """Whether ``model`` is a text model of the Llama decoder family, which the pieces are cut from
    (vision-language models run their prefill eagerly)."""
    from hotloop.models.llama import LlamaForCausalLM

    return isinstance(model, LlamaForCausalLM) and len(model.model.layers) > 0


def _attention_key(attn: PagedAttention) -> tuple[Any, ...]:
    """What makes two layers' attention launches the same but for their caches."""
    return (type(attn), attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scale, attn.sliding_window)


def packed_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """The one ``[T, q + 2 kv]`` tensor whose column slices ``q``, ``k`` and ``v`` are, side by side
    in that order (the fused q/k/v projection's output, split), or None when they are not (q/k
    normed, say). Copying it whole is one contiguous copy; the three slices' copies were three
    strided launches (0.7 ms of a 1,024-token mixed step's 29 on an H200, thirty-fourth session)."""
    if q.dim() != 2 or k.dim() != 2 or v.dim() != 2 or not (q.dtype == k.dtype == v.dtype):
        return None
    if q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr() or (
        k.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
    ):
        return None
    t, qs = q.shape
    ks = k.shape[1]
    row = qs + 2 * ks
    if k.shape[0] != t or v.shape != k.shape:
        return None
    if any(x.stride() != (row, 1) for x in (q, k, v)):
        return None
    e = q.element_size()
    if k.data_ptr() != q.data_ptr() + qs * e or v.data_ptr() != k.data_ptr() + ks * e:
        return None
    return q.as_strided((t, row), (row, 1))


class PiecewiseGraphs:
    """Captured pieces per token bucket; ``run(num_tokens, positions, meta)`` runs one step."""

    def __init__(
        self,
        model: Any,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        input_ids: torch.Tensor,
        max_tokens: int,
        capture: bool = True,
        progress: bool = True,
        eager_from: int | str | None = None,
    ) -> None:
        """``eager_from``: steps of at least this many tokens run the pieces eagerly over their
        exact rows (``exact_rows``); ``"auto"`` measures it after the capture (None without
        one), None never."""
        if eager_from not in ("auto", None) and (not isinstance(eager_from, int) or eager_from < 1):
            raise ValueError(f"eager_from={eager_from!r} must be a token count >= 1, 'auto' or None")
        self.model = model
        self.inner = model.model
        self.layers = list(self.inner.layers)
        self.kv_caches = kv_caches
        self.input_ids = input_ids  # the runner's static token-id buffer
        self.capture = capture
        attn = self.layers[0].self_attn
        qkv = attn.qkv_proj
        self.q_size = qkv.num_heads * qkv.head_dim
        self.kv_size = qkv.num_kv_heads * qkv.head_dim
        self.max_tokens = min(max_tokens, input_ids.shape[0])
        self.buckets = token_buckets(self.max_tokens)
        ref = self.inner.embed_tokens.weight
        hidden = ref.shape[1]
        dev, dtype = input_ids.device, ref.dtype
        n = self.max_tokens
        self.qkv = torch.zeros(n, self.q_size + 2 * self.kv_size, dtype=dtype, device=dev)
        self.residual = torch.zeros(n, hidden, dtype=dtype, device=dev)
        self.attn_out = torch.zeros(n, self.q_size, dtype=dtype, device=dev)
        self.hidden = torch.zeros(n, hidden, dtype=dtype, device=dev)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.pool: Any = None
        # The fused merge everywhere (HOTLOOP_DECODE_FUSED_MERGE=1) was never timed or tested with
        # replay: it keeps the launchers. (By default only the decode graphs fuse it.)
        self.replay_attention = capture and FUSE_MERGE is not True and launch_replay.available(dev)
        self.attention_keys = [_attention_key(layer.self_attn.attn) for layer in self.layers]
        self.eager_from: int | None = None
        self.num_exact_steps = 0  # steps run eagerly at their exact count
        if capture:
            self._capture(progress)
        if eager_from == "auto":
            self.eager_from = self._measure_eager_from() if capture else None
        elif isinstance(eager_from, int):
            self.eager_from = eager_from

    # -- the pieces ---------------------------------------------------------------------------
    def _store(self, tp: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, res: torch.Tensor) -> None:
        qs, ks = self.q_size, self.kv_size
        buf = self.qkv[:tp]
        whole = packed_qkv(q, k, v)
        if whole is not None:  # one contiguous copy instead of three strided ones
            buf.copy_(whole)
        else:
            buf[:, :qs].copy_(q)
            buf[:, qs : qs + ks].copy_(k)
            buf[:, qs + ks :].copy_(v)
        self.residual[:tp].copy_(res)

    def _piece(self, i: int, tp: int) -> None:
        if i == 0:
            h = self.inner.embed_tokens(self.input_ids[:tp])
            q, k, v, res = self.layers[0].pre_attention(h, None)
            self._store(tp, q, k, v, res)
            return
        h, res = self.layers[i - 1].post_attention(self.attn_out[:tp], self.residual[:tp])
        if i < len(self.layers):
            q, k, v, res = self.layers[i].pre_attention(h, res)
            self._store(tp, q, k, v, res)
        else:
            self.hidden[:tp].copy_(self.inner.norm(h, res)[0])

    @property
    def num_pieces(self) -> int:
        return len(self.layers) + 1

    @torch.inference_mode()
    def _capture(self, progress: bool) -> None:
        t0 = time.perf_counter()
        sizes = sorted(self.buckets, reverse=True)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(sizes), desc="capturing prefill graphs", unit="bucket", leave=False)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for tp in sizes:
                graphs = []
                for i in range(self.num_pieces):
                    self._piece(i, tp)  # warm-up: compiles / autotunes kernels outside the capture
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=self.pool, stream=stream):
                        self._piece(i, tp)
                    if self.pool is None:
                        self.pool = g.pool()
                    graphs.append(g)
                self.graphs[tp] = graphs
                if bar is not None:
                    bar.update(1)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        if bar is not None:
            bar.close()
        logger.info(
            "captured %d prefill graph pieces (%d token buckets up to %d) in %.1f s",
            len(sizes) * self.num_pieces,
            len(sizes),
            self.max_tokens,
            time.perf_counter() - t0,
        )

    @torch.inference_mode()
    def _measure_eager_from(self) -> int | None:
        """The smallest bucket whose replay takes at least ``EAGER_MARGIN`` times the host time of the
        eager pieces (None: none does), found by bisection over the buckets on the assumption that
        replay times grow with the bucket (about log2 of their number are timed). The host time is
        the pieces' launch loop at the smallest bucket, attention not included (its kernels queue
        behind it); the replay times are CUDA-event times. Replays touch no KV cache (no attention)."""
        t0 = time.perf_counter()
        small = self.buckets[0]
        host = float("inf")
        for _ in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for i in range(self.num_pieces):
                self._piece(i, small)
            host = min(host, time.perf_counter() - start)
        torch.cuda.synchronize()

        def gpu_s(tp: int) -> float:
            graphs = self.graphs[tp]
            best = float("inf")
            for _ in range(2):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                for g in graphs:
                    g.replay()
                end.record()
                end.synchronize()
                best = min(best, begin.elapsed_time(end) / 1e3)
            return best

        lo, hi = 0, len(self.buckets)  # the answer's index lies in [lo, hi]; hi: none
        times: dict[int, float] = {}
        while lo < hi:
            mid = (lo + hi) // 2
            tp = self.buckets[mid]
            times[tp] = gpu_s(tp)
            if times[tp] >= EAGER_MARGIN * host:
                hi = mid
            else:
                lo = mid + 1
        found = self.buckets[lo] if lo < len(self.buckets) else None
        shown = ", ".join(f"{tp}: {1e3 * s:.2f}" for tp, s in sorted(times.items()))
        logger.info(
            "eager pieces from %s tokens (their host time %.2f ms; bucket replays, ms: %s; %.1f s)",
            found if found is not None else "none",
            1e3 * host,
            shown,
            time.perf_counter() - t0,
        )
        return found

    # -- a step -------------------------------------------------------------------------------
    def exact_rows(self, num_tokens: int) -> int | None:
        """The rows a step of ``num_tokens`` runs its pieces eagerly over, or None (its bucket's
        graphs): from ``eager_from`` tokens, the count rounded up to a multiple of 16 where that is
        below the bucket. (Multiples of 16 keep the Triton kernels' row-count specializations the
        warm-up compiled, as the buckets are.)"""
        if self.eager_from is None or num_tokens < self.eager_from:
            return None
        rows = -(-num_tokens // 16) * 16
        tp = self.bucket_for(num_tokens)
        return rows if tp is not None and rows < tp else None

    def bucket_for(self, num_tokens: int) -> int | None:
        for b in self.buckets:
            if b >= num_tokens:
                return b
        return None

    def run(self, num_tokens: int, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The final-normed hidden states ``[num_tokens, hidden]`` of a step whose token ids are in
        the runner's buffer (a view of a static buffer, valid until the next step)."""
        tp = self.bucket_for(num_tokens)
        assert tp is not None, f"{num_tokens} tokens exceed the largest bucket {self.max_tokens}"
        t = num_tokens
        rows = self.exact_rows(t)
        if rows is not None:
            tp = rows
            self.num_exact_steps += 1
            graphs = None
        else:
            graphs = self.graphs.get(tp) if self.capture else None
        cos_sin = self.inner.rotary_emb.cos_sin(positions[:t])
        qs, ks = self.q_size, self.kv_size
        qkv = self.qkv[:t]
        q, k, v = qkv[:, :qs], qkv[:, qs : qs + ks], qkv[:, qs + ks :]
        out = self.attn_out[:t]
        # One layer's attention launches are recorded, the others' replayed onto their caches.
        plans: dict[tuple[Any, ...], launch_replay.LaunchPlan] | None = {} if self.replay_attention else None
        for i in range(self.num_pieces):
            if graphs is not None:
                graphs[i].replay()
            else:
                self._piece(i, tp)
            if i == len(self.layers):
                break
            attn = self.layers[i].self_attn.attn
            cache = self.kv_caches[i]
            if plans is None:
                attn(q, k, v, cache, meta, cos_sin, out=out)
                continue
            key = self.attention_keys[i]
            plan = plans.get(key)
            if plan is None:  # the first layer of its kind this step: launch and record
                with launch_replay.record(cache) as plan:
                    attn(q, k, v, cache, meta, cos_sin, out=out)
                plans[key] = plan
            elif plan.matches(cache):
                plan.replay(cache, check=False)
            else:  # an invalid plan, or a cache of another layout: launch directly
                attn(q, k, v, cache, meta, cos_sin, out=out)
        return self.hidden[:t]
