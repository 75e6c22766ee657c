"""Every environment variable hotloop reads, read once, in one place."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where converted models live: ``$HOTLOOP_CACHE`` or ``~/.cache/hotloop``."""
    root = os.environ.get("HOTLOOP_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "hotloop" if xdg else Path.home() / ".cache" / "hotloop"
