"""``hotloop lite``: offline quantization (``auto_awq``: W4A16 AWQ checkpoint; ``calibrate``: stats)."""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from hotloop.lite.auto_awq import METHODS, AWQOptions

_HELP = {
    "calib_dataset": "calibration text: pydoc (Python's docs, no install), lee, wikipedia (gensim test data), "
    "or a path to a .txt / .jsonl file",
    "calib_samples": "number of calibration windows",
    "calib_seqlen": "tokens per calibration window",
    "w_bits": "weight bits (only 4)",
    "w_group_size": "input channels per scale/zero group; must divide every linear layer's input size "
    "(SmolLM2-135M: use 64)",
    "batch_size": "calibration windows per forward pass (memory vs speed)",
    "device": "where blocks run: auto, cpu, cuda",
    "search_scale": "grid-search the AWQ scale ratio on each block's output error (slower); "
    "default: fixed ratio 0.5",
    "method": "awq, or rtn (plain round-to-nearest, no calibration: a baseline)",
    "clip_tokens": "calibration tokens used by the weight-clipping search",
}


def _add_options(p: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    p.add_argument(
        "model_path", nargs="?", default=None, help="HF folder or .gguf file (default: embedded SmolLM2)"
    )
    p.add_argument("--work-dir", required=True, help="output folder")
    for f in dataclasses.fields(AWQOptions):
        if f.name not in names:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{_HELP[f.name]} (default: {f.default})"
        if isinstance(f.default, bool):
            p.add_argument(flag, action="store_true", help=help_text)
        elif f.name == "method":
            p.add_argument(flag, choices=METHODS, default=f.default, help=help_text)
        elif isinstance(f.default, int):
            p.add_argument(flag, type=int, default=f.default, help=help_text)
        elif f.name == "device":
            p.add_argument(flag, type=_device_arg, default=f.default, help=help_text)
        else:
            p.add_argument(flag, default=f.default, help=help_text)


def _device_arg(text: str) -> str:
    if text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: expected auto, cpu, cuda or cuda:N")


_CALIB = ("calib_dataset", "calib_samples", "calib_seqlen", "batch_size", "device")


def add_parser(sub: argparse._SubParsersAction) -> None:
    lite = sub.add_parser("lite", help="quantize a model offline (AWQ W4A16)", description=__doc__)
    lite_sub = lite.add_subparsers(dest="lite_command", metavar="COMMAND", required=True)
    p = lite_sub.add_parser(
        "auto_awq",
        help="quantize to int4 with AWQ; writes an AutoAWQ GEMM checkpoint",
        description="Calibrate, search AWQ scales and clipping block by block, quantize to int4 "
        "(asymmetric, per group) and write safetensors + config.json + tokenizer to --work-dir.",
    )
    _add_options(p, tuple(f.name for f in dataclasses.fields(AWQOptions)))
    p.set_defaults(func=run_auto_awq)
    c = lite_sub.add_parser(
        "calibrate",
        help="save per-channel input statistics of every linear layer",
        description="Run the calibration set block by block and save inputs_stats.pt to --work-dir.",
    )
    _add_options(c, _CALIB)
    c.set_defaults(func=run_calibrate)


def _options(args: argparse.Namespace) -> AWQOptions:
    """The options, and a --work-dir that can be a folder (checked before any calibration runs)."""
    names = {f.name for f in dataclasses.fields(AWQOptions)}
    opts = AWQOptions(**{k: v for k, v in vars(args).items() if k in names})
    work = Path(args.work_dir)
    for parent in (work, *work.parents):
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"--work-dir {args.work_dir}: {parent} exists and is not a folder")
            break
    return opts


def _make_work_dir(work_dir: str) -> None:
    """Create --work-dir now and write a probe into it, so that a folder that cannot be written
    fails before the calibration runs rather than after it."""
    try:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=work_dir):
            pass
    except OSError as e:
        raise ValueError(f"--work-dir {work_dir}: cannot write there ({e.strerror or e})") from None


def run_auto_awq(args: argparse.Namespace) -> int:
    from hotloop.lite.auto_awq import auto_awq

    opts = _options(args)
    _make_work_dir(args.work_dir)
    out = auto_awq(args.model_path, args.work_dir, opts)
    print(f"wrote {out}; serve it with: hotloop serve {out}")
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    from hotloop.lite.auto_awq import calibrate

    opts = _options(args)
    _make_work_dir(args.work_dir)
    print(f"wrote {calibrate(args.model_path, args.work_dir, opts)}")
    return 0
