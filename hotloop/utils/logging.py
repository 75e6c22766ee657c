"""Logging setup: one place that configures the ``hotloop`` logger."""

from __future__ import annotations

import logging
import sys

_CONFIGURED = False


def get_logger(name: str) -> logging.Logger:
    """Return a child of the ``hotloop`` logger, configuring a stderr handler once."""
    global _CONFIGURED
    if not _CONFIGURED:
        root = logging.getLogger("hotloop")
        if not root.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
            )
            root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        _CONFIGURED = True
    return logging.getLogger(name if name.startswith("hotloop") else f"hotloop.{name}")


def set_log_level(level: str) -> None:
    """Set the level of every hotloop logger (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``)."""
    get_logger("hotloop")
    logging.getLogger("hotloop").setLevel(level.upper())
