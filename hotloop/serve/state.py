"""The server's settings (``ServerArgs``) and its per-process state (``ServerState``)."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotloop.engine.async_engine import AsyncEngine
from hotloop.engine.detokenizer import byte_table
from hotloop.serve import tool_calls
from hotloop.serve.chat_template import load_chat_template
from hotloop.serve.errors import APIError
from hotloop.serve.metrics import ServerMetrics
from hotloop.utils.text import unicode_error
from hotloop.vl.image import ImageFetchPolicy
from hotloop.vl.processor import VLProcessor, build_vl_processor

# /tokenize counts text that need not fit the context; this bounds the seconds one request may hold
# the tokenizing thread (about 8 MiB of text)
TOKENIZE_MAX_CHARS = 2**23


@dataclass(frozen=True)
class ServerArgs:
    """HTTP server settings, with LMDeploy's ``api_server`` names and defaults.

    max_concurrent_requests: generation requests served at once; more wait for a slot (never dropped).
    None means no limit beyond the engine's own queue. shutdown_timeout: seconds in-flight requests
    get to finish after SIGINT/SIGTERM before they are aborted.
    """

    server_name: str = "0.0.0.0"
    server_port: int = 23333
    model_name: str | None = None
    api_keys: tuple[str, ...] | None = None
    allow_origins: tuple[str, ...] = ("*",)
    allow_methods: tuple[str, ...] = ("*",)
    allow_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    log_level: str = "INFO"
    max_concurrent_requests: int | None = None
    chat_template: str | None = None
    tool_call_parser: str | None = None  # (serve/tool_calls.py; None: the one the template names)
    shutdown_timeout: float = 10.0
    # image_url parts: fetch limits; private/loopback/link-local hosts are refused unless allowed
    allow_private_image_urls: bool = False
    image_fetch_timeout: float = 10.0
    image_max_bytes: int = 20 * 2**20

    def __post_init__(self) -> None:
        if self.max_concurrent_requests is not None and self.max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests={self.max_concurrent_requests} must be >= 1")
        tool_calls.canonical(self.tool_call_parser)  # an unknown name raises, naming the choices
        if not 0 <= self.server_port <= 65535:
            raise ValueError(f"server_port={self.server_port} must lie in [0, 65535]")
        if not (math.isfinite(self.shutdown_timeout) and self.shutdown_timeout >= 0):
            raise ValueError(
                f"--shutdown-timeout {self.shutdown_timeout}: must be a finite number of seconds >= 0"
            )
        if not (math.isfinite(self.image_fetch_timeout) and self.image_fetch_timeout > 0):
            raise ValueError(
                f"--image-fetch-timeout {self.image_fetch_timeout}: must be a finite number of seconds > 0"
            )


def default_model_name(model_path: Path | str) -> str:
    """The model folder's name (a GGUF file's name without ``.gguf``; a GGUF conversion cached as
    ``<stem>-<hash>`` gives ``<stem>``)."""
    path = Path(model_path)
    if path.suffix == ".gguf":
        return path.stem
    if path.parent.name == "converted":
        return re.sub(r"-[0-9a-f]{12}$", "", path.name)
    return path.name


class ServerState:
    """Everything a request handler needs: the engine, tokenizer, names, limits and metrics."""

    def __init__(self, built: Any, args: ServerArgs) -> None:
        self.built = built
        self.args = args
        self.engine = built.engine
        self.tokenizer = built.tokenizer
        self.async_engine = AsyncEngine(self.engine, start=False)
        self.model_name = args.model_name or default_model_name(built.model_path)
        self.chat_template = load_chat_template(args.chat_template)
        # the tool-call format: the flag's, else the one the chat template names (or None)
        self.tool_call_parser = tool_calls.canonical(args.tool_call_parser) or tool_calls.infer(
            self.chat_template or getattr(self.tokenizer, "chat_template", None)
        )
        self.metrics = ServerMetrics(self.engine)
        self.api_keys = tuple(k for k in (args.api_keys or ()) if k)
        self.draining = False
        self._max_concurrent = args.max_concurrent_requests
        self._semaphore: asyncio.Semaphore | None = None
        self._token_text: dict[int, str] = {}
        self._byte_table: list[bytes] | None = None  # token_bytes' table, built at first use
        self.jobs: set[Any] = set()  # the GenerationJobs in flight (abort_all)
        self._max_text_chars: int | None = None  # check_text_length's bound, set at first use
        # Prompts are tokenized on one worker thread: off the event loop (a long prompt would stall
        # every stream in flight) and one at a time (tokenizer calls never overlap each other).
        self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="hotloop-tokenize")
        # Vision-language models: the processor for image_url parts (None: a text-only model).
        self.vl: VLProcessor | None = None
        if hasattr(built, "model_path") and hasattr(built, "model_config"):
            self.vl = build_vl_processor(built.model_path, built.model_config.hf_config, built.tokenizer)
        self.image_fetch_policy = ImageFetchPolicy(
            timeout_s=args.image_fetch_timeout,
            max_bytes=args.image_max_bytes,
            allow_private=args.allow_private_image_urls,
            allow_local_files=False,
        )

    # -- limits -------------------------------------------------------------------------------
    @property
    def session_len(self) -> int:
        return int(self.engine.session_len)

    @property
    def context_limit(self) -> int:
        """Most tokens (prompt plus output) one request may hold."""
        return int(getattr(self.engine, "max_tokens_per_request", self.session_len))

    @property
    def vocab_size(self) -> int:
        return int(self.engine.model_config.vocab_size)

    @property
    def semaphore(self) -> asyncio.Semaphore | None:
        if self._max_concurrent is not None and self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._max_concurrent)
        return self._semaphore

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                "model",
                "model_not_found",
            )

    # -- tokens -------------------------------------------------------------------------------
    def abort_all(self) -> int:
        """Abort every request in flight (shutdown, at the end of its grace period): each stream
        then ends with finish_reason ``abort`` and ``[DONE]`` instead of being cut. The number of
        engine requests aborted."""
        n = 0
        for job in list(self.jobs):
            for stream in job.streams:
                self.async_engine.abort(stream.request_id, final_output=True)
                n += 1
        return n

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (for logprobs' ``bytes``): for a byte-level BPE tokenizer its
        bytes from the vocabulary, which may be part of a UTF-8 character (an emoji's first byte);
        otherwise its text encoded as UTF-8."""
        if self._byte_table is None:
            self._byte_table = byte_table(self.tokenizer, skip_special_tokens=False) or []
        table = self._byte_table
        if 0 <= token_id < len(table):
            return table[token_id]
        return self.token_text(token_id).encode("utf-8")

    def token_text(self, token_id: int) -> str:
        """The text of one token on its own (for logprobs), cached."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._token_text) < 1_000_000:
                self._token_text[token_id] = text
        return text

    async def tokenize_off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the tokenizing thread (see ``__init__``)."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, fn, *args)

    def check_text_length(self, n_chars: int, param: str, count_only: bool = False) -> None:
        """A 400 for text far too long to fit the context, before it is tokenized (tokenizing
        megabytes takes seconds on the one tokenizing thread, which every other request waits for).
        No token holds more characters than the vocabulary's longest token, so text longer than the
        context limit times that (twice over, for normalizers) cannot fit. ``count_only`` (``/tokenize``,
        which counts text that need not fit) allows up to ``TOKENIZE_MAX_CHARS`` whatever the context."""
        if self._max_text_chars is None:
            if self._byte_table is None:
                self._byte_table = byte_table(self.tokenizer, skip_special_tokens=False) or []
            longest = max((len(b) for b in self._byte_table), default=0)
            if not longest:
                vocab = self.tokenizer.get_vocab() if hasattr(self.tokenizer, "get_vocab") else {}
                longest = max((len(t) for t in vocab), default=64)
            self._max_text_chars = 2 * max(longest, 1) * self.context_limit
        if count_only:
            limit = max(self._max_text_chars, TOKENIZE_MAX_CHARS)
            if n_chars > limit:
                raise APIError(
                    400,
                    f"{param} has {n_chars} characters; /tokenize takes at most {limit}: count it in parts",
                    param,
                    "invalid_value",
                )
        elif n_chars > self._max_text_chars:
            raise APIError(
                400,
                f"{param} has {n_chars} characters, far more than the context limit of {self.context_limit} "
                f"tokens can hold (at most {self._max_text_chars} characters); shorten it",
                param,
                "context_length_exceeded",
            )

    def encode(
        self, text: str, param: str, add_special_tokens: bool = True, count_only: bool = False
    ) -> list[int]:
        """Token ids of ``text`` (field ``param``); text that is not valid Unicode, or far too long
        for the context (``check_text_length``; ``count_only`` for ``/tokenize``), is a 400."""
        self.check_text_length(len(text), param, count_only)
        problem = unicode_error(text, param)
        if problem is not None:
            raise APIError(400, problem, param, "invalid_value")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.vocab_size
        if ids and 0 <= min(ids) and max(ids) < vocab:  # the common case, at C speed
            return
        for t in ids:
            if not 0 <= t < vocab:
                raise APIError(
                    400,
                    f"{param}: token id {t} is outside the vocabulary [0, {vocab})",
                    param,
                    "invalid_value",
                )
