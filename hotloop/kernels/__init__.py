"""Compute kernels: one file per op (Triton on the GPU) and ``reference.py``, the torch version of each."""

import os

# Triton 3.9 contracts multiply-adds into fmas unless a launch says otherwise, and warns that from
# 3.10 it will not. Every kernel here was checked against its reference and timed with contraction
# on (the launches that must not contract pass enable_fp_fusion=False), so the default is pinned to
# on; a user's own TRITON_DEFAULT_FP_FUSION wins.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
