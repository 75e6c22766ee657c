"""Every environment variable hotloop reads, read once, in one place."""

from __future__ import annotations

import logging
import os
from pathlib import Path

_warned: set[str] = set()


def switch(name: str, default: bool, logger: logging.Logger) -> bool:
    """An on/off environment switch read now: ``1`` on, ``0`` off, unset or empty ``default``; any
    other value is logged once (on ``logger``) and read as ``default``."""
    raw = os.environ.get(name, "")
    if raw in ("0", "1"):
        return raw == "1"
    if raw and f"{name}={raw}" not in _warned:
        _warned.add(f"{name}={raw}")
        logger.warning("%s=%r: use 0 or 1; taking %d", name, raw, int(default))
    return default


def cache_dir() -> Path:
    """Where converted models live: ``$HOTLOOP_CACHE`` or ``~/.cache/hotloop``."""
    root = os.environ.get("HOTLOOP_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "hotloop" if xdg else Path.home() / ".cache" / "hotloop"
