"""An independent reading of the AutoAWQ GEMM format, written from its documentation for the tests.

Plain Python integers and loops, nothing shared with ``hotloop``: packing puts column
``order[i]`` of each group of eight into bits ``4i .. 4i+3`` with ``order = [0, 2, 4, 6, 1, 3, 5, 7]``.
"""

from __future__ import annotations

import numpy as np
import torch

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pack(values: np.ndarray) -> np.ndarray:
    """uint values in [0, 15] ``[R, C]`` -> int32 ``[R, C // 8]``."""
    rows, cols = values.shape
    out = np.zeros((rows, cols // 8), dtype=np.uint32)
    for r in range(rows):
        for c in range(cols // 8):
            word = 0
            for i in range(8):
                word |= int(values[r, 8 * c + ORDER[i]]) << (4 * i)
            out[r, c] = word
    return out.view(np.int32)


def rtn(w: torch.Tensor, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric round-to-nearest of ``w`` ``[out, in]`` per group of inputs.

    Returns AutoAWQ-shaped ``q [in, out]``, ``zeros [in // g, out]`` (ints) and ``scales`` (fp16).
    """
    wt = w.t().double().numpy()  # [in, out]
    k, n = wt.shape
    q = np.zeros((k, n), dtype=np.int64)
    zeros = np.zeros((k // group, n), dtype=np.int64)
    scales = np.zeros((k // group, n), dtype=np.float16)
    for gi in range(k // group):
        block = wt[gi * group : (gi + 1) * group]
        lo = np.minimum(block.min(0), 0.0)
        hi = np.maximum(block.max(0), 0.0)
        s = np.maximum(hi - lo, 1e-5) / 15
        s16 = s.astype(np.float16)
        s = s16.astype(np.float64)
        z = np.clip(np.round(-lo / s), 0, 15)
        q[gi * group : (gi + 1) * group] = np.clip(np.round(block / s) + z, 0, 15)
        zeros[gi], scales[gi] = z, s16
    return q, zeros, scales


def dequantize(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray, group: int) -> torch.Tensor:
    """``[in, out]`` float32: ``(q - z) * s`` with each group's z and s."""
    z = np.repeat(zeros, group, axis=0)
    s = np.repeat(scales.astype(np.float64), group, axis=0)
    return torch.from_numpy((q - z) * s).float()
