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


def check_launch_config(
    name: str, config: tuple[int, ...], tiles: tuple[str, ...], allow_maxnreg: bool = False
) -> None:
    """A launch-configuration override: ``tiles`` (power-of-two tile sizes, at least 16, as
    ``tl.dot`` needs), then num_warps (1, 2, 4, 8 or 16) and num_stages (at least 1), then, where
    ``allow_maxnreg``, optionally maxnreg (registers per thread, a multiple of 8 in 24..255: ptxas
    spills past it, so that more CTAs fit on an SM)."""
    fields = (*tiles, "num_warps", "num_stages")
    n = len(fields)
    shape = f"({', '.join(fields)}{'[, maxnreg]' if allow_maxnreg else ''})"
    check(
        len(config) == n or (allow_maxnreg and len(config) == n + 1),
        f"{name}: config must be {shape}, got {config}",
    )
    for field, value in zip(tiles, config, strict=False):
        check(
            value >= 16 and value & (value - 1) == 0,
            f"{name}: config {field}={value} must be a power of two >= 16",
        )
    warps, stages = config[n - 2], config[n - 1]
    check(warps in (1, 2, 4, 8, 16), f"{name}: config num_warps={warps} must be 1, 2, 4, 8 or 16")
    check(stages >= 1, f"{name}: config num_stages={stages} must be >= 1")
    if len(config) > n:
        regs = config[n]
        check(
            24 <= regs <= 255 and regs % 8 == 0,
            f"{name}: config maxnreg={regs} must be a multiple of 8 in 24..255",
        )
