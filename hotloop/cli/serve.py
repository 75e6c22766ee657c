"""``hotloop serve [api_server] [MODEL]``: the OpenAI-compatible HTTP server.

``hotloop serve api_server MODEL`` is LMDeploy's spelling; ``hotloop serve MODEL`` (or plain
``hotloop serve`` for the default model) is the same thing. Server flags keep LMDeploy's names and
defaults; every ``EngineConfig`` field is a flag too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hotloop.cli.engine_args import add_engine_args, engine_config_from_args
from hotloop.serve import tool_calls

SUBCOMMANDS = ("api_server",)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API. "
        "Usage: hotloop serve [api_server] [MODEL] [flags].",
        usage="hotloop serve [api_server] [MODEL] [flags]",
    )
    p.add_argument(
        "positionals",
        nargs="*",
        metavar="[api_server] [MODEL]",
        help="optional 'api_server', then an HF folder or .gguf file (default: the embedded SmolLM2)",
    )
    add_server_args(p)
    add_engine_args(p)
    p.set_defaults(func=run)


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    # LMDeploy's names, then vLLM's for the same flag
    g.add_argument("--server-name", "--host", default="0.0.0.0", help="host to bind (default: 0.0.0.0)")
    g.add_argument("--server-port", "--port", type=int, default=23333, help="port to bind (default: 23333)")
    g.add_argument(
        "--model-name",
        "--served-model-name",
        default=None,
        help="name clients use as 'model' (default: the model folder's name)",
    )
    g.add_argument(
        "--api-keys",
        "--api-key",
        nargs="+",
        default=None,
        help="accepted API keys; if set, every route but /health needs one",
    )
    g.add_argument("--allow-origins", nargs="+", default=["*"], help="CORS allowed origins (default: *)")
    g.add_argument("--allow-methods", nargs="+", default=["*"], help="CORS allowed methods (default: *)")
    g.add_argument("--allow-headers", nargs="+", default=["*"], help="CORS allowed headers (default: *)")
    g.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    g.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        type=str.upper,
        help="log level (default: INFO)",
    )
    g.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=None,
        help="generation requests served at once; more wait for a slot (default: no limit)",
    )
    g.add_argument(
        "--chat-template", default=None, help="a Jinja chat template file to use instead of the model's"
    )
    g.add_argument(
        "--tool-call-parser",
        default=None,
        choices=tool_calls.CHOICES,
        help="how the model writes tool calls, for chat requests with tools and tool_choice auto: "
        "hermes (alias qwen: <tool_call> blocks), llama3_json (alias llama3), internlm, mistral "
        "(default: the format the chat template names, if any)",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight requests get to finish after SIGINT/SIGTERM; what still runs a second "
        "before the end is aborted (its stream ends with finish_reason 'abort') (default: 10)",
    )
    g.add_argument(
        "--allow-private-image-urls",
        action="store_true",
        help="let image_url parts fetch from loopback, private and link-local addresses (default: refused)",
    )
    g.add_argument(
        "--image-fetch-timeout", type=float, default=10.0, help="seconds to fetch one image URL (default: 10)"
    )
    g.add_argument(
        "--image-max-bytes",
        type=int,
        default=20 * 2**20,
        help="largest image accepted, in bytes (default: 20 MiB)",
    )


def split_positionals(values: list[str]) -> tuple[str, str | None]:
    """-> (subcommand, model). ``[]``, ``[MODEL]``, ``[api_server]``, ``[api_server, MODEL]``."""
    rest = list(values)
    command = "api_server"
    if rest and rest[0] in SUBCOMMANDS:
        command = rest.pop(0)
    if len(rest) > 1:
        raise ValueError(f"expected at most one MODEL, got {rest}")
    return command, (rest[0] if rest else None)


def model_name_for(model: str | None) -> str:
    """The default ``--model-name``: the model folder's name (a GGUF file's stem)."""
    if model is None:
        from hotloop.models.resolve import DEFAULT_MODEL_NAME

        return DEFAULT_MODEL_NAME
    from hotloop.serve.state import default_model_name

    return default_model_name(model.rstrip("/"))


def check_bindable(host: str, port: int) -> None:
    """Raise ``ValueError`` naming the flag unless ``host:port`` can be listened on now: a port in use
    or a name that does not resolve is found before the model loads, not after it (uvicorn's bind).
    (A port taken between this check and the server's start still fails there.)"""
    import socket

    try:
        family, kind, proto, _name, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ValueError(
            f"--server-name {host!r}: cannot resolve it ({e.strerror}); use an address such as 0.0.0.0"
        ) from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(addr)
        except OSError as e:
            raise ValueError(
                f"--server-port {port}: cannot listen on {host}:{port} ({e.strerror}); pick another port "
                "or stop the process that holds it"
            ) from None


def run(args: argparse.Namespace) -> int:
    from hotloop.api.build import build_engine
    from hotloop.serve.api_server import ServerArgs, run_server
    from hotloop.serve.chat_template import load_chat_template
    from hotloop.utils.gc_tuning import settle_after_startup
    from hotloop.utils.logging import set_log_level

    _command, model = split_positionals(args.positionals)
    if args.api_keys is not None and not all(k.strip() for k in args.api_keys):
        # (`--api-keys "$KEY"` with KEY unset: an empty key would leave the server open)
        raise ValueError("--api-keys: an empty key was given; pass non-empty keys, or leave the flag out")
    if args.api_keys and model is None:
        # `--api-keys KEY MODEL`: the flag takes every word after it, so MODEL became a key (and the
        # default model was served, open to anyone who sends the path as a key)
        taken = [k for k in args.api_keys if k == "api_server" or Path(k).exists()]
        if taken:
            raise ValueError(
                f"--api-keys took {taken[0]!r}, which names a model path (or the api_server command), as a "
                "key: put MODEL before the flags (hotloop serve api_server MODEL --api-keys KEY ...)"
            )
    server_args = ServerArgs(
        server_name=args.server_name,
        server_port=args.server_port,
        model_name=args.model_name or model_name_for(model),
        api_keys=tuple(args.api_keys) if args.api_keys else None,
        allow_origins=tuple(args.allow_origins),
        allow_methods=tuple(args.allow_methods),
        allow_headers=tuple(args.allow_headers),
        allow_credentials=args.allow_credentials,
        log_level=args.log_level,
        max_concurrent_requests=args.max_concurrent_requests,
        chat_template=args.chat_template,
        tool_call_parser=args.tool_call_parser,
        shutdown_timeout=args.shutdown_timeout,
        allow_private_image_urls=args.allow_private_image_urls,
        image_fetch_timeout=args.image_fetch_timeout,
        image_max_bytes=args.image_max_bytes,
    )
    set_log_level(args.log_level)
    load_chat_template(args.chat_template)  # fail on a bad path before loading the model
    check_bindable(server_args.server_name, server_args.server_port)  # (and on a port in use)
    built = build_engine(model, engine_config_from_args(args))
    settle_after_startup()
    run_server(built, server_args)
    return 0
