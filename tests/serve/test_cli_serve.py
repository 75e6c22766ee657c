"""``hotloop serve`` argument handling: LMDeploy's flag names and defaults, and the shorthand."""

from __future__ import annotations

import argparse

import pytest

from hotloop.cli import serve


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hotloop")
    serve.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_defaults_follow_lmdeploy() -> None:
    a = parse([])
    assert (a.server_name, a.server_port, a.model_name, a.api_keys) == ("0.0.0.0", 23333, None, None)
    assert a.allow_origins == ["*"] and a.allow_credentials is False and a.max_concurrent_requests is None
    assert serve.split_positionals(a.positionals) == ("api_server", None)


@pytest.mark.parametrize(
    "argv, model",
    [
        (["api_server", "./m"], "./m"),
        (["./m"], "./m"),
        (["api_server"], None),
        (["x.gguf", "--tp", "1"], "x.gguf"),
    ],
)
def test_api_server_word_is_optional(argv: list[str], model: str | None) -> None:
    assert serve.split_positionals(parse(argv).positionals) == ("api_server", model)


def test_flags_and_engine_flags() -> None:
    a = parse(
        [
            "api_server",
            "m",
            "--server-port",
            "8000",
            "--api-keys",
            "a",
            "b",
            "--log-level",
            "debug",
            "--max-concurrent-requests",
            "4",
            "--session-len",
            "2048",
            "--cache-max-entry-count",
            "0.5",
            "--backend",
            "turbomind",
            "--enable-prefix-caching",
        ]
    )
    assert a.server_port == 8000 and a.api_keys == ["a", "b"] and a.log_level == "DEBUG"
    assert a.max_concurrent_requests == 4 and a.session_len == 2048 and a.cache_max_entry_count == 0.5
    assert a.enable_prefix_caching is True
    with pytest.raises(ValueError):
        serve.split_positionals(["a", "b"])


def test_default_model_name_is_the_folder_name() -> None:
    assert serve.model_name_for(None) == "SmolLM2-135M-Instruct"
    assert serve.model_name_for("/models/Qwen2.5-7B-Instruct/") == "Qwen2.5-7B-Instruct"
    assert serve.model_name_for("/x/tiny.Q4_0.gguf") == "tiny.Q4_0"
