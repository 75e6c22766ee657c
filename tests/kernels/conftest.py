"""Kernel tests run the Triton kernels on the GPU, or on the CPU through Triton's interpreter.

``TRITON_INTERPRET`` must be set before a kernel module is imported (``triton.jit`` reads it when
it decorates), so it is set here, at collection, when no GPU is present.
"""

from __future__ import annotations

import importlib.util
import os

import torch

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
