"""Model runner: builds the inputs of a mixed batch over the paged cache, runs the model, samples.

One step's batch is the new tokens of every scheduled request back to back (prefill chunks and
decodes alike). Only requests that reach the end of their known tokens produce logits.

``launch(out)`` starts a step and ``collect(handle)`` returns its tokens; ``execute`` is both. A
request may have one *pending* token (sampled by the previous launch, not yet collected by the
engine): its id is copied on the device from that launch's sampled ids into this step's inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch

from hotloop.engine.outputs import SampledToken
from hotloop.engine.request import Request
from hotloop.engine.scheduler import ScheduledRequest, SchedulerOutput, multi_step_ok
from hotloop.executor.sampler import Sampler, SamplerOutput, SamplingMetadata
from hotloop.kernels import ops
from hotloop.layers.attention import AttentionMetadata
from hotloop.messages import TokenLogprob
from hotloop.vl import merge, mrope


class CausalLM(Protocol):
    """What the runner needs of a model (see ``hotloop/models/llama.py``)."""

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """Logits ``[N, vocab]``: float32, or with ``float32=False`` possibly the model dtype (the
        same values before an exact widening)."""
        ...


@dataclass
class StepHandle:
    """A launched step: who sampled, the sampler's output (device), and where each request's
    sampled id sits (for the next launch's pending tokens)."""

    reqs: list[Request]
    result: SamplerOutput | None
    rows: dict[int, int] | None = None  # id(request) -> row of result.token_ids (``row_of``)
    host: SamplerOutput | None = None  # pinned host copies, when the step ran on a GPU
    event: Any = None  # CUDA event recorded after the copies
    start_event: Any = None  # CUDA timing event recorded before the step's first kernel (jit scheduling)
    kind: Any = None  # the step's kind for the runner's step-time averages
    # Multi-step decode: the decode steps this launch ran, and the ids each sampled (``[steps, b]``,
    # on the device; ``host_history`` its pinned copy). ``result`` then holds the last step's ids.
    steps: int = 1
    history: torch.Tensor | None = None
    host_history: torch.Tensor | None = None
    # recorded when a multi-step launch has RUN_AHEAD_STEPS steps left: the next launch waits for it
    # (``gpu_runner.py``), so the host never queues more than about two rounds of graphs
    ahead_event: Any = None
    # prompt logprobs computed by this step (``prompt_logprobs``), on the device until ``collect``
    prompt_lps: list[PromptLogprobs] | None = None

    def row_of(self) -> dict[int, int]:
        """``id(request) -> row of result.token_ids``, made on first use (steady decode steps,
        whose requests come in the previous step's order, never need it)."""
        if self.rows is None:
            self.rows = {id(r): i for i, r in enumerate(self.reqs)}
        return self.rows


@dataclass(slots=True)
class PromptLogprobs:
    """Log-probabilities of prompt tokens ``first .. first + len(chosen) - 1`` of ``request``, each
    given the tokens before it: the chosen (actual) token's, and ``top`` (values, ids) of the
    ``GenerationConfig.prompt_logprobs`` most likely, if any."""

    request: Request
    first: int
    chosen: torch.Tensor
    top: tuple[torch.Tensor, torch.Tensor] | None
    rank: torch.Tensor | None = None  # each chosen token's rank (1: the most likely)


PROMPT_LOGPROB_ROWS = 128  # LM-head rows per chunk (a float32 [128, vocab] buffer: 63 MiB at 128k vocab)


def prompt_logprob_rows(scheduled: list[ScheduledRequest]) -> list[tuple[Request, int, int, int]]:
    """(request, first row in the flat batch, first position, count) of the rows whose logits give
    a prompt token's log-probability: positions up to the one before the prompt's last token, of the
    requests that asked for prompt logprobs."""
    rows = []
    base = 0
    for s in scheduled:
        req = s.request
        if req.prompt_logprobs is not None:
            end = min(s.start + s.num_tokens, len(req.prompt_token_ids) - 1)
            if end > s.start:
                rows.append((req, base, s.start, end - s.start))
        base += s.num_tokens
    return rows


def compute_prompt_logprobs(
    model: CausalLM, hidden: torch.Tensor, rows: list[tuple[Request, int, int, int]]
) -> list[PromptLogprobs]:
    """The log-softmax of the LM head over ``rows`` of ``hidden`` (in chunks of
    ``PROMPT_LOGPROB_ROWS``), at each row's next prompt token, and its top-k."""
    out = []
    for req, row, pos, count in rows:
        k = req.params.prompt_logprobs or 0
        ids = req.prompt_token_ids
        for c in range(0, count, PROMPT_LOGPROB_ROWS):
            n = min(PROMPT_LOGPROB_ROWS, count - c)
            lp = torch.log_softmax(model.compute_logits(hidden[row + c : row + c + n]).float(), dim=-1)
            targets = torch.tensor(ids[pos + c + 1 : pos + c + n + 1], dtype=torch.long, device=lp.device)
            chosen = lp.gather(1, targets[:, None])[:, 0]
            rank = (lp >= chosen[:, None]).sum(dim=-1)  # (vLLM's: tied tokens take the worse place)
            top = None
            if k:
                values, top_ids = lp.topk(k, dim=-1)
                top = (values, top_ids)
            out.append(PromptLogprobs(req, pos + c + 1, chosen, top, rank))
    return out


def store_prompt_logprobs(results: list[PromptLogprobs]) -> None:
    """Write ``results`` into their requests' ``prompt_logprobs`` (a recomputed prompt, after a
    preemption, writes the same positions again)."""
    for r in results:
        dest = r.request.prompt_logprobs
        if dest is None:
            continue
        ids = r.request.prompt_token_ids
        chosen = r.chosen.tolist()
        ranks = r.rank.tolist() if r.rank is not None else [None] * len(chosen)
        top_v = r.top[0].tolist() if r.top is not None else None
        top_i = r.top[1].tolist() if r.top is not None else None
        for j, v in enumerate(chosen):
            p = r.first + j
            top = (
                dict(zip(top_i[j], top_v[j], strict=True)) if top_i is not None and top_v is not None else {}
            )
            dest[p] = TokenLogprob(ids[p], v, top, ranks[j])


def pending_index(req: Request, start: int, num_tokens: int) -> int | None:
    """Offset within ``start .. start+num_tokens`` of ``req``'s last pending token (the one the
    previous launch sampled last), if it falls there."""
    if not req.num_pending_tokens:
        return None
    i = req.num_tokens + req.num_pending_tokens - 1 - start  # after the host-known tokens
    return i if 0 <= i < num_tokens else None


def known_token_ids(req: Request, start: int, end: int) -> list[int]:
    """``all_token_ids[start:end]`` with 0 in place of a pending token (patched on the device)."""
    ids = req.token_ids(start, min(end, req.num_tokens))
    return ids + [0] * (end - start - len(ids))


class ModelRunner:
    """Runs one scheduled step on ``model`` with the KV tensors it was given."""

    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        device: torch.device,
        vision_max_batch_size: int = 16,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.vision_max_batch_size = vision_max_batch_size
        self.sampler = Sampler()
        self._last: StepHandle | None = None  # the previous launch (source of pending token ids)

    def prepare(
        self, out: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flat ``input_ids`` / ``positions`` ``[T]``, attention metadata and the logits rows."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        logits_rows: list[int] = []
        fix: list[tuple[int, Request]] = []
        for s in out.scheduled:
            req = s.request
            end = s.start + s.num_tokens
            pi = pending_index(req, s.start, s.num_tokens)
            if pi is not None:
                fix.append((len(input_ids) + pi, req))
            input_ids.extend(known_token_ids(req, s.start, end))
            blocks = req.block_ids
            delta = req.position_delta
            for p in range(s.start, end):
                positions.append(p + delta)
                slots.append(blocks[p // bs] * bs + p % bs)
            query_lens.append(s.num_tokens)
            seq_lens.append(end)
            if s.samples:
                logits_rows.append(len(input_ids) - 1)
        width = max(len(s.request.block_ids) for s in out.scheduled)
        tables = [s.request.block_ids + [0] * (width - len(s.request.block_ids)) for s in out.scheduled]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            query_lens=query_lens,
            seq_lens=seq_lens,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        if fix:
            dst = torch.tensor([i for i, _ in fix], dtype=torch.long, device=dev)
            self.patch_pending(ids, dst, [r for _, r in fix])
        return ids, pos, meta, logits_rows

    def patch_pending(
        self, ids: torch.Tensor, dst: torch.Tensor, reqs: list[Request], dense: bool = False
    ) -> None:
        """``ids[dst[i]] = `` the id ``reqs[i]`` sampled in the previous launch (on the device).
        ``dense``: ``dst`` is ``0 .. len(reqs) - 1`` (its contents are then not read)."""
        last = self._last
        if last is None or last.result is None:
            raise RuntimeError("a request has a pending token but no step was launched before")
        n = len(reqs)
        prev = last.reqs
        if n <= len(prev) and all(a is b for a, b in zip(reqs, prev, strict=False)):
            vals = last.result.token_ids[:n]  # the same requests in the same order (steady decode)
        else:
            src = self.index_tensor([last.row_of()[id(r)] for r in reqs], 0)
            vals = self.gather_rows(last.result.token_ids, src)
        if dense:
            ids[:n].copy_(vals)
        else:
            ids.index_copy_(0, dst, vals.to(ids.dtype))

    def gather_rows(self, values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``values[index]`` (1-D); the GPU runner writes it into a persistent buffer."""
        return values.index_select(0, index)

    def index_tensor(self, values: list[int], slot: int) -> torch.Tensor:
        """A small list of row indices on the device (the GPU runner stages it through pinned memory)."""
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def multimodal_kwargs(self, out: SchedulerOutput, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{"inputs_embeds": ...}`` with image embeddings merged when the step covers image
        tokens (the vision encoder runs here); ``{}`` for text-only steps, which stay unchanged."""
        if not merge.has_images(out.scheduled):
            return {}
        model = cast(merge.VisionLanguageModel, self.model)
        return {
            "inputs_embeds": merge.merged_embeddings(model, out.scheduled, ids, self.vision_max_batch_size)
        }

    def _sampling_metadata(self, reqs: list[Request]) -> SamplingMetadata:
        gens: list[torch.Generator | None] = []
        suppress: list[list[int]] = []
        masks: list[torch.Tensor | None] = []
        for r in reqs:
            if r.params.random_seed is not None and not r.params.greedy and r.sampler_state is None:
                r.sampler_state = torch.Generator(device=self.device).manual_seed(r.params.random_seed)
            gens.append(r.sampler_state)
            min_new = r.params.min_new_tokens or 0
            n_out = r.num_output_tokens + r.num_pending_tokens  # index of the token sampled now
            grammar = r.grammar
            # once a JSON object is complete only a stop id may follow: the grammar outranks min_new_tokens
            hold = n_out < min_new and not (grammar is not None and grammar.is_completed)
            suppress.append(sorted(r.stop_token_ids) if hold else [])
            if grammar is not None:
                if r.num_pending_tokens:
                    raise RuntimeError(
                        f"request {r.request_id}: a grammar mask needs its last token on the host"
                    )
                masks.append(grammar.next_token_bitmask())
            else:
                masks.append(None)
        return SamplingMetadata(
            params=[r.params for r in reqs],
            prompt_token_ids=[r.prompt_token_ids for r in reqs],
            output_token_ids=[r.output_token_ids for r in reqs],
            generators=gens,
            suppress_token_ids=suppress,
            token_bitmasks=masks if any(m is not None for m in masks) else None,
        )

    supports_multi_step = True  # ``launch(out, steps > 1)`` runs the steps (eagerly, here)

    def execute(self, out: SchedulerOutput) -> list[SampledToken]:
        return self.collect(self.launch(out))

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, steps: int = 1) -> StepHandle:
        """Start ``out``. ``steps`` > 1 (multi-step decode; every row one sampled token, blocks for
        ``steps`` tokens already allocated): run that many decode steps, each step's sampled ids the
        next one's inputs, without the host in between. The handle's ``steps`` says how many ran."""
        mrope.ensure_positions(out.scheduled)
        ids, pos, meta, rows = self.prepare(out)
        pos = mrope.step_positions(out.scheduled, pos)
        hidden = self.model(ids, pos, self.kv_caches, meta, **self.multimodal_kwargs(out, ids))
        reqs = [s.request for s in out.scheduled if s.samples]
        prompt_rows = prompt_logprob_rows(out.scheduled)
        prompt_lps = compute_prompt_logprobs(self.model, hidden, prompt_rows) if prompt_rows else None
        result = None
        if reqs:
            logits = self.model.compute_logits(hidden[self.index_tensor(rows, 1)])
            md = self._sampling_metadata(reqs)
            result = self.sampler(logits, md)
            if steps > 1 and multi_step_ok(out):
                return self._more_steps(reqs, result.token_ids, ids, pos, meta, md, steps)
        handle = self._launched(reqs, result)
        handle.prompt_lps = prompt_lps
        return handle

    def _more_steps(
        self,
        reqs: list[Request],
        sampled: torch.Tensor,
        ids: torch.Tensor,
        pos: torch.Tensor,
        meta: AttentionMetadata,
        md: SamplingMetadata,
        steps: int,
    ) -> StepHandle:
        """Decode steps 2 .. ``steps`` of a multi-step launch, eagerly (the reference path; the GPU
        runner replays its decode graph instead)."""
        b = len(reqs)
        history = torch.empty(steps, b, dtype=torch.long, device=sampled.device)
        seq_lens_t = torch.tensor(meta.seq_lens, dtype=torch.int32, device=sampled.device)
        last = last_inputs(reqs)
        limits = torch.tensor(last, dtype=torch.long, device=sampled.device)
        for j in range(1, steps):
            ops.decode_advance(
                sampled, ids, pos, meta.slot_mapping, seq_lens_t, meta.block_tables, self.block_size,
                history[j - 1], limits,
            )  # fmt: skip
            # the host's copy of the lengths, as the kernel moved them (rows past their end stay)
            meta = dataclasses.replace(
                meta, seq_lens=[n + 1 if n <= m else n for n, m in zip(meta.seq_lens, last, strict=True)]
            )
            hidden = self.model(ids, pos, self.kv_caches, meta)
            sampled = self.sampler(self.model.compute_logits(hidden[:b]), md).token_ids
        history[steps - 1] = sampled
        return self._launched_steps(reqs, history)

    def _launched_steps(self, reqs: list[Request], history: torch.Tensor) -> StepHandle:
        handle = self._launched(reqs, SamplerOutput(history[-1], None, None, None))
        handle.steps = history.shape[0]
        handle.history = history
        return handle

    def _launched(self, reqs: list[Request], result: SamplerOutput | None) -> StepHandle:
        handle = StepHandle(reqs, result)
        self._last = handle
        return handle

    def collect(self, handle: StepHandle) -> list[SampledToken]:
        """The step's sampled tokens, in the order of its sampling requests (and its prompt logprobs,
        into their requests)."""
        if handle.prompt_lps:
            store_prompt_logprobs(handle.prompt_lps)
            handle.prompt_lps = None
        if handle.result is None:
            return []
        return _to_tokens(handle.host or handle.result, handle.reqs)

    def collect_steps(self, handle: StepHandle) -> list[list[int]]:
        """A multi-step launch's sampled ids: per sampling request (in order), one id per step."""
        if handle.history is None:
            return [[t.token_id] for t in self.collect(handle)]
        hist = handle.host_history if handle.host_history is not None else handle.history
        return [list(col) for col in zip(*hist.tolist(), strict=True)]

    @torch.inference_mode()
    def score(self, request: Request, start: int, num_tokens: int) -> list[float]:
        """Prefill ``num_tokens`` tokens of ``request`` from ``start`` and return, for each of
        them whose successor is known, ``log p(successor | prefix)`` (for perplexity)."""
        out = SchedulerOutput([ScheduledRequest(request, num_tokens, start)])
        mrope.ensure_positions(out.scheduled)
        ids, pos, meta, _rows = self.prepare(out)
        pos = mrope.step_positions(out.scheduled, pos)
        hidden = self.model(ids, pos, self.kv_caches, meta, **self.multimodal_kwargs(out, ids))
        end = min(start + num_tokens, request.num_tokens - 1)
        if end <= start:
            return []
        logits = self.model.compute_logits(hidden[: end - start])
        targets = torch.tensor(request.token_ids(start + 1, end + 1), device=logits.device)
        lp = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None])[:, 0]
        return lp.tolist()


def last_inputs(reqs: list[Request]) -> list[int]:
    """Per request, the index of the last input a decode step needs: the one that samples its
    ``max_new_tokens``-th output token (a multi-step round writes nothing for a row past it)."""
    return [len(r.prompt_token_ids) + r.params.max_new_tokens - 2 for r in reqs]


def _to_tokens(result: SamplerOutput, reqs: list[Request]) -> list[SampledToken]:
    token_ids = result.token_ids.tolist()
    if result.logprobs is None:
        return [SampledToken(t) for t in token_ids]
    lps = result.logprobs.tolist()
    top_ids = result.top_ids.tolist() if result.top_ids is not None else None
    top_lps = result.top_logprobs.tolist() if result.top_logprobs is not None else None
    tokens = []
    for i, (t, r) in enumerate(zip(token_ids, reqs, strict=True)):
        k = r.params.logprobs
        if k is None:
            tokens.append(SampledToken(t))
            continue
        top = {}
        if k and top_ids is not None and top_lps is not None:
            top = dict(zip(top_ids[i][:k], top_lps[i][:k], strict=True))
        tokens.append(SampledToken(t, TokenLogprob(t, lps[i], top)))
    return tokens
