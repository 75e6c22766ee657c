"""The command line's edges that an audit found broken (2026-12-01), probing ``hotloop serve / chat /
lite / bench / plan`` (LMDeploy's flag names and defaults, bad values, help text, exit codes): each
test asserts the behaviour now in place. All run in-process; nothing that would load a real model or start a server
is reached (``build_engine`` / ``Pipeline`` / ``run_server`` are replaced where a defect would
otherwise let the command get that far)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hotloop.cli.engine_args import engine_config_from_args
from hotloop.cli.main import build_parser, main


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``hotloop ARGV`` in-process; a traceback (any exception but SystemExit) fails the test."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    code = e.value.code
    return (code if isinstance(code, int) else (0 if code is None else 1)), out, err


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model or serving is out of bounds: reaching either means validation came too late."""

    def fake_build(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("build_engine reached")

    def fake_serve(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("run_server reached")

    monkeypatch.setattr("hotloop.api.build.build_engine", fake_build)
    monkeypatch.setattr("hotloop.serve.api_server.run_server", fake_serve)


# -- serve ------------------------------------------------------------------------------------------


def test_serve_empty_api_key_is_refused_not_an_open_server(
    no_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--api-keys "$KEY"` with KEY unset: the server logged "API keys required" but served every
    # route without a key (ServerState drops empty keys; run_server checks the unfiltered list).
    code, _out, err = _run(["serve", "--device", "cpu", "--api-keys", ""], capsys)
    assert code != 0
    assert "--api-keys" in err and "build_engine reached" not in err, err


def test_cache_max_entry_count_1_means_all_free_memory_as_in_lmdeploy() -> None:
    # LMDeploy's --cache-max-entry-count is a float: `1` is 100% of free memory. hotloop parsed it as
    # the int 1, i.e. ONE KV block of 64 tokens (requests over 64 tokens were then refused).
    args = build_parser().parse_args(["serve", "--cache-max-entry-count", "1"])
    value = engine_config_from_args(args).cache_max_entry_count
    assert isinstance(value, float) and value == 1.0, value


def test_serve_help_has_one_default_per_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = _run(["serve", "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    for flag, nxt in (("--session-len", "--max-batch-size"), ("--model-format", "--eager-mode")):
        section = text[text.index(flag + " ") : text.index(nxt)]  # (a flag may be followed by its vLLM alias)
        assert section.count("(default:") == 1, section


def test_unsupported_architecture_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A Mamba checkpoint: model_config_from_path read num_attention_heads before the architecture
    # check, so the user got an AttributeError traceback instead of "not supported".
    monkeypatch.setattr("hotloop.serve.api_server.run_server", lambda *a, **k: None)
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["MambaForCausalLM"],
                "model_type": "mamba",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "vocab_size": 384,
                "state_size": 16,
            }
        )
    )
    code, _out, err = _run(["serve", str(tmp_path), "--device", "cpu"], capsys)
    assert code != 0 and "MambaForCausalLM" in err and "not supported" in err, err


def test_unsupported_architecture_error_does_not_recommend_a_backend_that_always_fails() -> None:
    from hotloop.api.build import choose_backend
    from hotloop.models.registry import UnsupportedModelError, get_model_class

    try:
        choose_backend("pytorch", "LlamaForCausalLM")
        pytorch_available = True
    except ValueError:
        pytorch_available = False
    with pytest.raises(UnsupportedModelError) as e:
        get_model_class("GPT2LMHeadModel")
    if not pytorch_available:
        assert "use backend='pytorch'" not in str(e.value), str(e.value)


def test_model_format_is_not_silently_ignored(make_tiny_model: Callable[[str], Path]) -> None:
    # --model-format gguf on a Hugging Face folder (and hf on a .gguf) loaded the model anyway: the
    # value only ever mattered for 'awq'.
    from hotloop.api.build import build_engine
    from hotloop.config import EngineConfig

    src = make_tiny_model("llama_gqa_llama3rope")
    with pytest.raises(ValueError, match="model_format"):
        build_engine(str(src), EngineConfig(device="cpu", model_format="gguf", cache_max_entry_count=16))


# -- chat -------------------------------------------------------------------------------------------


class _FakePipeline:
    seen: dict[str, Any] = {}

    def __init__(self, *_a: Any, **kw: Any) -> None:
        _FakePipeline.seen = kw
        raise RuntimeError("pipeline reached")


def test_chat_accepts_an_inline_template_like_serve(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("hotloop.api.pipeline.Pipeline", _FakePipeline)
    _FakePipeline.seen = {}
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    _run(["chat", "--device", "cpu", "--chat-template", template], capsys)
    assert _FakePipeline.seen.get("chat_template") == template


def test_chat_template_directory_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("hotloop.api.pipeline.Pipeline", _FakePipeline)
    code, _out, err = _run(["chat", "--device", "cpu", "--chat-template", str(tmp_path)], capsys)
    assert code != 0 and "--chat-template" in err, err


# -- lite -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-5"])
def test_lite_clip_tokens_must_be_positive(value: str) -> None:
    # 0: ZeroDivisionError traceback after calibrating the first block; negative: silently drops
    # tokens from the clip sample (x[:-5]).
    from hotloop.cli.lite import _options

    args = build_parser().parse_args(["lite", "auto_awq", "--work-dir", "w", "--clip-tokens", value])
    with pytest.raises(ValueError, match="clip_tokens|--clip-tokens"):
        _options(args)


def test_lite_auto_awq_work_dir_that_is_a_file(
    make_tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_tiny_model("llama_gqa_llama3rope")
    target = tmp_path / "a_file"
    target.write_text("x")
    argv = [
        "lite",
        "auto_awq",
        str(src),
        "--work-dir",
        str(target),
        "--method",
        "rtn",
        "--w-group-size",
        "32",
    ]
    code, _out, err = _run(argv, capsys)  # was: FileExistsError traceback
    assert code != 0 and "--work-dir" in err, err


def test_lite_calibrate_work_dir_under_a_file(
    make_tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_tiny_model("llama_gqa_llama3rope")
    target = tmp_path / "a_file"
    target.write_text("x")
    argv = ["lite", "calibrate", str(src), "--work-dir", str(target / "sub")]
    argv += ["--calib-samples", "1", "--calib-seqlen", "8", "--batch-size", "1"]
    code, _out, err = _run(argv, capsys)  # was: NotADirectoryError traceback, after calibrating
    assert code != 0 and "--work-dir" in err, err


def test_lite_unwritable_work_dir_fails_before_calibrating(
    make_tiny_model: Callable[[str], Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(A PermissionError traceback once came after the whole quantization.) /proc takes no new
    folders, even for root."""
    import importlib

    module = importlib.import_module("hotloop.lite.auto_awq")  # (the package exports a function of that name)
    monkeypatch.setattr(module, "_samples", lambda *a: pytest.fail("calibration ran"))
    src = make_tiny_model("llama_gqa_llama3rope")
    for cmd in ("auto_awq", "calibrate"):
        argv = ["lite", cmd, str(src), "--work-dir", "/proc/self/hotloop_out"]
        argv += ["--w-group-size", "32"] if cmd == "auto_awq" else []
        code, _out, err = _run(argv, capsys)
        assert code != 0 and "--work-dir /proc/self/hotloop_out: cannot write there" in err, err


def test_lite_calib_seqlen_past_the_models_positions(
    make_tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_tiny_model("llama_gqa_llama3rope")
    positions = json.loads((src / "config.json").read_text())["max_position_embeddings"]
    argv = ["lite", "calibrate", str(src), "--work-dir", str(tmp_path / "w")]
    argv += ["--calib-samples", "1", "--calib-seqlen", str(positions + 1)]
    code, _out, err = _run(argv, capsys)
    assert code != 0 and f"--calib-seqlen {positions + 1} exceeds" in err, err


def test_lite_device_is_checked_against_its_choices() -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["lite", "auto_awq", "--work-dir", "w", "--device", "foo"])
    assert e.value.code == 2


# -- bench ------------------------------------------------------------------------------------------


def test_bench_serve_without_a_server_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["bench", "serve", "--port", str(port), "--num-prompts", "1", "--disable-tqdm"]
    code, _out, err = _run(argv, capsys)  # was: httpx ConnectError traceback
    assert code != 0 and str(port) in err, err
    # checked before any request: percentiles that are not numbers, a results file that cannot be
    # written (was: a PermissionError traceback after the whole run)
    code, _out, err = _run([*argv, "--metric-percentiles", "99,abc"], capsys)
    assert code != 0 and "--metric-percentiles" in err, err
    code, _out, err = _run([*argv, "--result-file", "/proc/self/r.json"], capsys)
    assert code != 0 and "--result-file /proc/self/r.json: cannot write there" in err, err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["bench", "throughput", "--num-prompts", "0"], "--num-prompts"),  # was: IndexError traceback
        (["bench", "latency", "--batch-size", "0"], "--batch-size"),  # was: exit 0 with NaN results
        (["bench", "latency", "--num-iters", "0"], "--num-iters"),  # was: "no median for empty data"
        # the rest were found by a review: accepted silently, or refused after the model loaded
        # without naming the flag
        (["bench", "throughput", "--range-ratio", "3"], "--range-ratio"),
        (["bench", "throughput", "--range-ratio", "-1"], "--range-ratio"),
        (["bench", "throughput", "--input-len", "0"], "--input-len"),
        (["bench", "throughput", "--output-len", "-5"], "--output-len"),
        (["bench", "latency", "--num-iters-warmup", "-2"], "--num-iters-warmup"),
        (["bench", "latency", "--output-json", "/proc/self/r.json"], "--output-json"),
        (["bench", "throughput", "--output-json", "/nonexistent-dir/r.json"], "--output-json"),
        # latency times decode steps of the whole batch: one output token has none, and a batch past
        # --max-batch-size never decodes as one (both printed a NaN / null median after the run)
        (["bench", "latency", "--output-len", "1"], "--output-len"),
        (["bench", "latency", "--batch-size", "8", "--max-batch-size", "4"], "--max-batch-size"),
    ],
)
def test_bench_offline_counts_checked_before_loading(
    argv: list[str], flag: str, no_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = _run([*argv, "--device", "cpu"], capsys)
    assert code != 0 and flag in err and "build_engine reached" not in err, err


# -- plan -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        ["--cache-max-entry-count", "1.5"],
        ["--gpu-mem", "-5"],
        ["--gpu-mem", "0"],
        ["--overhead", "-10"],
        ["--tp", "16", "--gpus-per-node", "8"],
        ["--tp", "2"],  # 3 KV heads
        ["--block-size", "0"],
        ["--session-len", "0"],
        ["--target", "0"],
        ["--prefix-hit-rate", "1.5"],
    ],
)
def test_plan_rejects_bad_values(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _run(["plan", "smollm2-135m", *extra], capsys)
    assert code not in (0, 3), (code, err)
    assert extra[0] in err or extra[0].lstrip("-").replace("-", "_") in err, err


def test_plan_warns_when_the_weights_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["plan", "llama-3-8b", "--gpu-mem", "10"], capsys)
    assert code == 0 and "warning: bf16 weights take" in err and "--weight-format awq" in err, err
    code, out, err = _run(["plan", "llama-3-8b", "--gpu-mem", "80"], capsys)
    assert code == 0 and "warning" not in err, err


# -- a second audit (2026-12-02) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,text,words",
    [
        ("lmdeploy.json", json.dumps({"model_name": "internlm2", "system": "<|im_start|>system\n"}),
         "JSON chat-template config"),
        ("plain.txt", "You are a helpful assistant.", "no Jinja tags"),
        ("broken.jinja", "{% for m in messages %}{{ m['content'] }}", "Jinja syntax error at line 1"),
    ],
)  # fmt: skip
def test_serve_and_chat_refuse_templates_that_would_drop_the_messages(
    name: str, text: str, words: str, tmp_path: Path, no_engine: None,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """An LMDeploy JSON config or plain text rendered as the whole prompt (the model answered
    something unrelated; exit 0); a syntax error surfaced at the first request as the client's 400."""
    path = tmp_path / name
    path.write_text(text)
    code, _out, err = _run(["serve", "--device", "cpu", "--chat-template", str(path)], capsys)
    assert code == 1 and words in err and "build_engine reached" not in err, err
    monkeypatch.setattr("hotloop.api.pipeline.Pipeline", _FakePipeline)
    code, _out, err = _run(["chat", "--device", "cpu", "--chat-template", str(path)], capsys)
    assert code == 1 and words in err, err


def test_chat_template_that_is_not_text_is_a_one_line_error(
    tmp_path: Path, no_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(b"\xd0\xff\x00{{ x }}")
    code, _out, err = _run(["serve", "--device", "cpu", "--chat-template", str(path)], capsys)
    assert code == 1 and "not a UTF-8 text file" in err, err


def test_serve_port_in_use_is_found_before_the_model_loads(
    no_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """uvicorn found it after ~10 s of loading and 2.5 GB of KV, in its own words (exit 3)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, _out, err = _run(
            ["serve", "--device", "cpu", "--server-name", "127.0.0.1", "--server-port", str(port)], capsys
        )
    assert (
        code == 1 and f"--server-port {port}: cannot listen" in err and "build_engine reached" not in err
    ), err
    code, _out, err = _run(["serve", "--device", "cpu", "--server-name", "nosuchhost.invalid"], capsys)
    assert code == 1 and "--server-name 'nosuchhost.invalid': cannot resolve" in err, err


def test_serve_api_keys_do_not_swallow_the_model(
    tmp_path: Path, no_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--api-keys k1 MODEL` took MODEL as a second key and served the default model."""
    code, _out, err = _run(["serve", "--device", "cpu", "--api-keys", "k1", str(tmp_path)], capsys)
    assert code == 1 and f"--api-keys took {str(tmp_path)!r}" in err and "build_engine reached" not in err, (
        err
    )
    code, _out, err = _run(["serve", "--device", "cpu", "--api-keys", "k1", "k2"], capsys)
    assert "build_engine reached" in err  # ordinary keys pass on to loading the model


@pytest.mark.parametrize("value", ["inf", "nan", "-5"])
def test_serve_shutdown_timeout_is_checked_first(
    value: str, no_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = _run(["serve", "--device", "cpu", f"--shutdown-timeout={value}"], capsys)
    assert code == 1 and "--shutdown-timeout" in err and "build_engine reached" not in err, err


def test_bench_serve_names_a_refused_api_key() -> None:
    """A 401 from /v1/models was an httpx traceback."""
    import asyncio

    from hotloop.bench.serve import fetch_model

    class _Resp:
        def __init__(self, status: int) -> None:
            self.status_code, self.text = status, "nope"

        def json(self) -> dict[str, Any]:
            return {"data": [{"id": "m"}]}

    class _Client:
        def __init__(self, status: int) -> None:
            self.status = status

        async def get(self, url: str, headers: dict[str, str]) -> _Resp:
            return _Resp(self.status)

    with pytest.raises(
        RuntimeError, match="needs an API key \\(401\\): pass the server's key with --api-key"
    ):
        asyncio.run(fetch_model(_Client(401), "http://h", {}))
    with pytest.raises(RuntimeError, match="refused the API key"):
        asyncio.run(fetch_model(_Client(401), "http://h", {"Authorization": "Bearer x"}))
    with pytest.raises(RuntimeError, match="answered 404: nope"):
        asyncio.run(fetch_model(_Client(404), "http://h", {}))
    assert asyncio.run(fetch_model(_Client(200), "http://h", {})) == "m"


# -- vLLM's flag names ------------------------------------------------------------------------------


def test_vllm_flag_names_are_accepted_where_the_meaning_is_the_same() -> None:
    """A vLLM command line's flags that mean what hotloop's (LMDeploy's) mean parse to the same
    configuration; those whose meaning differs are refused rather than silently reinterpreted."""
    lmdeploy = [
        "serve", "--tp", "1", "--session-len", "4096", "--max-batch-size", "32", "--cache-block-seq-len", "32",
        "--eager-mode", "--server-name", "127.0.0.1", "--server-port", "8000", "--model-name", "m",
        "--api-keys", "k",
    ]  # fmt: skip
    vllm = [
        "serve", "--tensor-parallel-size", "1", "--max-model-len", "4096", "--max-num-seqs", "32",
        "--block-size", "32", "--enforce-eager", "--host", "127.0.0.1", "--port", "8000",
        "--served-model-name", "m", "--api-key", "k",
    ]  # fmt: skip
    a, b = build_parser().parse_args(lmdeploy), build_parser().parse_args(vllm)
    cfg = engine_config_from_args(b)
    assert cfg == engine_config_from_args(a)
    assert (cfg.session_len, cfg.max_batch_size, cfg.cache_block_seq_len, cfg.eager_mode) == (
        4096,
        32,
        32,
        True,
    )
    for name in ("server_name", "server_port", "model_name", "api_keys"):
        assert getattr(a, name) == getattr(b, name), name
    assert (b.server_name, b.server_port, b.model_name, b.api_keys) == ("127.0.0.1", 8000, "m", ["k"])
    bench = build_parser().parse_args(["bench", "latency", "--max-model-len", "512", "--enforce-eager"])
    assert engine_config_from_args(bench).session_len == 512 and engine_config_from_args(bench).eager_mode
    for flag, value in (("--gpu-memory-utilization", "0.9"), ("--max-num-batched-tokens", "8192")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", flag, value])


# -- a third audit (2026-12-07) -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["serve", "--tp", "0"], "--tp 0 must be an integer >= 1"),
        (["serve", "--session-len", "0"], "--session-len 0 must be"),
        (["serve", "--cache-max-entry-count", "1.5"], "--cache-max-entry-count 1.5: a float must lie in (0, 1]"),
        (["serve", "--dtype", "float8"], "--dtype 'float8' is not one of"),
        (["serve", "--server-port", "70000"], "--server-port 70000 must lie in [0, 65535]"),
        (["serve", "--max-concurrent-requests", "0"], "--max-concurrent-requests 0 must be >= 1"),
        (["chat", "--top-p", "2"], "--top-p 2.0 must lie in (0, 1]"),
        (["lite", "auto_awq", "--work-dir", "w", "--w-bits", "3"], "--w-bits 3: only 4-bit"),
    ],
)  # fmt: skip
def test_config_errors_name_the_flag_not_the_field(
    argv: list[str], words: str, no_engine: None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """EngineConfig / ServerArgs / GenerationConfig / AWQOptions word their errors with field names
    (``tp=0 must be an integer >= 1``); the command line said so too, not naming the flag typed."""
    monkeypatch.setattr("hotloop.api.pipeline.Pipeline", _FakePipeline)
    code, _out, err = _run([*argv, "--device", "cpu"], capsys)
    assert code == 1 and words in err and "reached" not in err, err


def test_name_the_flag_leaves_other_messages_alone() -> None:
    from hotloop.cli.main import name_the_flag

    flags = {"tp": "--tp", "server_port": "--server-port"}
    assert name_the_flag("server_port=1 must be", flags) == "--server-port 1 must be"
    assert name_the_flag("split=1 must be one of", flags) == "split=1 must be one of"  # not an option
    assert name_the_flag("the model has tp=2 heads", flags) == "the model has tp=2 heads"


@pytest.mark.parametrize("kind", ["unreadable", "not-utf8-jsonl", "too-short"])
def test_lite_bad_calibration_file_is_a_one_line_error(
    kind: str, make_tiny_model: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """An unreadable --calib-dataset was an OSError traceback (PermissionError for a non-root user;
    /proc/self/mem fails to read even for root), a .jsonl that is not UTF-8 a bare "'utf-8' codec
    can't decode" naming no flag, and a text shorter than --calib-seqlen "the text has 3 tokens,
    fewer than calib_seqlen=512" - each only after the model had loaded."""
    import importlib

    module = importlib.import_module("hotloop.lite.auto_awq")
    src = make_tiny_model("llama_gqa_llama3rope")
    if kind == "unreadable":
        dataset, words = "/proc/self/mem", "--calib-dataset '/proc/self/mem': cannot read it"
    elif kind == "not-utf8-jsonl":
        (tmp_path / "d.jsonl").write_bytes(b'\xff\xfe{"text": "a"}\n')
        dataset, words = str(tmp_path / "d.jsonl"), "cannot read it ('utf-8' codec"
    else:
        (tmp_path / "d.txt").write_text("hello world")
        dataset, words = str(tmp_path / "d.txt"), "--calib-seqlen 8: --calib-dataset"
    if kind != "too-short":  # the text is read before the model loads
        monkeypatch.setattr(module, "_load_source", lambda *a: pytest.fail("the model was loaded"))
    for cmd in ("auto_awq", "calibrate"):
        argv = ["lite", cmd, str(src), "--work-dir", str(tmp_path / "w"), "--calib-dataset", dataset]
        argv += ["--calib-samples", "1", "--calib-seqlen", "8", "--device", "cpu"]
        argv += ["--w-group-size", "32"] if cmd == "auto_awq" else []
        code, _out, err = _run(argv, capsys)  # (_run fails the test on an exception: no traceback)
        assert code == 1 and words in err, err
        if kind == "too-short":
            assert "pass a longer text or a smaller --calib-seqlen" in err, err


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--random-prefix-len", "-1"], "--random-prefix-len -1: must be >= 0"),  # was: rc 0, lengths off by one
        (["--dataset-name", "synthetic-chat", "--synthetic-max-input", "0"], "--synthetic-max-input 0"),
        (["--synthetic-output-median", "0"], "--synthetic-output-median 0.0: must be > 0"),
        (["--tokenizer", "/nonexistent/tokenizer"], "--tokenizer '/nonexistent/tokenizer': cannot load"),
    ],
)  # fmt: skip
def test_bench_serve_dataset_flags_checked_before_any_request(
    extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--tokenizer with a bad path was a transformers OSError traceback; a negative prefix length
    ran and recorded every prompt one token short; --synthetic-max-input 0 sent empty prompts that
    all failed (400) after the run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["bench", "serve", "--port", str(port), "--num-prompts", "1", "--disable-tqdm", *extra]
    code, _out, err = _run(argv, capsys)
    assert code == 1 and words in err and "no server answers" not in err, err
