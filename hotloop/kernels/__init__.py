"""Compute kernels: one file per op (Triton on the GPU) and ``reference.py``, the torch version of each."""
