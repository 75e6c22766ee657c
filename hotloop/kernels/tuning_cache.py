"""Kernel tuning results kept on disk, so that a second start on the same GPU does not time again.

One JSON file per kernel family under ``$HOTLOOP_CACHE/tuning/`` (``~/.cache/hotloop`` by
default). A key names everything the timing depended on: the GPU's name, the versions of torch and
Triton, and the caller's own shape key. Values are plain dicts (a config's fields). A file that is
missing, unreadable or written by another format version is treated as empty; writes merge with
what is on disk and replace the file atomically, so concurrent engines never leave a torn file.
``HOTLOOP_TUNING_CACHE=0`` turns the disk cache off (tuning still happens, in memory).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hotloop.utils.env import cache_dir

FORMAT = 1
ENV = "HOTLOOP_TUNING_CACHE"


def enabled() -> bool:
    return os.environ.get(ENV, "1") not in ("0", "", "false", "False")


def path_for(family: str) -> Path:
    return cache_dir() / "tuning" / f"{family}.json"


def environment_key(device_name: str) -> str:
    """The part of every key that pins the hardware and the compilers."""
    import torch
    import triton

    return f"{device_name}|torch {torch.__version__}|triton {triton.__version__}"


def load(family: str) -> dict[str, dict[str, Any]]:
    """Every stored entry of ``family`` (empty when there is no usable file)."""
    if not enabled():
        return {}
    try:
        data = json.loads(path_for(family).read_text())
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT
        or not isinstance(data.get("entries"), dict)
    ):
        return {}
    return {k: v for k, v in data["entries"].items() if isinstance(v, dict)}


def store(family: str, key: str, value: dict[str, Any]) -> None:
    """Add ``key -> value`` to ``family``'s file (best effort: a read-only cache only logs nothing
    and keeps working from memory)."""
    if not enabled():
        return
    target = path_for(family)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        entries = load(family)
        entries[key] = value
        fd, tmp = tempfile.mkstemp(prefix=f".{family}.", dir=target.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, target)
    except OSError:
        return
