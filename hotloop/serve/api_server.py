"""The OpenAI-compatible HTTP server: ``create_app`` (FastAPI) and ``run_server`` (uvicorn).

Routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/generate``, ``/tokenize``,
``/detokenize``, ``/health``, ``/metrics``. The engine loop runs on its own thread (``AsyncEngine``),
started and stopped with the app's lifespan. On SIGINT/SIGTERM the server stops accepting work
(uvicorn closes the listening socket; a request on an open connection gets 503), lets in-flight
requests finish for up to ``shutdown_timeout`` seconds (what still runs a second before the end is
aborted, so that its stream ends with finish_reason ``abort`` and ``[DONE]``), then stops the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response

from hotloop.serve import chat, completions, native
from hotloop.serve.errors import error_response, install_error_handlers
from hotloop.serve.gate import GateMiddleware, JSONByDefault
from hotloop.serve.metrics import CONTENT_TYPE
from hotloop.serve.openai_protocol import ModelCard, ModelList
from hotloop.serve.state import ServerArgs, ServerState
from hotloop.utils.logging import get_logger, set_log_level

__all__ = ["ServerArgs", "create_app", "run_server"]

logger = get_logger(__name__)


def create_app(built_engine: Any, server_args: ServerArgs | None = None) -> FastAPI:
    """The FastAPI app over a built engine (``hotloop.api.build.BuiltEngine`` or the same shape)."""
    args = server_args or ServerArgs()
    state = ServerState(built_engine, args)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.async_engine.start()
        try:
            yield
        finally:
            state.draining = True
            await asyncio.to_thread(state.async_engine.shutdown)

    app = FastAPI(title="hotloop", summary="OpenAI-compatible LLM server", lifespan=lifespan)
    app.state.hotloop = state
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(native.router)
    _add_basic_routes(app, state)
    app.add_middleware(JSONByDefault)  # innermost: after the key check
    app.add_middleware(GateMiddleware, state=state)
    app.add_middleware(
        CORSMiddleware,  # outermost: preflights are answered before the key check
        allow_origins=list(args.allow_origins),
        allow_methods=list(args.allow_methods),
        allow_headers=list(args.allow_headers),
        allow_credentials=args.allow_credentials,
    )
    return app


def _add_basic_routes(app: FastAPI, state: ServerState) -> None:
    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: load balancers' probes
    async def health() -> Response:
        if state.draining:
            return error_response(503, "the server is shutting down", None, "shutting_down")
        if not state.async_engine.is_alive:
            err = state.async_engine.error
            return error_response(503, f"the engine loop is not running: {err!r}", None, "engine_unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    # one card for both routes; ``created`` is when this app was made (not each response's time)
    card = ModelCard(id=state.model_name, root=str(state.built.model_path), max_model_len=state.context_limit)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[card])

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard)
    async def model(model_id: str) -> ModelCard:
        state.check_model(model_id)
        return card

    @app.get("/", include_in_schema=False)
    async def root(_: Request) -> dict[str, Any]:
        return {"name": "hotloop", "model": state.model_name, "docs": "/docs"}


class _Server(uvicorn.Server):
    """uvicorn's server, but the first SIGINT/SIGTERM marks the app as draining (503 for new work),
    and the signal is not re-raised after a clean shutdown (exit status 0)."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.hotloop_state = state

    def handle_exit(self, sig: int, frame: Any) -> None:
        state = self.hotloop_state
        if not state.draining:
            logger.info(
                "received %s: finishing in-flight requests, then shutting down", signal.Signals(sig).name
            )
            # Whatever is still running one second before uvicorn's grace period ends is aborted, so
            # that its stream ends with finish_reason "abort" and [DONE] instead of being cut off.
            grace = self.config.timeout_graceful_shutdown or 0
            with contextlib.suppress(RuntimeError):  # (no loop running: nothing can be in flight)
                loop = asyncio.get_running_loop()
                loop.call_soon_threadsafe(loop.call_later, max(grace - 1.0, 0.0), self._abort_in_flight)
        state.draining = True
        super().handle_exit(sig, frame)

    def _abort_in_flight(self) -> None:
        n = self.hotloop_state.abort_all()
        if n:
            logger.warning("shutdown: aborted %d request(s) still running at the end of the grace period", n)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        original = {s: signal.signal(s, self.handle_exit) for s in sigs}
        try:
            yield
        finally:
            for s, handler in original.items():
                signal.signal(s, handler)


def run_server(
    built_engine: Any, server_args: ServerArgs | None = None, sock: socket.socket | None = None
) -> None:
    """Serve until SIGINT/SIGTERM. ``sock``: an already bound socket (tests), else bind the address."""
    args = server_args or ServerArgs()
    set_log_level(args.log_level)
    app = create_app(built_engine, args)
    state: ServerState = app.state.hotloop
    config = uvicorn.Config(
        app,
        host=args.server_name,
        port=args.server_port,
        log_level=args.log_level.lower(),
        timeout_graceful_shutdown=max(1, int(round(args.shutdown_timeout))),
        access_log=args.log_level.upper() == "DEBUG",
    )
    server = _Server(config, state)
    engine = built_engine.engine
    host = args.server_name
    port = sock.getsockname()[1] if sock is not None else args.server_port
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    logger.info(
        "serving %s (%s) on http://%s:%d  [backend %s, device %s, KV cache %d blocks of %d tokens, session_len %d]",
        state.model_name,
        built_engine.model_path,
        shown,
        port,
        built_engine.backend,
        built_engine.device,
        engine.num_total_blocks,
        getattr(getattr(engine, "cache_config", None), "block_size", 0),
        engine.session_len,
    )
    if args.api_keys:
        logger.info("API keys required on every route but /health")
    server.run(sockets=[sock] if sock is not None else None)
    logger.info("server stopped")
