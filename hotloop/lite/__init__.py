"""Offline quantization (``hotloop lite``): calibration, AWQ scale and clip search, int4 packing, export.

``auto_awq`` writes an AutoAWQ GEMM checkpoint that ``hotloop serve`` (and other AWQ readers)
load; ``calibrate`` saves the per-channel activation statistics alone. Nothing imports this package.
"""

from __future__ import annotations

from hotloop.lite.auto_awq import AWQOptions, auto_awq, calibrate

__all__ = ["AWQOptions", "auto_awq", "calibrate"]
