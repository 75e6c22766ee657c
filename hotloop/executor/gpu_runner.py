"""The GPU model runner: persistent input buffers, decode steps replayed from CUDA graphs.

A decode-only step whose batch fits a captured bucket replays that graph (model, LM head and greedy
argmax in one launch); other steps (prefill, chunked prefill, mixed) replay piecewise graphs (every
layer but its attention, ``piecewise_graph.py``) with attention launched eagerly between pieces. When every row is plain greedy the graph's argmax is the answer and
the sampler is skipped. ``launch`` ends with an asynchronous copy of the sampled ids into pinned
memory and an event; ``collect`` waits on that event only, so the host can prepare and launch the
next step while this one runs (overlapped scheduling, see ``engine.engine``).
"""

from __future__ import annotations

import time

import torch

from hotloop.engine.outputs import SampledToken
from hotloop.engine.request import Request
from hotloop.engine.scheduler import SchedulerOutput, multi_step_ok
from hotloop.executor import piecewise_graph
from hotloop.executor.cuda_graph import DecodeGraphs
from hotloop.executor.gpu_inputs import InputBuffers, StepInputs
from hotloop.executor.model_runner import (
    CausalLM,
    ModelRunner,
    StepHandle,
    compute_prompt_logprobs,
    last_inputs,
    prompt_logprob_rows,
)
from hotloop.executor.piecewise_graph import PiecewiseGraphs
from hotloop.executor.sampler import SamplerOutput
from hotloop.kernels import ops
from hotloop.layers.attention import AttentionMetadata
from hotloop.vl import merge, mrope

# Multi-step decode: the next launch is prepared once the previous one has this many steps left on
# the GPU (enough to hide the host's launch work; more queued graphs only make launches wait).
RUN_AHEAD_STEPS = 2


class GpuModelRunner(ModelRunner):
    """``ModelRunner`` for CUDA: same contract, faster inputs, graphs for decode."""

    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        device: torch.device,
        max_batch_size: int,
        max_num_tokens: int,
        session_len: int,
        use_cuda_graph: bool = True,
        vision_max_batch_size: int = 16,
        measure_step_time: bool = False,
    ) -> None:
        super().__init__(model, kv_caches, block_size, device, vision_max_batch_size)
        # Device time of recent steps by kind (``estimate_s``; the engine's just-in-time scheduling)
        self.measure_step_time = measure_step_time and device.type == "cuda"
        self.step_time_s: dict[tuple[str, int], float] = {}
        width = -(-session_len // block_size) + 1
        self.buffers = InputBuffers(max_num_tokens, max_batch_size, width, block_size, device)
        # pending ids gathered out of order (patch_pending): a persistent buffer, so that the gather
        # allocates nothing on the step's host path (suspected, not confirmed: in a profile on an H200
        # host, 5 such gathers in 40 batch-256 steps held the host 3.2 ms each)
        self._gathered = torch.empty(max_batch_size, dtype=torch.long, device=device)
        self.graphs: DecodeGraphs | None = None
        if device.type == "cuda":
            precompile_attention(model, kv_caches, device, self.buffers.width)
            precompile_step_kernels(block_size, device)
        self.piecewise: PiecewiseGraphs | None = None
        if use_cuda_graph:
            self.graphs = DecodeGraphs(model, kv_caches, self.buffers, max_batch_size)
            if piecewise_graph.supports(model):
                self.piecewise = PiecewiseGraphs(
                    model,
                    kv_caches,
                    self.buffers.input_ids,
                    max_num_tokens,
                    eager_from=piecewise_graph.eager_from_env(),
                )
        self.num_piecewise_steps = 0
        self._staged = False  # whether this step's inputs went through self.buffers
        self.num_graph_steps = 0
        self.num_eager_steps = 0
        self.wait_s = 0.0  # host time spent waiting for the sampled ids (the GPU's share of a step)
        self._kind: tuple[str, int] | None = None
        self._history: torch.Tensor | None = None  # [steps, max_seqs] ids of a multi-step launch
        # multi-step launches run from the decode graphs only (eager mode runs one step)
        self.supports_multi_step = self.graphs is not None

    def prepare(
        self, out: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        self._staged = self.buffers.fits(out)
        if not self._staged:
            return super().prepare(out)
        step = self.buffers.prepare(out)
        self._patch(step)
        return step.input_ids, step.positions, step.meta, step.logits_rows

    def _patch(self, step: StepInputs) -> None:
        if step.pending_dst is not None and step.pending_reqs:
            self.patch_pending(step.input_ids, step.pending_dst, step.pending_reqs, step.pending_dense)

    def _graph_bucket(self, out: SchedulerOutput) -> int | None:
        """The decode graph that runs ``out``, or None (an eager or piecewise step): every row one
        sampled token whose block table fits the buffers, no image token, no 3-D positions. One
        pass over the rows (this runs every step, at batch 256 too)."""
        g = self.graphs
        scheduled = out.scheduled
        b = len(scheduled)
        buffers = self.buffers
        if g is None or b > g.max_batch or b > buffers.max_seqs or b > buffers.max_tokens:
            return None
        width = buffers.width
        images = False
        for s in scheduled:
            if s.num_tokens != 1 or not s.samples or len(s.request.block_ids) > width:
                return None
            images = images or bool(s.request.mm_inputs) or s.request.mrope_positions is not None
        if images and (merge.has_images(scheduled) or mrope.needs_3d(scheduled)):
            return None
        return g.bucket_for(b)

    def _context(self, out: SchedulerOutput, bucket: int) -> int | None:
        """The step's longest context (tokens in the cache, its own included) where ``bucket`` has
        short-context graphs to choose from (``DecodeGraphs.key_for``), else None."""
        g = self.graphs
        if g is None or bucket not in g.short_limits:
            return None
        return max(s.start + s.num_tokens for s in out.scheduled)

    def _step_kind(self, out: SchedulerOutput, bucket: int | None) -> tuple[str, int]:
        if bucket is not None:
            context = self._context(out, bucket)
            if context is not None and self.graphs is not None:  # short-context graphs time apart
                cap = self.graphs.key_for(bucket, context)[1]
                return (f"graph/{cap}" if cap else "graph", bucket)
            return ("graph", bucket)
        tokens = sum(s.num_tokens for s in out.scheduled)
        return ("eager", 1 << max(0, tokens - 1).bit_length())

    def estimate_s(self, out: SchedulerOutput) -> float | None:
        """Expected device time of ``out`` from recent steps of its kind (None: none measured yet)."""
        if not self.measure_step_time:
            return None
        return self.step_time_s.get(self._step_kind(out, self._graph_bucket(out)))

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, steps: int = 1) -> StepHandle:
        """``ModelRunner.launch``; a multi-step launch (``steps`` > 1) runs only on the decode-graph
        path (elsewhere one step runs, and the handle says so)."""
        start_event = None
        if self.measure_step_time:
            start_event = torch.cuda.Event(enable_timing=True)
            start_event.record()
        handle = self._launch(out, steps)
        if start_event is not None and handle.event is not None and handle.steps == 1:
            handle.start_event = start_event  # (a multi-step launch is not a step kind's sample)
        return handle

    def _launch(self, out: SchedulerOutput, steps: int = 1) -> StepHandle:
        last = self._last
        if last is not None and last.ahead_event is not None:
            # bounded run-ahead: wait until the previous multi-step launch has RUN_AHEAD_STEPS steps
            # left (a wait for the GPU, counted as such), so that a deep queue of graph replays never
            # makes a later kernel launch on the host block for queue space
            t0 = time.perf_counter()
            last.ahead_event.synchronize()
            self.wait_s += time.perf_counter() - t0
            last.ahead_event = None
        mrope.ensure_positions(out.scheduled)
        reqs = [s.request for s in out.scheduled if s.samples]
        g = self.graphs
        b = len(out.scheduled)
        bucket = self._graph_bucket(out)
        self._kind = self._step_kind(out, bucket) if self.measure_step_time else None
        if g is not None and bucket is not None:
            self._staged = True
            self._patch(self.buffers.prepare(out, padded_seqs=bucket))
            context = self._context(out, bucket)
            logits, greedy = g.run(bucket, context)
            self.num_graph_steps += 1
            if steps > 1 and multi_step_ok(out):
                return self._graph_steps(g, bucket, logits, greedy, reqs, steps, context)
            return self._sample(logits[:b], greedy[:b], reqs)
        self.num_eager_steps += 1
        ids, pos, meta, rows = self.prepare(out)
        pos = mrope.step_positions(out.scheduled, pos)
        pw = self.piecewise
        if (
            pw is not None
            and pos.dim() == 1
            and ids.data_ptr() == self.buffers.input_ids.data_ptr()  # inputs are in the static buffers
            and pw.bucket_for(ids.shape[0]) is not None
            and not merge.has_images(out.scheduled)
        ):
            hidden = pw.run(ids.shape[0], pos, meta)
            self.num_piecewise_steps += 1
        else:
            hidden = self.model(ids, pos, self.kv_caches, meta, **self.multimodal_kwargs(out, ids))
        prompt_rows = prompt_logprob_rows(out.scheduled)
        # (queued before the next step's kernels, which may reuse ``hidden``'s static buffer)
        prompt_lps = compute_prompt_logprobs(self.model, hidden, prompt_rows) if prompt_rows else None
        if not reqs:
            handle = self._launched([], None)
        else:
            # the model dtype is enough: greedy rows take torch.argmax here and the sampler widens to
            # float32 itself (the same values), so a multi-row step saves the cast of its logits
            logits = self.model.compute_logits(hidden[self.index_tensor(rows, 1)], float32=False)
            handle = self._sample(logits, None, reqs)
        handle.prompt_lps = prompt_lps
        return handle

    def _graph_steps(
        self,
        g: DecodeGraphs,
        bucket: int,
        logits: torch.Tensor,
        greedy: torch.Tensor,
        reqs: list[Request],
        steps: int,
        context: int | None = None,
    ) -> StepHandle:
        """Decode steps 2 .. ``steps`` of a multi-step launch: between two replays of the decode graph
        one launch (``kernels/decode_advance.py``) turns the step's sampled ids into the next step's
        inputs in the graph's buffers. Sampling is the graph's argmax when every row is plain greedy,
        else the sampler on the graph's logits. One copy of every step's ids to the host at the end.
        ``context``: the first step's longest context (each step adds one token), or None."""
        b = len(reqs)
        if self._history is None or self._history.shape[0] < steps:
            # rows of an even length: each row starts 16-byte aligned, as the kernels were compiled for
            width = self.buffers.max_seqs + self.buffers.max_seqs % 2
            self._history = torch.empty(steps, width, dtype=torch.long, device=self.device)
        history = self._history[:steps, :b]
        md = None if self._all_greedy(reqs) else self._sampling_metadata(reqs)
        buf = self.buffers
        limits = buf.stage_limits(last_inputs(reqs))
        ahead = None
        mark = steps - RUN_AHEAD_STEPS  # the step after which the next launch may be prepared
        if mark == 1 and history.is_cuda:
            ahead = torch.cuda.Event()
            ahead.record()
        for j in range(steps):
            sampled = greedy[:b] if md is None else self.sampler(logits[:b], md).token_ids
            if j == steps - 1:
                history[j].copy_(sampled)
                break
            ops.decode_advance(
                sampled, buf.input_ids, buf.positions, buf.slots, buf.seq_lens, buf.block_tables,
                self.block_size, history[j], limits,
            )  # fmt: skip
            logits, greedy = g.run(bucket, None if context is None else context + j + 1)
            self.num_graph_steps += 1
            if j + 2 == mark and history.is_cuda:  # step j + 2 is queued
                ahead = torch.cuda.Event()
                ahead.record()
        handle = self._launched_steps(reqs, history)
        handle.ahead_event = ahead
        if history.is_cuda:
            handle.host_history = _to_pinned(history)
            handle.event = torch.cuda.Event()
            handle.event.record()
        return handle

    @staticmethod
    def _all_greedy(reqs: list[Request]) -> bool:
        """Every row's token is the argmax (plain greedy, past any ``min_new_tokens`` mask)."""
        return all(
            r.greedy_from is not None
            and (not r.greedy_from or len(r.output_token_ids) + r.num_pending_tokens >= r.greedy_from)
            for r in reqs
        )

    def gather_rows(self, values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        n = index.shape[0]
        if values.dtype != self._gathered.dtype or n > self._gathered.shape[0] or values.dim() != 1:
            return values.index_select(0, index)
        return ops.gather_ids(values.contiguous(), index, self._gathered)

    def index_tensor(self, values: list[int], slot: int) -> torch.Tensor:
        if self._staged:  # inputs of this step went through the pinned buffers
            return self.buffers.stage_indices(values, slot)
        return super().index_tensor(values, slot)

    def _sample(self, logits: torch.Tensor, greedy: torch.Tensor | None, reqs: list[Request]) -> StepHandle:
        """Sample on the device and start copying the result to pinned host memory."""
        if self._all_greedy(reqs):
            ids = greedy if greedy is not None else logits.argmax(dim=-1)
            result = SamplerOutput(ids, None, None, None)
        else:
            result = self.sampler(logits, self._sampling_metadata(reqs))
        handle = self._launched(reqs, result)
        if result.token_ids.is_cuda:  # (the runner also runs on the CPU under TRITON_INTERPRET)
            host_ids = _to_pinned(result.token_ids)
            assert host_ids is not None
            handle.host = SamplerOutput(
                host_ids,
                _to_pinned(result.logprobs),
                _to_pinned(result.top_ids),
                _to_pinned(result.top_logprobs),
            )
            handle.event = torch.cuda.Event(enable_timing=self.measure_step_time)
            handle.event.record()
            handle.kind = self._kind
        return handle

    def collect(self, handle: StepHandle) -> list[SampledToken]:
        self._wait(handle)
        return super().collect(handle)

    def collect_steps(self, handle: StepHandle) -> list[list[int]]:
        self._wait(handle)
        return super().collect_steps(handle)

    def _wait(self, handle: StepHandle) -> None:
        if handle.event is not None:
            t0 = time.perf_counter()
            handle.event.synchronize()
            self.wait_s += time.perf_counter() - t0
            if handle.start_event is not None and handle.kind is not None:
                took = handle.start_event.elapsed_time(handle.event) / 1e3
                old = self.step_time_s.get(handle.kind)
                self.step_time_s[handle.kind] = took if old is None else old + 0.3 * (took - old)


def precompile_attention(
    model: CausalLM,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    table_width: int = 1,
) -> None:
    """Compile now every attention-kernel variant an eager or piecewise step can pick (the split
    counts of the decode kernel, the two prefill tile shapes), for each distinct layer configuration
    (the decode graphs' own variants compile when they are captured). Triton compiles on
    first use, about a second per variant: during serving that would stall every request in flight.

    The launches take arguments laid out as a step's are (Triton also specializes on an integer
    argument's divisibility by 16): block tables with the input buffers' row stride
    ``table_width``, and q as a view of the q/k/v projection's output."""
    from hotloop.kernels.paged_decode_attention import SPLIT_CHOICES, paged_decode_attention
    from hotloop.kernels.paged_prefill_attention import CONFIG_LENGTHS, paged_prefill_attention
    from hotloop.layers.attention import FRESH_PREFILL, PagedAttention

    layers = [m for m in model.modules() if isinstance(m, PagedAttention)]  # type: ignore[attr-defined]
    if len(layers) != len(kv_caches):
        return
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())  # type: ignore[attr-defined]
    seen = set()
    for m, (k_cache, v_cache) in zip(layers, kv_caches, strict=True):
        key = (m.sliding_window, m.num_heads, m.num_kv_heads, m.head_dim)
        if key in seen:
            continue
        seen.add(key)
        qkv = torch.zeros(1, m.num_heads + 2 * m.num_kv_heads, m.head_dim, dtype=dtype, device=device)
        q = qkv[:, : m.num_heads]
        tables = torch.zeros(1, table_width, dtype=torch.int32, device=device)
        empty = torch.zeros(1, dtype=torch.int32, device=device)  # seq_len 0: nothing is read
        out = torch.empty(1, m.num_heads, m.head_dim, dtype=dtype, device=device)
        for splits in SPLIT_CHOICES:
            paged_decode_attention(
                q, k_cache, v_cache, tables, empty, m.scale, m.sliding_window, splits, out=out
            )
        starts = torch.zeros(2, dtype=torch.int32, device=device)  # no queries
        # A quantized cache's prefill rows read this step's keys from the projection output
        # (PagedAttention): the variants with the cache loop (a cached prefix, single-token rows) at
        # every tile configuration, since the warm-up's prompts have no prefix and compile only those
        # without it.
        fresh = k_cache.dtype == torch.uint8 and FRESH_PREFILL
        k = qkv[:, m.num_heads : m.num_heads + m.num_kv_heads] if fresh else None
        v = qkv[:, m.num_heads + m.num_kv_heads :] if fresh else None
        for max_query_len in (1, *CONFIG_LENGTHS) if fresh else (1, 64):
            paged_prefill_attention(
                q, k_cache, v_cache, tables, empty, starts, max_query_len, m.scale, m.sliding_window,
                k_new=k, v_new=v,
            )  # fmt: skip
    torch.cuda.synchronize(device)


def precompile_step_kernels(block_size: int, device: torch.device) -> None:
    """Compile now the small kernels a step may launch between graph replays (the multi-step input
    advance, the pending-id gather), so that the first multi-step round or reordered batch does not
    stall on Triton's compiler (about 30 ms each, measured in a batch-256 profile on an H200)."""
    z = torch.zeros(1, dtype=torch.long, device=device)
    ops.decode_advance(
        z, z.clone(), z.clone(), z.clone(), torch.zeros(1, dtype=torch.int32, device=device),
        torch.zeros(1, 1, dtype=torch.int32, device=device), block_size, z.clone(), z.clone(),
    )  # fmt: skip
    ops.gather_ids(z, z, z.clone())
    torch.cuda.synchronize(device)


def _to_pinned(t: torch.Tensor | None) -> torch.Tensor | None:
    """An asynchronous copy of ``t`` into (cached) pinned host memory, valid after the step's event."""
    if t is None:
        return None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
