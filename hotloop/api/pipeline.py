"""The Python pipeline: LMDeploy-shaped ``pipeline()`` over one engine, with chat sessions.

``pipe(prompts)`` submits every prompt to the engine at once and steps it until all finish, so a
list of prompts is batched by the scheduler exactly as a server would batch them.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hotloop.api.build import BuiltEngine, build_engine
from hotloop.config import EngineConfig
from hotloop.engine.outputs import RequestOutput
from hotloop.messages import MAX_SEED, GenerationConfig, RequestError, Response
from hotloop.utils.logging import get_logger
from hotloop.utils.text import unicode_error
from hotloop.vl.image import DEFAULT_POLICY, ImageFetchPolicy
from hotloop.vl.inputs import ImageInput
from hotloop.vl.processor import build_vl_processor
from hotloop.vl.prompt import VLPrompt, attach_images, is_vl_prompt, messages_have_images, to_vl_prompt

logger = get_logger(__name__)

Message = dict[str, Any]
Prompt = str | list[Message] | VLPrompt


@dataclass
class Session:
    """A multi-turn conversation for ``Pipeline.chat``: its messages and the last response."""

    session_id: int
    history: list[Message] = field(default_factory=list)
    response: Response | None = None

    def __repr__(self) -> str:
        turns = "\n".join(f"{m['role']}: {m['content']}" for m in self.history)
        return f"Session(id={self.session_id}):\n{turns}"


class Pipeline:
    """Generate from a model in Python. Use as a context manager or call ``close()``."""

    def __init__(
        self,
        model_path: str | None = None,
        backend_config: EngineConfig | None = None,
        chat_template: str | None = None,
        log_level: str | None = None,
        image_fetch_policy: ImageFetchPolicy | None = None,
        chat_template_config: Any = None,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise TypeError(f"pipeline() got unexpected arguments: {sorted(kwargs)}")
        # LMDeploy's ChatTemplateConfig: its ``chat_template`` (a Jinja template) if it has one; a
        # string is taken as the template itself
        if chat_template_config is not None and chat_template is None:
            chat_template = (
                chat_template_config
                if isinstance(chat_template_config, str)
                else getattr(chat_template_config, "chat_template", None)
            )
            if chat_template is None:
                raise TypeError(
                    "chat_template_config must be a Jinja chat template (a string) or carry one in "
                    "its chat_template attribute; LMDeploy's named templates are not supported, the "
                    "model's own template is used when none is given"
                )
        if log_level:
            from hotloop.utils.logging import set_log_level

            set_log_level(log_level)
        self._built: BuiltEngine | None = build_engine(model_path, backend_config)
        self.tokenizer = self._built.tokenizer
        self.chat_template = chat_template
        # Vision-language models: the processor that turns images into pixels and image tokens.
        self.vl = build_vl_processor(
            self._built.model_path, self._built.model_config.hf_config, self.tokenizer
        )
        self.image_fetch_policy = image_fetch_policy or DEFAULT_POLICY
        self._ids = itertools.count()
        self._session_ids = itertools.count(1)
        self._running = False  # a call is generating (a stream_infer iterator may be paused)
        # held by the call that steps the engine: another thread's call waits for it; the same
        # thread's (an open stream_infer iterator) is refused, as waiting would never end
        self._busy = threading.Lock()
        self._owner: int | None = None

    # -- properties -----------------------------------------------------------------------------
    @property
    def engine(self):  # type: ignore[no-untyped-def]
        if self._built is None:
            raise RuntimeError("the pipeline is closed")
        return self._built.engine

    @property
    def built(self) -> BuiltEngine:
        if self._built is None:
            raise RuntimeError("the pipeline is closed")
        return self._built

    # -- prompt handling ------------------------------------------------------------------------
    def encode(self, prompt: Prompt, do_preprocess: bool = True) -> list[int]:
        """Token ids for a string or an OpenAI message list (chat template applied by default)."""
        if isinstance(prompt, str):
            problem = unicode_error(prompt, "prompt")
            if problem is not None:  # (the tokenizer's own error names no field)
                raise RequestError(problem, "prompt")
            if not do_preprocess or not self.has_chat_template:
                return list(self.tokenizer.encode(prompt, add_special_tokens=True))
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
            raise RequestError(
                "a prompt must be a string or a list of {'role', 'content'} messages", "prompt"
            )
        if not prompt:
            raise RequestError(
                "the message list is empty: a chat prompt needs at least one {'role', 'content'} message",
                "messages",
            )
        prompt = [_text_message(m, i) for i, m in enumerate(prompt)]
        if not self.has_chat_template:
            raise RequestError(
                "this model has no chat template, so message lists cannot be formatted; "
                "pass a plain string with do_preprocess=False or set chat_template",
                "messages",
            )
        try:
            text = self.tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=False, chat_template=self.chat_template
            )
        except Exception as e:  # jinja's errors, and those templates raise themselves
            raise RequestError(f"the chat template could not render these messages: {e}", "messages") from e
        problem = unicode_error(text, "messages")
        if problem is not None:
            raise RequestError(problem, "messages")
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_with_images(
        self, prompt: Prompt, do_preprocess: bool = True
    ) -> tuple[list[int], list[ImageInput]]:
        """Token ids and the images they hold (loaded, preprocessed, placeholders expanded)."""
        if isinstance(prompt, list) and messages_have_images(prompt):
            prompt = VLPrompt(prompt, [])
        if isinstance(prompt, VLPrompt) and not prompt.images and isinstance(prompt.prompt, str):
            prompt = prompt.prompt
        if not isinstance(prompt, VLPrompt):
            ids = self.encode(prompt, do_preprocess)
            return self.vl.expand(ids, [], self.image_fetch_policy) if self.vl else (ids, [])
        if self.vl is None:
            raise RequestError(
                f"this model ({self.built.model_config.architecture}) does not take images", "images"
            )
        text, images = attach_images(prompt, self.vl.placeholder, self.vl.marker)
        return self.vl.expand(
            self.encode(text, do_preprocess),
            images,
            self.image_fetch_policy,
            self.engine.max_tokens_per_request,
        )

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template or getattr(self.tokenizer, "chat_template", None))

    @staticmethod
    def _normalize(prompts: Any, vl: bool = False) -> tuple[list[Prompt], bool]:
        """-> (list of prompts, whether the input was a single prompt). With ``vl`` (a model that
        takes images) ``("text", "path-or-url")`` is a prompt with an image, not two prompts."""
        if isinstance(prompts, str):
            return [prompts], True
        if is_vl_prompt(prompts, vl):
            return [to_vl_prompt(prompts)], True
        if isinstance(prompts, list) and prompts and all(isinstance(m, dict) for m in prompts):
            return [prompts], True
        if isinstance(prompts, (list, tuple)):
            out: list[Prompt] = []
            for p in prompts:
                if isinstance(p, (list, tuple)) and len(p) == 1 and isinstance(p[0], str):
                    p = p[0]  # LMDeploy accepts [["text"], ...]
                if is_vl_prompt(p, vl):
                    out.append(to_vl_prompt(p))
                    continue
                if not isinstance(p, (str, list)):
                    raise RequestError(f"unsupported prompt type {type(p).__name__}", "prompts")
                if isinstance(p, list) and not all(isinstance(m, dict) for m in p):
                    raise RequestError(
                        f"prompts[{len(out)}] is a list of {type(next(m for m in p if not isinstance(m, dict))).__name__}: "
                        "a prompt is a string or a list of chat messages (dicts); token ids go to the "
                        "server's /v1/completions or /generate",
                        "prompts",
                    )
                out.append(p if isinstance(p, str) else list(p))
            return out, False
        raise RequestError(f"unsupported prompts type {type(prompts).__name__}", "prompts")

    # -- generation -----------------------------------------------------------------------------
    def _submit(
        self,
        prompts: Sequence[Prompt],
        gen_config: GenerationConfig | Sequence[GenerationConfig],
        do_preprocess: bool,
    ) -> list[tuple[int, int, str, list[int]]]:
        """Claim the engine, encode and validate everything, then submit: a bad prompt submits
        nothing (and releases the claim). ``gen_config``: one config, or one per prompt. ``_run``
        must follow (it releases the claim)."""
        configs = _per_prompt(gen_config, len(prompts))
        self._claim()
        subs: list[tuple[int, int, str, list[int]]] = []
        try:
            encoded = [self.encode_with_images(p, do_preprocess) for p in prompts]
            for (ids, _mm), cfg in zip(encoded, configs, strict=True):
                self.engine.validate(ids, cfg)
            for i, ((ids, mm), cfg) in enumerate(zip(encoded, configs, strict=True)):
                for j in range(cfg.n):
                    params = cfg
                    if cfg.random_seed is not None and j > 0:
                        params = cfg.replace(random_seed=(cfg.random_seed + j) % MAX_SEED)
                    rid = f"pipe-{next(self._ids)}"
                    if mm:
                        self.engine.add_request(rid, ids, params, mm_inputs=mm)
                    else:
                        self.engine.add_request(rid, ids, params)
                    subs.append((i, j, rid, ids))
        except BaseException:
            # add_request may refuse a later prompt (a JSON schema that does not compile, image
            # spans) after earlier ones were queued: take those back, or they would run unseen
            # under the next call and hold KV blocks after it
            try:
                self._drop({rid for _i, _j, rid, _ids in subs})
            finally:
                self._release()
            raise
        return subs

    def _claim(self) -> None:
        """Take the engine for one call: wait while another thread's call generates; refuse while
        this thread's own stream_infer iterator is open. A closed pipeline raises, also to a call
        that was waiting when ``close()`` came (the open iterator it waited for may never end)."""
        self._check_open()
        if self._owner == threading.get_ident():
            raise RuntimeError(
                "this Pipeline is already generating: a stream_infer iterator is still open. One "
                "call at a time steps the engine; finish or close() that iterator first, or pass "
                "all prompts to one call"
            )
        while not self._busy.acquire(timeout=0.1):
            self._check_open()  # closed meanwhile
        if self._built is None:  # (closed just as the engine came free)
            self._busy.release()
            self._check_open()
        self._owner = threading.get_ident()
        self._running = True

    def _check_open(self) -> None:
        if self._built is None:
            raise RuntimeError("the pipeline is closed")

    def _release(self) -> None:
        self._running = False
        self._owner = None
        self._busy.release()

    def _run(self, rids: set[str]) -> Iterator[RequestOutput]:
        """Step the engine until every request in ``rids`` finished, yielding their outputs; then
        release the claim ``_submit`` took."""
        pending = set(rids)
        try:
            while pending:
                for o in self.engine.step():
                    if o.request_id in pending:
                        if o.finished:
                            pending.discard(o.request_id)
                        yield o
        finally:
            try:
                self._drop(pending)  # the caller stopped early: free the blocks
            finally:
                self._release()

    def _drop(self, rids: set[str]) -> None:
        """Abort the requests ``rids`` (queued or running) and step the engine until they are gone;
        their outputs are dropped. Called with the claim held; a closed pipeline has no engine to
        clean (an iterator left open across ``close()`` ends quietly)."""
        if not rids or self._built is None:
            return
        engine = self.engine
        for rid in rids:
            engine.abort_request(rid)
        engine.step()  # takes queued requests in and ends every aborted one
        while engine.has_unfinished() and any(r in engine.requests for r in rids):
            engine.step()

    def __call__(
        self,
        prompts: Any,
        gen_config: GenerationConfig | Sequence[GenerationConfig] | None = None,
        do_preprocess: bool = True,
        config: GenerationConfig | None = None,
    ) -> Any:
        """Generate for one prompt (-> Response) or a list (-> list of Response). ``gen_config``:
        one config, or a list with one per prompt (as LMDeploy).

        With ``n > 1`` a prompt gives a list of ``n`` responses. Calls from several threads run one
        after another (each waits for the engine).
        """
        if gen_config is None:  # (not `or`: an empty list is the caller's mistake, refused below)
            gen_config = config if config is not None else GenerationConfig()
        items, single = self._normalize(prompts, self.vl is not None)
        configs = _per_prompt(gen_config, len(items))
        subs = self._submit(items, gen_config, do_preprocess)
        by_id = {rid: (i, j, ids) for i, j, rid, ids in subs}
        acc: dict[str, Response] = {
            rid: Response("", 0, len(ids), None, [], None, i, choice=j) for rid, (i, j, ids) in by_id.items()
        }
        for o in self._run(set(by_id)):
            _accumulate(acc[o.request_id], o)
        results: list[Any] = []
        for i in range(len(items)):
            group = [acc[rid] for rid, (pi, _j, _ids) in by_id.items() if pi == i]
            results.append(group if configs[i].n > 1 else group[0])
        return results[0] if single else results

    def stream_infer(
        self,
        prompts: Any,
        gen_config: GenerationConfig | Sequence[GenerationConfig] | None = None,
        do_preprocess: bool = True,
    ) -> Iterator[Response]:
        """Yield incremental responses (new text and token ids); ``index`` says which prompt and
        ``choice`` which of its ``n`` samples. One call at a time: another call while this iterator
        is open raises (it would step the engine under it)."""
        if gen_config is None:
            gen_config = GenerationConfig()
        items, _single = self._normalize(prompts, self.vl is not None)
        subs = self._submit(items, gen_config, do_preprocess)
        by_id = {rid: (i, j) for i, j, rid, _ids in subs}
        for o in self._run(set(by_id)):
            i, j = by_id[o.request_id]
            yield Response(
                text=o.new_text,
                generate_token_len=o.num_generated_tokens,
                input_token_len=o.num_prompt_tokens,
                finish_reason=o.finish_reason,
                token_ids=list(o.new_token_ids),
                logprobs=list(o.logprobs) or None,
                prompt_logprobs=o.prompt_logprobs,
                index=i,
                cached_tokens=o.cached_tokens,
                choice=j,
            )

    def get_ppl(self, input_ids: list[int] | list[list[int]]) -> list[float]:
        """Perplexity of each token sequence (LMDeploy's ``get_ppl``): exp of the mean negative
        log-likelihood of tokens 1..n-1 given their prefixes."""
        import math

        batch = [input_ids] if input_ids and isinstance(input_ids[0], int) else input_ids
        self._claim()  # score() steps the engine too
        try:
            result = []
            for ids in batch:
                lps = self.engine.score(list(ids))  # type: ignore[arg-type]
                result.append(math.exp(-sum(lps) / len(lps)))
            return result
        finally:
            self._release()

    def chat(
        self,
        prompt: str | list[Message] | tuple[str, Any],
        session: Session | None = None,
        gen_config: GenerationConfig | None = None,
    ) -> Session:
        """One turn of a multi-turn conversation; pass the returned session to continue it. A turn
        has one reply: ``gen_config.n`` must be 1."""
        if gen_config is not None and gen_config.n != 1:
            raise RequestError(
                f"n={gen_config.n}: chat() keeps one reply per turn; use pipe(messages, gen_config) "
                "for several samples",
                "n",
            )
        if session is None:
            session = Session(next(self._session_ids))
        new = _chat_turn(prompt)
        messages = session.history + new
        resp = self(messages, gen_config=gen_config)
        session.history = messages + [{"role": "assistant", "content": resp.text}]
        session.response = resp
        resp.session_id = session.session_id
        return session

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the model and the KV cache."""
        self._built = None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chat_turn(prompt: Any) -> list[Message]:
    """The messages one ``chat()`` turn adds: a string is a user message, ``(text, image or
    images)`` (LMDeploy's VL chat form) a user message with the images in front of the text, a list
    of message dicts is taken as it is."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, tuple) and len(prompt) == 2 and isinstance(prompt[0], str):
        text, images = prompt
        imgs = list(images) if isinstance(images, (list, tuple)) else [images]
        parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": img} for img in imgs]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]
    if not isinstance(prompt, list) or not all(isinstance(m, dict) and "role" in m for m in prompt):
        raise RequestError(
            "chat() takes a string, a (text, image or images) tuple or a list of message dicts with a "
            f"'role'; got {type(prompt).__name__}",
            "prompt",
        )
    if not prompt:
        raise RequestError("chat() needs a message: got an empty list", "prompt")
    return list(prompt)


def _accumulate(resp: Response, o: RequestOutput) -> None:
    resp.text += o.new_text
    resp.token_ids.extend(o.new_token_ids)
    resp.generate_token_len = o.num_generated_tokens
    resp.input_token_len = o.num_prompt_tokens
    resp.cached_tokens = o.cached_tokens
    if o.logprobs:
        resp.logprobs = (resp.logprobs or []) + list(o.logprobs)
    if o.prompt_logprobs is not None:
        resp.prompt_logprobs = o.prompt_logprobs
    if o.finished:
        resp.finish_reason = o.finish_reason


def _per_prompt(gen_config: GenerationConfig | Sequence[GenerationConfig], n: int) -> list[GenerationConfig]:
    """One config per prompt: ``gen_config`` for every prompt, or a list of ``n`` (LMDeploy's)."""
    if isinstance(gen_config, GenerationConfig):
        return [gen_config] * n
    if isinstance(gen_config, (list, tuple)) and all(isinstance(g, GenerationConfig) for g in gen_config):
        if len(gen_config) != n:
            raise RequestError(
                f"gen_config is a list of {len(gen_config)} configs for {n} prompts: give one config, "
                "or one per prompt",
                "gen_config",
            )
        return list(gen_config)
    raise RequestError(
        f"gen_config must be a GenerationConfig or a list of them, got {type(gen_config).__name__}",
        "gen_config",
    )


def _text_message(m: Message, i: int) -> Message:
    """A message whose content the chat template can take: a list of OpenAI text parts joined by
    newlines (as the server joins them), None as the empty string."""
    role = m.get("role")
    if not isinstance(role, str) or not role:
        raise RequestError(
            f"messages[{i}] needs a 'role' (a string such as 'user'), got {role!r}", f"messages[{i}].role"
        )
    content = m.get("content")
    if content is None:
        return {**m, "content": ""}
    if isinstance(content, str):
        return m
    if not isinstance(content, list):
        raise RequestError(
            f"messages[{i}].content must be a string or a list of {{'type': 'text', 'text': str}} parts, "
            f"got {type(content).__name__}",
            f"messages[{i}].content",
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RequestError(
                f"messages[{i}].content[{j}] must be a {{'type': 'text', 'text': str}} part here (image "
                "parts go to vision-language models)",
                f"messages[{i}].content[{j}]",
            )
        texts.append(part["text"])
    return {**m, "content": "\n".join(texts)}
