"""Argument checks shared by the kernel launchers: a wrong shape, dtype or stride is a clear error,
never a silent out-of-bounds read on the device."""

from __future__ import annotations

import torch


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    check(tuple(t.shape) == shape, f"{name}: expected shape {shape}, got {tuple(t.shape)}")


def check_last_contiguous(name: str, t: torch.Tensor) -> None:
    """The innermost dim must be dense (the kernels vectorise along it)."""
    check(t.stride(-1) == 1, f"{name}: the last dim must be contiguous (stride 1), got strides {t.stride()}")


def check_dtype(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    check(t.dtype in dtypes, f"{name}: dtype {t.dtype} is not one of {dtypes}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors.values()}
    check(
        len(devices) == 1, f"tensors on different devices: { {k: str(v.device) for k, v in tensors.items()} }"
    )


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
