"""The engine: accepts requests, and each ``step()`` schedules, executes and updates.

Thread-safe at its edge: ``add_request`` / ``abort_request`` may be called from any thread; they
validate at once (raising ``RequestError``) and leave the request in an inbox that the next
``step()`` drains. Everything else runs on the thread that calls ``step()``.

Overlapped scheduling (``overlap=True``, the default on the GPU): ``step()`` schedules and launches
step N+1 *before* it collects step N's sampled tokens, so the host's scheduling, input preparation,
stop checks and detokenization run while the GPU computes. A request's token from step N is then
"pending": it counts for scheduling and the runner reads its id on the device. The price is at most
one wasted token per finishing request (computed, then dropped). Requests whose next step needs
their whole history on the host (repetition/presence/frequency penalties, JSON mode's grammar) and
steps that must preempt are not overlapped: the engine collects first. Outputs are identical either
way.

JSON mode (``GenerationConfig.response_format`` "json_object" or "json_schema"): each such request
gets a grammar matcher (``engine/grammar.py``; each grammar is compiled on its first request) that
the runner asks for the allowed next tokens and ``_update`` advances with every token; the request
stops when the matcher terminates (a stop id after a complete value).

Just-in-time scheduling (``jit_schedule=True``, with overlap; off by default): deciding step N+1
before step N ends makes a request that arrives during N wait for N+2. With an executor that can
estimate a step's device time (``estimate_s(out) -> seconds | None``), ``step()`` first sleeps until
shortly before the step in flight is expected to end (the lead is the slowest of the host's recent
schedule-and-launch times, with a margin), so late arrivals join the next step while the host's
work stays hidden. It changes timing only, never outputs.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from hotloop.config import CacheConfig, ModelConfig, SchedulerConfig
from hotloop.engine.block_manager import BlockManager
from hotloop.engine.detokenizer import IncrementalDetokenizer
from hotloop.engine.grammar import JsonGrammar, require_json_mode
from hotloop.engine.outputs import RequestOutput, SampledToken
from hotloop.engine.request import Request, RequestStatus
from hotloop.engine.scheduler import Scheduler, SchedulerOutput, multi_step_ok
from hotloop.engine.word_ids import WordIds
from hotloop.messages import GenerationConfig, RequestError


class Executor(Protocol):
    """Runs the scheduled tokens; returns one ``SampledToken`` per scheduled request that samples,
    in the order of ``out.scheduled``.

    An executor may also offer ``launch(out) -> handle`` (start the step without waiting; token
    ids a request has pending from the previous launch are read on the device) and
    ``collect(handle) -> list[SampledToken]``; the engine overlaps steps only with those.
    """

    def execute(self, out: SchedulerOutput) -> list[SampledToken]: ...

    def score(self, request: Request, start: int, num_tokens: int) -> list[float]:
        """Prefill tokens ``start .. start+num_tokens`` and return log p(next | prefix) for each."""
        ...


def validate_image_spans(mm_inputs: Sequence[Any], num_prompt_tokens: int) -> None:
    """Each image's tokens lie inside the prompt, in order, without overlapping."""
    prev_end = 0
    for i, m in enumerate(mm_inputs):
        if m.length < 1 or m.offset < prev_end or m.offset + m.length > num_prompt_tokens:
            raise RequestError(
                f"image {i} fills tokens {m.offset}..{m.offset + m.length} of a {num_prompt_tokens}-token "
                "prompt: image spans must be non-empty, in order, inside the prompt",
                param="images",
            )
        prev_end = m.offset + m.length


class Engine:
    """Continuous-batching engine over one executor."""

    def __init__(
        self,
        executor: Executor,
        tokenizer: Any,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        overlap: bool = False,
        jit_schedule: bool = False,
        num_scheduler_steps: int = 1,
        full_batch_steps: int = 1,
    ) -> None:
        self.executor = executor
        self.overlap = overlap and hasattr(executor, "launch") and hasattr(executor, "collect")
        self.jit_schedule = self.overlap and jit_schedule and hasattr(executor, "estimate_s")
        # Multi-step decode (with overlap): up to this many decode steps per launch and host round trip.
        multi = (
            self.overlap
            and hasattr(executor, "collect_steps")
            and getattr(executor, "supports_multi_step", True)
        )
        self.num_scheduler_steps = num_scheduler_steps if multi else 1
        # ... and while the batch is full and no request waits (a round then delays nobody), up to this many
        self.full_batch_steps = full_batch_steps if multi else 1
        self.num_multi_step_launches = 0
        # the step in flight: what was scheduled, the executor's handle, the decode steps it runs
        self._inflight: tuple[SchedulerOutput, Any, int] | None = None
        # Just-in-time scheduling: when the step in flight started on the device (the host saw the
        # step before it end), and an average of the host's schedule-to-launch time.
        self._inflight_started_at: float | None = None
        self._host_launch_s: deque[float] = deque(maxlen=32)  # the last steps' schedule-to-launch times
        self.jit_wait_s = 0.0
        self._stash: list[RequestOutput] = []  # outputs collected outside step(), returned by the next
        self.num_overlapped_steps = 0
        self.tokenizer = tokenizer
        self.model_config = model_config
        # JSON mode's grammar, over the logits' width (the mask must cover every row of the LM head)
        self.json_grammar = JsonGrammar(tokenizer, model_config.vocab_size)
        # stop words that are special tokens, and bad_words, as token ids
        self.word_ids = WordIds(tokenizer, model_config.vocab_size)
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.block_manager = BlockManager(
            cache_config.num_blocks, cache_config.block_size, cache_config.enable_prefix_caching
        )
        self.scheduler = Scheduler(scheduler_config, self.block_manager)
        self.requests: dict[str, Request] = {}
        self._lock = threading.Lock()
        self._inbox: list[Request] = []
        self._aborts: list[str] = []
        self._ids: set[str] = set()
        self.num_steps = 0

    # -- edge (any thread) ----------------------------------------------------------------------
    @property
    def session_len(self) -> int:
        return self.scheduler_config.session_len

    @property
    def max_tokens_per_request(self) -> int:
        """A request must fit the session and the whole KV pool."""
        return min(self.session_len, self.cache_config.num_blocks * self.cache_config.block_size)

    def validate(self, prompt_token_ids: list[int], params: GenerationConfig) -> None:
        """Raise ``RequestError`` naming the field and the limit if the request cannot be served."""
        p = len(prompt_token_ids)
        if p == 0:
            raise RequestError("the prompt is empty: it must hold at least one token", param="prompt")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise RequestError(
                f"prompt token id {bad[0]!r} is outside the vocabulary [0, {vocab})", param="prompt"
            )
        if params.json_mode:
            require_json_mode()  # (a schema that does not compile raises in add_request, which compiles it)
            plain, _special = self.word_ids.split_stop_words(tuple(params.stop_words or ()))
            if plain:  # a stop string would end the request inside the JSON value, as if it were done
                raise RequestError(
                    f"stop strings cannot be combined with JSON output (response_format json_object or "
                    f"json_schema): {plain[0]!r} could cut the value short; leave the stop strings "
                    "out or use stop_token_ids",
                    param="stop_words",  # (the OpenAI routes name it stop)
                )
        for name, ids in (
            ("logit_bias", params.logit_bias or {}),
            ("bad_token_ids", params.bad_token_ids or ()),
            ("stop_token_ids", params.stop_token_ids or ()),
        ):
            outside = [t for t in ids if not (isinstance(t, int) and 0 <= t < vocab)]
            if outside:
                raise RequestError(
                    f"{name} token id {outside[0]!r} is outside the vocabulary [0, {vocab})", param=name
                )
        limit = self.max_tokens_per_request
        m = params.max_new_tokens
        if p + m > limit:
            where = (
                f"session_len={self.session_len}"
                if limit == self.session_len
                else f"the KV cache's {limit} tokens (session_len={self.session_len})"
            )
            if p >= limit:
                raise RequestError(
                    f"the prompt has {p} tokens: with at least one new token that exceeds {where}; "
                    f"shorten the prompt to at most {limit - 1} tokens",
                    param="prompt",
                )
            raise RequestError(
                f"the prompt has {p} tokens and max_new_tokens is {m}: {p + m} tokens exceed {where}; "
                f"shorten the prompt or lower max_new_tokens to at most {limit - p}",
                param="max_new_tokens",
            )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: GenerationConfig,
        mm_inputs: Sequence[Any] = (),
    ) -> None:
        """Validate and queue a request; it joins the batch at the next step.

        ``mm_inputs``: the prompt's images (``hotloop.vl.ImageInput``, from the model's processor).
        """
        self.validate(prompt_token_ids, params)
        validate_image_spans(mm_inputs, len(prompt_token_ids))
        stop_ids = set(params.stop_token_ids or ())
        stop_words, special_stops = self.word_ids.split_stop_words(tuple(params.stop_words or ()))
        stop_ids.update(special_stops)  # a special token's text never reaches the stop-string search
        if not params.ignore_eos:
            stop_ids.update(self.model_config.eos_token_ids)
        banned = set(params.bad_token_ids or ())
        if params.bad_words:
            banned.update(self.word_ids.banned_ids(tuple(params.bad_words)))
        if banned:  # never sampled: a bias of -inf (what the sampler does with logit_bias)
            params = params.replace(
                logit_bias={**(params.logit_bias or {}), **{t: float("-inf") for t in banned}}
            )
        req = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            stop_token_ids=frozenset(stop_ids),
            mm_inputs=tuple(mm_inputs),
            cache_extra_keys=tuple(f"image:{m.content_hash}" for m in mm_inputs),
        )
        if params.json_mode:
            req.grammar = self.json_grammar.matcher(stop_ids, params.json_schema)
        req.detokenizer = IncrementalDetokenizer(
            self.tokenizer,
            req.prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop_words=stop_words,
            include_stop_str_in_output=params.include_stop_str_in_output,
            min_tokens=params.min_new_tokens or 0,
        )
        with self._lock:
            if request_id in self._ids:
                raise RequestError(f"request id {request_id!r} is already in use", param="request_id")
            self._ids.add(request_id)
            self._inbox.append(req)

    def abort_request(self, request_id: str) -> None:
        """Abort a request; its final output (finish_reason ``abort``) comes from the next step."""
        with self._lock:
            self._aborts.append(request_id)

    def has_unfinished(self) -> bool:
        with self._lock:
            pending = bool(self._inbox or self._aborts or self._stash)
        return pending or self._inflight is not None or self.scheduler.has_unfinished()

    # -- the loop (one thread) -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        if self.jit_schedule:
            self._wait_until_due()
        outputs, self._stash = self._stash, []
        outputs += self._drain_inbox()
        if self._inflight is not None and not self._may_overlap():
            outputs += self._collect()
        t_host = time.perf_counter()  # the host's share only: a non-overlapped collect waits for the GPU
        out = self.scheduler.schedule()
        if out.is_empty:
            if self._inflight is not None:
                outputs += self._collect()
            return outputs
        if not self.overlap:
            sampled = self.executor.execute(out)
            self.scheduler.advance(out)
            self.num_steps += 1
            return outputs + self._update(out, sampled)
        k = self._round_steps(out) if self.num_scheduler_steps > 1 or self.full_batch_steps > 1 else 1
        if k > 1:
            handle = self.executor.launch(out, k)  # type: ignore[attr-defined]
            k = getattr(handle, "steps", 1)
            self.num_multi_step_launches += k > 1
        else:
            handle = self.executor.launch(out)  # type: ignore[attr-defined]
            # (a multi-step launch's time includes its wait for the round before: not a host time)
            self._host_launch_s.append(time.perf_counter() - t_host)
        self.scheduler.advance(out, k)
        self.num_steps += k
        started: float | None = None
        if self._inflight is not None:
            outputs += self._collect()
            started = time.perf_counter()  # the collected step ended: the new one runs from now
            self.num_overlapped_steps += 1
        self._inflight = (out, handle, k)
        self._inflight_started_at = started
        return outputs

    def _round_steps(self, out: SchedulerOutput) -> int:
        """How many decode steps to launch for ``out`` (multi-step decode), allocating the blocks of
        the extra ones; 1 where a single step is the answer. More than one only when every row is a
        plain decode (``multi_step_ok``), no waiting request could join the batch meanwhile, some row
        has more than one token left to sample, and the free blocks cover the round.

        The round is at most ``num_scheduler_steps`` long, or ``full_batch_steps`` while the batch is
        full (``max_batch_size`` requests running) and no request waits: a round then delays nobody.
        It is as long as the row with the most tokens left needs. While requests wait (a full batch
        under ``num_scheduler_steps``): no round while a running request's last token is still in
        flight (its slot is due to a waiting request), and none longer than the row with the fewest
        tokens left, so that no slot idles past a request's ``max_new_tokens``. A row that reaches
        ``max_new_tokens`` before the round ends stops writing the cache (``kernels/decode_advance.py``)
        and one that samples a stop token keeps going: their extra tokens are computed and dropped.
        While requests wait, the engine collects a round before it schedules the next step
        (``_may_overlap``), so that a stop token's slot is handed over after its own round."""
        sched = self.scheduler
        waiting = bool(sched.waiting or self._inbox)
        full = sched.num_running >= self.scheduler_config.max_batch_size
        limit = self.num_scheduler_steps
        if full and not waiting:
            limit = max(limit, self.full_batch_steps)
        if limit <= 1 or (waiting and not full):
            return 1
        if not multi_step_ok(out):
            return 1
        if waiting and len(out.scheduled) < sched.num_running:
            return 1  # a running request is not scheduled: its last token is in flight
        left = [
            s.request.params.max_new_tokens - len(s.request.output_token_ids) - s.request.num_pending_tokens
            for s in out.scheduled
        ]
        k = min(limit, max(left))
        if waiting:
            k = min(k, min(left))
        if k <= 1:
            return 1
        bm = self.block_manager
        bs = bm.block_size
        short = []  # rows whose blocks end before their last token of the round, and what they need
        total = 0
        for s, n in zip(out.scheduled, left, strict=True):
            req = s.request
            n = min(n, k)
            need = -(-(req.num_computed_tokens + n) // bs) - len(req.block_ids)
            if need > 0:
                short.append((req, n))
                total += need
        if total > bm.num_free_blocks:
            return 1
        for req, n in short:
            bm.allocate(req, n)
        return k

    def _wait_until_due(self) -> None:
        """Sleep until the step in flight is expected to end, less the host's lead time."""
        if self._inflight is None or self._inflight_started_at is None:
            return
        if self._inflight[2] > 1:
            return  # no estimate for a multi-step launch
        est = self.executor.estimate_s(self._inflight[0])  # type: ignore[attr-defined]
        if not est:
            return
        # The slowest recent launch (a step with prefill launches slower than a decode graph), with
        # a margin: a late launch idles the GPU, which costs every running request.
        lead = 1.2 * max(self._host_launch_s, default=0.0) + 0.5e-3
        wait = self._inflight_started_at + est - lead - time.perf_counter()
        if wait > 0:
            wait = min(wait, 0.25)  # a bad estimate can never stall the loop for long
            time.sleep(wait)
            self.jit_wait_s += wait

    def _collect(self) -> list[RequestOutput]:
        """Wait for the step in flight and apply its sampled tokens."""
        assert self._inflight is not None
        out, handle, steps = self._inflight
        self._inflight = None
        if steps > 1:
            return self._update_steps(out, self.executor.collect_steps(handle))  # type: ignore[attr-defined]
        return self._update(out, self.executor.collect(handle))  # type: ignore[attr-defined]

    def _may_overlap(self) -> bool:
        """Whether the next step can be scheduled before the one in flight is collected: it is not a
        multi-step round while requests wait, no request with a pending token needs its output history
        on the host, and no request will need a block that is not free (preemption recomputes from
        known tokens)."""
        if self._inflight is not None and self._inflight[2] > 1 and (self.scheduler.waiting or self._inbox):
            # a round in flight while requests wait: collect it first, so that a request that stopped
            # in it hands its slot over now rather than after the next round as well
            return False
        free = self.block_manager.num_free_blocks
        bs = self.cache_config.block_size
        for req in self.scheduler.running:
            if not req.num_pending_tokens:
                continue
            if req.needs_output_history:
                return False
            if req.num_computed_tokens >= len(req.block_ids) * bs:  # the next token opens a block
                free -= 1
        return free >= 0

    def sync(self) -> list[RequestOutput]:
        """Collect the step in flight, if any (before work that must see every token)."""
        return self._collect() if self._inflight is not None else []

    def _drain_inbox(self) -> list[RequestOutput]:
        with self._lock:
            new, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
        for req in new:
            self.requests[req.request_id] = req
            self.scheduler.add(req)
        outputs = []
        for rid in aborts:
            victim = self.requests.get(rid)
            if victim is None or victim.is_finished:
                continue
            outputs.append(self._finish(victim, RequestStatus.FINISHED_ABORTED, [], ""))
        return outputs

    def _update(self, out: SchedulerOutput, sampled: list[SampledToken]) -> list[RequestOutput]:
        samplers = [s.request for s in out.scheduled if s.samples]
        assert len(samplers) == len(sampled), f"executor returned {len(sampled)} tokens for {len(samplers)}"
        now = time.monotonic()
        outputs = []
        session_len = self.session_len
        # The per-request work of every step at large batch: kept to plain attribute reads.
        for req, tok in zip(samplers, sampled, strict=True):
            if req.status.finished:  # finished (or aborted) while this step was in flight: drop it
                continue
            token_id = tok.token_id
            logprob = tok.logprob
            req.num_pending_tokens -= 1
            output_ids = req.output_token_ids
            output_ids.append(token_id)
            if logprob is not None:
                req.output_logprobs.append(logprob)
            if req.first_token_time is None:
                req.first_token_time = now
            detok: IncrementalDetokenizer = req.detokenizer
            is_stop_token = token_id in req.stop_token_ids
            grammar_done = req.grammar is not None and req.grammar.advance(token_id)
            params = req.params
            # A stop token's own text (e.g. "<|im_end|>") is not output unless asked for; nor is the
            # token that ends a JSON value (the matcher terminates only on one of its stop ids, the
            # tokenizer's EOS when ignore_eos left none)
            ends_grammar = grammar_done and req.grammar is not None and not req.grammar.rejected
            text = (
                ""
                if (is_stop_token or ends_grammar) and not params.include_stop_str_in_output
                else detok.add_token(token_id)
            )
            status = None
            n_out = len(output_ids)
            n_prompt = len(req.prompt_token_ids)
            if is_stop_token or detok.stopped or grammar_done:
                status = RequestStatus.FINISHED_STOPPED
            elif n_out >= params.max_new_tokens or n_prompt + n_out >= session_len:
                status = RequestStatus.FINISHED_LENGTH
            lps = [logprob] if logprob is not None else []
            if status is not None:
                o = self._finish(req, status, [token_id], text, lps)
            else:
                o = RequestOutput(
                    req.request_id, [token_id], text, False, None, n_prompt, n_out, req.num_cached_tokens, lps
                )
            if n_out == 1 and req.prompt_logprobs is not None:
                o.prompt_logprobs = list(req.prompt_logprobs)
            outputs.append(o)
        return outputs

    def _update_steps(self, out: SchedulerOutput, sampled: list[list[int]]) -> list[RequestOutput]:
        """``_update`` for a multi-step launch: each request's ids of every step, applied in order
        up to the first that finishes it (the rest were computed past its end and are dropped);
        one output per request with all its new ids and text (never a JSON-mode request: its grammar
        must see every token before the next step, see ``multi_step_ok``). Its per-token branch repeats
        ``_update``'s stop and length checks on purpose: that loop runs for every request every step,
        and a shared helper would add a call per token there."""
        samplers = [s.request for s in out.scheduled if s.samples]
        assert len(samplers) == len(sampled), f"executor returned {len(sampled)} rows for {len(samplers)}"
        now = time.monotonic()
        outputs = []
        session_len = self.session_len
        for req, ids in zip(samplers, sampled, strict=True):
            if req.is_finished:
                continue
            output_ids = req.output_token_ids
            if req.first_token_time is None:
                req.first_token_time = now
            detok: IncrementalDetokenizer = req.detokenizer
            params = req.params
            stop_ids = req.stop_token_ids
            max_new = params.max_new_tokens
            room = session_len - len(req.prompt_token_ids)
            n = len(ids)
            if (
                detok.plain
                and len(output_ids) + n < max_new
                and len(output_ids) + n < room
                and stop_ids.isdisjoint(ids)
            ):
                # the common case, per request rather than per token: no stop id, no stop string,
                # and the request goes on after the round
                req.num_pending_tokens -= n
                output_ids.extend(ids)
                outputs.append(
                    RequestOutput(
                        req.request_id,
                        ids,
                        detok.add_plain_tokens(ids),
                        False,
                        None,
                        len(req.prompt_token_ids),
                        len(output_ids),
                        req.num_cached_tokens,
                        [],
                    )
                )
                continue
            pieces: list[str] = []
            status = None
            taken = 0
            for token_id in ids:
                taken += 1
                req.num_pending_tokens -= 1
                output_ids.append(token_id)
                is_stop_token = token_id in stop_ids
                if not (is_stop_token and not params.include_stop_str_in_output):
                    pieces.append(detok.add_token(token_id))
                if is_stop_token or detok.stopped:
                    status = RequestStatus.FINISHED_STOPPED
                elif len(output_ids) >= max_new or len(output_ids) >= room:
                    status = RequestStatus.FINISHED_LENGTH
                if status is not None:
                    break
            new_ids = ids[:taken]
            text = "".join(pieces)
            if status is not None:
                # The round went on past this request's end: only the K/V of its tokens before the
                # last is known to be written (a row past max_new_tokens writes nothing), so no more
                # is registered in the prefix cache than a single step would have.
                last = len(req.prompt_token_ids) + len(output_ids) - 1
                req.num_computed_tokens = min(req.num_computed_tokens, last)
                outputs.append(self._finish(req, status, new_ids, text))
            else:
                outputs.append(
                    RequestOutput(
                        req.request_id,
                        new_ids,
                        text,
                        False,
                        None,
                        len(req.prompt_token_ids),
                        len(output_ids),
                        req.num_cached_tokens,
                        [],
                    )
                )
        return outputs

    def _finish(
        self, req: Request, status: RequestStatus, new_ids: list[int], text: str, lps: list | None = None
    ) -> RequestOutput:
        self.scheduler.finish(req, status)
        # the bookkeeping first: a request whose text cannot be finished still leaves the engine
        self.requests.pop(req.request_id, None)
        with self._lock:
            self._ids.discard(req.request_id)
        text += req.detokenizer.flush()
        reason = status.finish_reason
        return self._output(req, new_ids, text, str(reason) if reason else None, lps or [])

    @staticmethod
    def _output(req: Request, new_ids: list[int], text: str, reason: str | None, lps: list) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=new_ids,
            new_text=text,
            finished=reason is not None,
            finish_reason=reason,
            num_prompt_tokens=req.num_prompt_tokens,
            num_generated_tokens=req.num_output_tokens,
            cached_tokens=req.num_cached_tokens,
            logprobs=lps,
        )

    def score(self, token_ids: list[int]) -> list[float]:
        """``log p(token_i | tokens_<i)`` for ``i >= 1``, through the paged cache in prefill chunks.

        Call it from the thread that steps the engine. Its blocks are borrowed from the pool for the
        duration of the call; if the pool is too busy it raises ``RequestError``.
        """
        if len(token_ids) < 2:
            raise RequestError("scoring needs at least two tokens", param="input_ids")
        self._stash += self.sync()  # the runner's input buffers must be free; outputs wait for step()
        # every token goes through the cache, the last one included: the limit is on them all
        limit, n = self.max_tokens_per_request, len(token_ids)
        if n > limit:
            where = (
                f"session_len={self.session_len}"
                if limit == self.session_len
                else f"the KV cache's {limit} tokens (session_len={self.session_len})"
            )
            raise RequestError(
                f"input_ids has {n} tokens, which exceeds {where}; score at most {limit} tokens",
                param="input_ids",
            )
        vocab = self.model_config.vocab_size
        for i, t in enumerate(token_ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise RequestError(
                    f"input_ids[{i}] = {t!r} is not a token id in [0, {vocab})", param="input_ids"
                )
        req = Request(f"score-{id(token_ids)}", list(token_ids), GenerationConfig(max_new_tokens=1))
        if self.block_manager.blocks_for(len(token_ids)) > self.block_manager.num_free_blocks:
            raise RequestError(
                f"not enough free KV blocks to score {len(token_ids)} tokens now; retry when the engine is idle",
                param="input_ids",
            )
        logprobs: list[float] = []
        try:
            while req.num_computed_tokens < len(token_ids):
                start = req.num_computed_tokens
                n = min(len(token_ids) - start, self.scheduler_config.max_prefill_token_num)
                self.block_manager.allocate(req, n)
                logprobs += self.executor.score(req, start, n)
                req.num_computed_tokens += n
        finally:
            self.block_manager.free(req)
        return logprobs

    # -- stats ------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.block_manager.num_blocks
