"""``hotloop chat``: an interactive, streaming, multi-turn chat in the terminal."""

from __future__ import annotations

import argparse
import sys

from hotloop.cli.engine_args import add_engine_args, engine_config_from_args
from hotloop.messages import GenerationConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat", help="chat with a model in the terminal", description="Interactive streaming chat."
    )
    p.add_argument(
        "model_path", nargs="?", default=None, help="HF folder or .gguf file (default: embedded SmolLM2)"
    )
    p.add_argument("--max-new-tokens", type=int, default=512, help="most tokens per answer (default: 512)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument(
        "--chat-template", default=None, help="a Jinja chat template file to use instead of the model's"
    )
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hotloop.api.pipeline import Pipeline
    from hotloop.serve.chat_template import load_chat_template

    template = load_chat_template(args.chat_template)  # a Jinja file or the template text, as serve
    gen = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        do_sample=args.temperature > 0,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
    )
    print("loading the model ...", flush=True)
    with Pipeline(args.model_path, engine_config_from_args(args), chat_template=template) as pipe:
        print(
            f"model: {pipe.built.model_path.name} ({pipe.built.backend}, {pipe.built.device}). "
            "Type 'exit' to quit, 'end' to start a new conversation.",
            flush=True,
        )
        history: list[dict[str, str]] = []
        while True:
            try:
                line = input("\nuser >>> ")
            except (EOFError, KeyboardInterrupt):
                print()
                break
            text = line.strip()
            if text == "exit":
                break
            if text in ("end", "reset"):  # LMDeploy's chat ends a session with "end"
                history.clear()
                print("(a new conversation)", flush=True)
                continue
            if not text:
                continue
            history.append({"role": "user", "content": text})
            print("assistant >>> ", end="", flush=True)
            answer = []
            try:
                for r in pipe.stream_infer([history], gen):
                    sys.stdout.write(r.text)
                    sys.stdout.flush()
                    answer.append(r.text)
            except ValueError as e:
                history.pop()
                print(f"\n[error] {e}")
                if history and getattr(e, "param", None) in ("prompt", "max_new_tokens"):  # too long
                    turns = len(history) // 2
                    print(
                        f"[the conversation so far ({turns} turn{'' if turns == 1 else 's'}) is part of that prompt: type 'end' "
                        "to start a new one, or restart with a larger --session-len]"
                    )
                continue
            print(flush=True)
            history.append({"role": "assistant", "content": "".join(answer)})
    return 0
