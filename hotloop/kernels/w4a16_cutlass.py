"""The CUTLASS W4A16 GEMM (``kernels/cuda/w4a16_cutlass.cu``): its build, weight layout, tuning and launch.

Opt-in with ``HOTLOOP_W4A16_KERNEL=cutlass`` (Hopper, bf16 models). CUTLASS 3's mixed-input collective
converts the int4 weights to bf16 in registers on their way to ``wgmma``; the Triton W4A16 GEMM
(``w4a16_gemm.py``) takes its dequantized tile through shared memory, and at 256-384 token rows (the
offline decode steps) it takes 1.8x bf16 cuBLAS's time where this takes 0.93-1.0x (H200, fiftieth
session, ``benchmarks/w4a16_cutlass_table.py``). In the engine on that H200: offline 1000 x 1024 / 1024
at 0.962x bf16 against the default's 0.84x; batch 1 at 383 (417 with the GEMV's PDL and SiLU forms)
against 467 tokens/s. With half-octave buckets and dequant + cuBLAS, offline on an H100: 0.998x bf16
(fifty-first session). So it is a throughput setting, not the default. From 769 rows the tuner also
times dequantize + cuBLAS (``w4a16_cutlass_dequant.py``, a kept per-device bf16 scratch), with the
scratch as ``[N, K]`` and as ``[K, N]`` (cuBLAS' speed depends on the operand's layout).

The weight is stored in CUTLASS's layout *instead of* AutoAWQ's: int4 ``q - 8`` K-major ``[N, K]`` in
the reordered layout the kernel's loads want (:func:`layout_offsets`), with bf16 scales and zero terms
``[K / g, N]`` (``W = (q - 8) * scale + zero``, ``zero = (8 - z) * scale``; +0.08 GB on Llama-3-8B over
AutoAWQ's packed zeros). :func:`convert` does it once after loading, on the GPU. At one row the tuner
also times a tensor-core GEMV written for that layout (``kernels/cuda/w4a16_cutlass_gemv.cu``, compiled
by ``cuda_jit``).

Build: nvcc compiles the source once per configuration (nine units and the table's, in parallel: 696 s on
2 cores) against the ``nvidia-cutlass`` wheel's headers (``pip install nvidia-cutlass``, or ``HOTLOOP_CUTLASS_DIR``
= a CUTLASS checkout) into ``$HOTLOOP_CACHE/cuda/w4a16_cutlass-<arch>-<key>.so``, keyed by the source
and the CUTLASS headers' version; later starts load the library. The launches go on torch's current
stream, so CUDA graphs capture them (one GPU: the library's own CUDA runtime uses device 0's context).
Per (M bucket, N, K) the fastest configuration is timed once outside graph capture (:func:`m_bucket`) and
kept in the tuning cache (``tuning_cache.py``, family ``w4a16_cutlass``).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from hotloop.kernels import cuda_jit, tuning_cache
from hotloop.kernels.pdl import pdl
from hotloop.kernels.w4a16_layout import unpack_int4
from hotloop.utils.env import cache_dir, switch

logger = logging.getLogger(__name__)

ENV = "HOTLOOP_W4A16_KERNEL"
KERNELS = ("triton", "cutlass")
CUTLASS_DIR_ENV = "HOTLOOP_CUTLASS_DIR"
CURAND_ENV = "HOTLOOP_CURAND_INCLUDE"  # a folder with curand_kernel.h, where the toolkit has none
SOURCE = cuda_jit.SOURCE_DIR / "w4a16_cutlass.cu"
HEADER = cuda_jit.SOURCE_DIR / "w4a16_cutlass_gemm.cuh"  # the Gemm4 template the source instantiates
TUNING_FAMILY = "w4a16_cutlass"
WORKSPACE_BYTES = 32 << 20  # one per device, shared by the launches (one stream)
# the configurations' rows of tokens per tile (the source's table, in order): 16-row tiles are timed
# only up to M = 64, the wide ones only from M = 17
TOKEN_TILE = (128, 256, 128, 256, 16, 16, 128, 256, 192)


class CutlassUnavailable(RuntimeError):
    """The CUTLASS W4A16 GEMM cannot be built or run here; the message says what to install or set."""


def selected() -> bool:
    """Whether ``HOTLOOP_W4A16_KERNEL`` asks for this GEMM (``triton``, the default, or ``cutlass``);
    another value raises ``ValueError`` naming the variable and the choices."""
    value = os.environ.get(ENV, "triton").strip().lower() or "triton"
    if value not in KERNELS:
        raise ValueError(f"{ENV}={value!r}: use one of {', '.join(KERNELS)}")
    return value == "cutlass"


def _index(device: torch.device) -> int:
    """The CUDA device index of ``device`` (the current one where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def check_operands(x_dtype: torch.dtype, device: torch.device, n: int, k: int, group_size: int) -> None:
    """Raise :class:`CutlassUnavailable` naming what this GEMM cannot take: a non-bf16 model, a group
    size that is not a multiple of 64, in / out features not multiples of 32, a GPU other than Hopper,
    or a GPU other than the process's first."""
    if x_dtype != torch.bfloat16:
        raise CutlassUnavailable(
            f"{ENV}=cutlass needs a bfloat16 model (got {x_dtype}): use --dtype bfloat16"
        )
    if group_size % 64:
        raise CutlassUnavailable(
            f"{ENV}=cutlass needs a group size that is a multiple of 64 (got {group_size})"
        )
    for name, value in (("in_features", k), ("out_features", n)):
        if value % 32:
            raise CutlassUnavailable(f"{ENV}=cutlass needs {name} to be a multiple of 32 (got {value})")
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        raise CutlassUnavailable(f"{ENV}=cutlass needs a Hopper GPU (sm_90; this is {cap or device})")
    index = _index(device)
    if index != 0:  # the library's static CUDA runtime works on its device 0
        raise CutlassUnavailable(
            f"{ENV}=cutlass runs on the process's first GPU only (got cuda:{index}): "
            f"select the GPU with CUDA_VISIBLE_DEVICES instead"
        )


# ----------------------------------------------------------------------------------------------- build


def cutlass_dir() -> Path:
    """The CUTLASS source tree: ``$HOTLOOP_CUTLASS_DIR`` or the ``nvidia-cutlass`` wheel's copy."""
    env = os.environ.get(CUTLASS_DIR_ENV)
    if env:
        root = Path(env)
    else:
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or not spec.submodule_search_locations:
            raise CutlassUnavailable(
                f"{ENV}=cutlass needs the CUTLASS headers: pip install nvidia-cutlass "
                f"(or set {CUTLASS_DIR_ENV} to a CUTLASS checkout)"
            )
        root = Path(next(iter(spec.submodule_search_locations))) / "source"
    if not (root / "include" / "cutlass" / "cutlass.h").is_file():
        raise CutlassUnavailable(
            f"no CUTLASS headers under {root}/include (set {CUTLASS_DIR_ENV} to a CUTLASS checkout)"
        )
    return root


def _curand_include(nvcc: str) -> list[str]:
    """``-I`` for ``curand_kernel.h`` (CUTLASS's mixed-input utilities include it) where the toolkit
    lacks it: the ``nvidia-curand`` wheel's copy (torch's CUDA wheels install it)."""
    probe = subprocess.run(
        [nvcc, "-x", "cu", "-E", "-"], input="#include <curand_kernel.h>\n", capture_output=True, text=True
    )
    if probe.returncode == 0:
        return []
    env = os.environ.get(CURAND_ENV)
    if env:
        if not (Path(env) / "curand_kernel.h").is_file():
            raise CutlassUnavailable(f"{CURAND_ENV}={env}: no curand_kernel.h there")
        return ["-I", env]
    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        for header in sorted(Path(base).glob("**/include/curand_kernel.h")):
            return ["-I", str(header.parent)]
    raise CutlassUnavailable(
        "nvcc finds no curand_kernel.h (CUTLASS's mixed-input utilities include it): install the CUDA "
        f"toolkit's cuRAND headers, pip install nvidia-curand, or set {CURAND_ENV} to their folder"
    )


def _flags(root: Path, arch: str) -> list[str]:
    return [
        "-std=c++17", "-O3", "-DNDEBUG", f"-arch={arch}", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
        "-I", str(root / "include"), "-I", str(root / "tools" / "util" / "include"),
        "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
    ]  # fmt: skip


def num_configs_in_source() -> int:
    for line in SOURCE.read_text().splitlines():
        if line.startswith("#define W4C_NUM "):
            return int(line.split()[2])
    raise RuntimeError(f"{SOURCE.name} has no '#define W4C_NUM'")


def library_path(arch: str = "sm_90a", root: Path | None = None) -> Path:
    """Where the built library for ``arch`` lives: keyed by the source and its Gemm4 header, the
    CUTLASS version header and the flags (not the nvcc version: a built library stays valid)."""
    root = root or cutlass_dir()
    version = (root / "include" / "cutlass" / "version.h").read_bytes()
    text = SOURCE.read_bytes() + HEADER.read_bytes() + version
    key = hashlib.sha256(text + " ".join(_flags(Path("."), arch)).encode())
    return cache_dir() / "cuda" / f"w4a16_cutlass-{arch}-{key.hexdigest()[:16]}.so"


def build(arch: str = "sm_90a", jobs: int | None = None) -> Path:
    """Compile and link the library for ``arch`` unless it is cached; returns its path. Raises
    :class:`CutlassUnavailable` (no nvcc, no headers, a failed compile) with nvcc's message."""
    root = cutlass_dir()
    path = library_path(arch, root)
    if path.is_file():
        return path
    nvcc = cuda_jit.find_nvcc()
    if nvcc is None:
        raise CutlassUnavailable(
            f"{ENV}=cutlass needs nvcc (set HOTLOOP_NVCC or CUDA_HOME, or install the CUDA toolkit)"
        )
    flags = _flags(root, arch) + _curand_include(nvcc)
    work = path.with_suffix(f".{os.getpid()}.build")
    work.mkdir(parents=True, exist_ok=True)
    n = num_configs_in_source()
    jobs = max(1, jobs or os.cpu_count() or 1)
    units = [(f"-DW4C_CFG={i}", work / f"cfg{i}.o") for i in range(n)] + [("-DW4C_TABLE", work / "table.o")]
    logger.info(
        "compiling the CUTLASS W4A16 GEMM for %s: %d units, %d at a time: minutes (696 s on 2 cores; once, cached in %s)",
        arch, len(units), jobs, path.parent,
    )  # fmt: skip
    t0 = time.monotonic()
    running: list[tuple[subprocess.Popen, Path]] = []
    try:
        pending = list(units)
        while pending or running:
            while pending and len(running) < jobs:
                define, obj = pending.pop(0)
                cmd = [nvcc, *flags, define, "-c", str(SOURCE), "-o", str(obj)]
                running.append(
                    (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), obj)
                )
            proc, obj = running.pop(0)
            out, _ = proc.communicate()
            if proc.returncode != 0:
                for p, _o in running:
                    p.kill()
                    p.wait()
                raise CutlassUnavailable(f"nvcc failed on {SOURCE.name} ({obj.stem}):\n{out[-4000:]}")
            logger.info("  %s compiled (%.0f s)", obj.stem, time.monotonic() - t0)
        tmp = work / path.name
        link = [
            nvcc,
            f"-arch={arch}",
            "-shared",
            "-cudart",
            "static",
            *(str(o) for _d, o in units),
            "-o",
            str(tmp),
        ]
        linked = subprocess.run(link, capture_output=True, text=True)
        if linked.returncode != 0:
            raise CutlassUnavailable(f"linking the CUTLASS W4A16 GEMM failed:\n{linked.stderr[-4000:]}")
        os.replace(tmp, path)
    finally:
        for proc, _obj in running:  # (an exception in between: no compiler keeps writing into work)
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    logger.info("built %s in %.0f s", path.name, time.monotonic() - t0)
    return path


# ------------------------------------------------------------------------------------------------ load

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}
_states: dict[int, tuple[ctypes.CDLL, int, torch.Tensor]] = {}


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    vp, i = ctypes.c_void_p, ctypes.c_int
    lib.hl_w4c_num_configs.restype = i
    lib.hl_w4c_config_name.restype = ctypes.c_char_p
    lib.hl_w4c_config_name.argtypes = [i]
    lib.hl_w4c_workspace.restype = ctypes.c_size_t
    lib.hl_w4c_workspace.argtypes = [i] * 6
    lib.hl_w4c_gemm.restype = i
    lib.hl_w4c_gemm.argtypes = [i, vp, vp, vp, vp, vp, i, i, i, i, vp, i, vp]
    lib.hl_w4c_reorder.restype = i
    lib.hl_w4c_reorder.argtypes = [vp, vp, i, i]
    return lib


def library(device: torch.device) -> ctypes.CDLL:
    """The loaded library for ``device``'s architecture, built first if need be."""
    arch = cuda_jit.arch_of(device)
    with _lock:
        lib = _libs.get(arch)
        if lib is None:
            lib = _libs[arch] = _bind(ctypes.CDLL(str(build(arch))))
        return lib


def config_names(device: torch.device) -> list[str]:
    lib = library(device)
    return [lib.hl_w4c_config_name(c).decode() for c in range(lib.hl_w4c_num_configs())]


def _device_state(device: torch.device) -> tuple[ctypes.CDLL, int, torch.Tensor]:
    """``(library, SM count, workspace)`` of ``device``, looked up once per device (a launch's hot path)."""
    index = _index(device)
    state = _states.get(index)
    if state is None:
        dev = torch.device("cuda", index)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        state = _states[index] = (library(dev), sms, ws)
    return state


# ---------------------------------------------------------------------------------------------- layout


def signed_k_major(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ tensors -> (int4 ``q - 8`` K-major ``[N, K/2]`` bytes, even k in the low nibble; float32
    zero term ``(8 - z) * scale`` ``[K/g, N]``), so that ``W[k, n] = (q - 8) * scale + zero``. Any device."""
    q = unpack_int4(qweight).to(torch.int16)  # [K, N] in [0, 15]
    z = unpack_int4(qzeros).to(torch.float32)  # [K/g, N]
    s = (q.t() - 8).contiguous()  # [N, K] in [-8, 7]
    packed = ((s[:, 0::2] & 0xF) | ((s[:, 1::2] & 0xF) << 4)).to(torch.uint8).contiguous()
    return packed, (8.0 - z) * scales.float()


def layout_offsets(n: int, k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 ``[n, k]``: where element ``(row, col)`` of a K-major int4 weight goes in CUTLASS's
    reordered layout (in 4-bit elements). 16 x 16 atoms of 256 elements, atom ``(row // 16, col // 16)``
    at ``(row // 16 + (col // 16) * n / 16) * 256``; inside one, with ``row % 16 = n0 + 8 n1`` and
    ``col % 16 = k0 + 2 k1 + 8 k2``, offset ``32 n0 + n1 + 4 k0 + 8 k1 + 2 k2`` (CuTe's
    ``compute_memory_reordering_atom`` for a bf16 MMA with the [0,2,4,6,1,3,5,7] value shuffle, tiled
    by ``tile_to_shape``: the source's ``LayoutAtomQuant``). Needs ``n`` and ``k`` multiples of 16."""
    if n % 16 or k % 16:
        raise ValueError(f"the reordered layout needs N and K multiples of 16 (got {n}, {k})")
    r = torch.arange(n, device=device)[:, None]
    c = torch.arange(k, device=device)[None, :]
    atom = (r // 16) + (c // 16) * (n // 16)
    rr, cc = r % 16, c % 16
    inside = 32 * (rr % 8) + rr // 8 + 4 * (cc % 2) + 8 * ((cc // 2) % 4) + 2 * (cc // 8)
    return atom * 256 + inside


def reorder_reference(packed: torch.Tensor) -> torch.Tensor:
    """Torch model of the library's reorder: K-major int4 bytes ``[N, K/2]`` (even k in the low nibble)
    -> the same values in the reordered layout (``layout_offsets``), as bytes ``[N, K/2]``."""
    n, k = packed.shape[0], packed.shape[1] * 2
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, k)
    flat = torch.empty(n * k, dtype=torch.uint8, device=packed.device)
    flat[layout_offsets(n, k, packed.device).reshape(-1)] = nib.reshape(-1)
    pairs = flat.view(-1, 2)
    return (pairs[:, 0] | (pairs[:, 1] << 4)).reshape(n, k // 2)


@dataclass(frozen=True)
class CutlassWeight:
    """One layer's weight in the CUTLASS layout: ``w`` uint8 ``[N, K/2]`` (reordered int4), ``scales``
    and ``zeros`` bf16 ``[K/g, N]``."""

    w: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    n: int
    k: int
    group_size: int


def convert(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    dtype: torch.dtype = torch.bfloat16,
) -> CutlassWeight:
    """AutoAWQ tensors on a CUDA device -> :class:`CutlassWeight` (synchronises the device). The
    reorder is the library's (CUTLASS's ``reorder_tensor``, equal to :func:`reorder_reference` on the
    GPU); a CUDA error inside it ends the process, as CUTLASS's utilities do."""
    k, n = qweight.shape[0], qweight.shape[1] * 8
    check_operands(dtype, qweight.device, n, k, group_size)  # (dtype: the model's, which x will have)
    lib = library(qweight.device)
    packed, zero = signed_k_major(qweight, qzeros, scales)
    out = torch.empty_like(packed)
    index = _index(qweight.device)
    _largest[index] = max(_largest.get(index, 0), n * k)
    torch.cuda.synchronize(qweight.device)
    with torch.cuda.device(qweight.device):
        if lib.hl_w4c_reorder(packed.data_ptr(), out.data_ptr(), n, k) != 0:
            raise RuntimeError("the CUTLASS W4A16 weight reorder failed")
    return CutlassWeight(
        out, scales.to(torch.bfloat16).contiguous(), zero.to(torch.bfloat16).contiguous(), n, k, group_size
    )


# ---------------------------------------------------------------------------------------------- launch

_RC = {
    1: "cannot implement these shapes",
    2: "initialize failed",
    3: "launch failed",
    4: "no such config",
    5: "CUDA error",
}


def _is_gemv(cfg: int) -> bool:
    return GEMV_BASE <= cfg < GEMV_BASE + len(GEMV_VARIANTS)


def _launch(cfg: int, x2: torch.Tensor, wt: CutlassWeight, y: torch.Tensor, strict: bool = True) -> None:
    """Run configuration ``cfg``. ``strict=False`` (the tuned choice): where this M needs more
    workspace than the device's, run the cooperative 128 x 128 tile (config 0) instead of raising."""
    if not (0 <= cfg < len(TOKEN_TILE) or _is_gemv(cfg) or _is_dequant(cfg)):
        raise ValueError(
            f"config={cfg}: the CUTLASS configurations are 0-{len(TOKEN_TILE) - 1}, the GEMV's "
            f"{GEMV_BASE}-{GEMV_BASE + len(GEMV_VARIANTS) - 1} and dequant + cuBLAS {DEQUANT} "
            f"([N, K]) and {DEQUANT_KN} ([K, N])"
        )
    if _is_gemv(cfg):
        gemv(x2, wt, GEMV_VARIANTS[cfg - GEMV_BASE], out=y)
        return
    if _is_dequant(cfg):
        _dequant_matmul(x2, wt, y, transpose=cfg == DEQUANT_KN)
        return
    lib, sms, ws = _device_state(x2.device)
    m = x2.shape[0]
    need = lib.hl_w4c_workspace(cfg, m, wt.n, wt.k, wt.group_size, sms)
    if need > ws.numel():
        if not strict and cfg != 0:
            _launch(0, x2, wt, y)
            return
        raise RuntimeError(f"CUTLASS W4A16 config {cfg} wants {need} bytes of workspace (> {ws.numel()})")
    rc = lib.hl_w4c_gemm(
        cfg, x2.data_ptr(), wt.w.data_ptr(), wt.scales.data_ptr(), wt.zeros.data_ptr(), y.data_ptr(),
        m, wt.n, wt.k, wt.group_size, ws.data_ptr(), sms, torch.cuda.current_stream(x2.device).cuda_stream,
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"CUTLASS W4A16 config {cfg} at M={m} N={wt.n} K={wt.k}: {_RC.get(rc, rc)}")


def candidates(m: int, n: int = 0, k: int = 0, group_size: int = 0) -> tuple[int, ...]:
    """The configurations timed for ``m`` rows: 16-row token tiles up to 64 rows, wide ones above 16,
    for one row the tensor-core GEMV's variants (ids from ``GEMV_BASE``) that fit ``(n, k, group)``,
    and from ``DEQUANT_FROM_M`` rows dequantize + cuBLAS in both layouts (``DEQUANT``, ``DEQUANT_KN``)
    where the shape allows it."""
    cut = tuple(c for c, t in enumerate(TOKEN_TILE) if (t == 16 and m <= 64) or (t > 16 and m > 16))
    gemvs = tuple(
        GEMV_BASE + i for i, v in enumerate(GEMV_VARIANTS) if m == 1 and gemv_fits(n, k, group_size, *v)
    )
    dequant = DEQUANTS if m >= DEQUANT_FROM_M and not (n % 64 or k % 64 or group_size % 64) else ()
    return gemvs + cut + dequant


# ------------------------------------------------------------------- dequantize + cuBLAS (large M)

DEQUANT = 200  # configuration id: dequantize the layer's weight into a bf16 scratch [N, K], then cuBLAS
DEQUANT_KN = 201  # the same with the scratch holding the transpose [K, N] (cuBLAS' other operand layout)
DEQUANTS = (DEQUANT, DEQUANT_KN)
DEQUANT_FROM_M = 769  # timed in the buckets from 1,024 rows up (prefill chunks)
_largest: dict[int, int] = {}  # device index -> the most N * K of a converted weight
_scratch: dict[int, torch.Tensor] = {}  # device index -> the bf16 scratch (kept: graphs may read it)
_retired: list[torch.Tensor] = []  # scratches outgrown by a later, larger weight (kept alive likewise)
_dequant_chosen: set[int] = set()  # device indices where a tuned or explicit choice uses the scratch


def _ensure_scratch(device: torch.device, need: int) -> torch.Tensor | None:
    """The device's scratch of at least ``need`` values, allocated here outside a capture (sized for
    the largest converted weight); None inside a capture when there is none big enough."""
    index = _index(device)
    buf = _scratch.get(index)
    if buf is not None and buf.numel() >= need:
        return buf
    if torch.cuda.is_current_stream_capturing():
        return None
    if buf is not None:  # (a weight converted after the first use: the old scratch stays alive,
        _retired.append(buf)  # graphs may have captured it)
    size = max(need, _largest.get(index, 0))
    buf = _scratch[index] = torch.empty(size, dtype=torch.bfloat16, device=device)
    logger.info("CUTLASS W4A16: a %.0f MB bf16 scratch for dequant + cuBLAS at large M", size * 2 / 1e6)
    return buf


def _release_unused_scratch(index: int) -> None:
    """After tuning: drop the scratch where no choice uses it (the timing graphs are gone by now)."""
    if index not in _dequant_chosen and index in _scratch:
        del _scratch[index]


def _is_dequant(cfg: int) -> bool:
    return cfg in DEQUANTS


def _dequant_matmul(x2: torch.Tensor, wt: CutlassWeight, y: torch.Tensor, transpose: bool = False) -> None:
    """``y = x2 @ W^T`` with ``W`` dequantized into a per-device scratch (``w4a16_cutlass_dequant``;
    ``[N, K]``, or ``[K, N]`` with ``transpose``) and one ``torch.mm`` (cuBLAS). The scratch is sized at
    its first use for the device's largest converted weight (in the engine every weight is converted
    before the first forward). Tuning drops it again unless a choice (tuned, or a caller's explicit
    ``config``) uses it; from then on it is never freed, so graphs that captured it stay valid. Inside a
    capture, where it cannot be allocated, the launch falls back to the default configuration."""
    from hotloop.kernels.w4a16_cutlass_dequant import dequantize

    need = wt.n * wt.k
    buf = _ensure_scratch(x2.device, need)
    if buf is None:
        logger.warning("CUTLASS W4A16: no dequant scratch inside a graph capture; config 0 runs instead")
        _launch(default_config(x2.shape[0]), x2, wt, y)
        return
    w = buf[:need].view((wt.k, wt.n) if transpose else (wt.n, wt.k))
    dequantize(wt.w, wt.scales, wt.zeros, wt.n, wt.k, wt.group_size, out=w, transpose=transpose)
    torch.mm(x2, w if transpose else w.t(), out=y)


# ------------------------------------------------------------------------------ the one-row GEMV

GEMV_SOURCE = "w4a16_cutlass_gemv.cu"
GEMV_VARIANTS: tuple[tuple[int, int], ...] = (
    (1, 4),
    (2, 4),
    (4, 4),
    (1, 2),
    (2, 2),
)  # (groups a warp, warps)
GEMV_BASE = 100  # configuration ids of the GEMV's variants: GEMV_BASE + index


def gemv_name(groups: int, warps: int, pdl: bool = False, silu: bool = False) -> str:
    return f"w4c_gemv_g{groups}_w{warps}" + ("_pdl" if pdl else "") + ("_silu" if silu else "")


GEMV_PDL_ENV = "HOTLOOP_W4C_GEMV_PDL"
GEMV_SILU_ENV = "HOTLOOP_W4C_FUSED_SILU"


def gemv_pdl(device: torch.device) -> bool:
    """``HOTLOOP_W4C_GEMV_PDL=1``: the one-row GEMV requests its first weights before it waits for the
    kernel before (programmatic dependent launch). Off by default: not yet run on a GPU."""
    return switch(GEMV_PDL_ENV, False, logger) and pdl(device)


def silu_fusion() -> bool:
    """``HOTLOOP_W4C_FUSED_SILU=1``: at one row the down projection's GEMV folds in the SiLU-and-mul
    (:func:`gemv_silu_mul`). Off by default: not yet run on a GPU."""
    return switch(GEMV_SILU_ENV, False, logger)


def gemv_fits(n: int, k: int, group_size: int, groups: int, warps: int) -> bool:
    """Whether variant ``(groups, warps)`` of the one-row GEMV (``kernels/cuda/w4a16_cutlass_gemv.cu``)
    covers ``[1, k] @ [k, n]``: group 128, 64-row strips, whole K slices of ``groups * warps`` groups."""
    return group_size == 128 and n > 0 and n % 64 == 0 and k > 0 and k % (128 * groups * warps) == 0


def gemv(
    x2: torch.Tensor,
    wt: CutlassWeight,
    variant: tuple[int, int],
    out: torch.Tensor | None = None,
    silu: bool = False,
) -> torch.Tensor:
    """``x2 [1, K]`` (bf16, contiguous) times the weight with the tensor-core GEMV's ``variant``; with
    ``silu``, ``x2`` is the gate/up row ``[1, 2K]`` and the input ``silu(gate) * up``. Raises
    ``ValueError`` where it does not fit and ``cuda_jit.CudaError`` where it cannot be built."""
    from hotloop.kernels.w4a16_one_row import launch_buffers

    groups, warps = variant
    width = 2 * wt.k if silu else wt.k
    if tuple(x2.shape) != (1, width) or x2.dtype != torch.bfloat16 or not x2.is_contiguous():
        raise ValueError(
            f"the one-row GEMV takes a contiguous bf16 [1, {width}] x (got {x2.dtype} {tuple(x2.shape)})"
        )
    if not gemv_fits(wt.n, wt.k, wt.group_size, groups, warps):
        raise ValueError(
            f"GEMV variant {variant} needs group 128 (got {wt.group_size}), N a multiple of 64 (got {wt.n}) "
            f"and K a multiple of {128 * groups * warps} (got {wt.k})"
        )
    names = [gemv_name(*v, p, f) for v in GEMV_VARIANTS for p in (False, True) for f in (False, True)]
    kernels = cuda_jit.load(GEMV_SOURCE, x2.device, names)
    if kernels is None:
        raise cuda_jit.CudaError("the CUTLASS-layout W4A16 GEMV is not available on this machine")
    split = wt.k // (128 * groups * warps)
    tiles = wt.n // 64
    out, ws, cnt = launch_buffers(x2, wt.n, split, tiles, "w4c_gemv", out)
    early = gemv_pdl(x2.device)
    kernels[gemv_name(groups, warps, early, silu)](
        (tiles, split), warps * 32, (x2, wt.w, wt.scales, wt.zeros, ws, out, cnt, wt.n, wt.k), pdl=early
    )
    return out


def gemv_silu_mul(gate_up: torch.Tensor, wt: CutlassWeight) -> torch.Tensor | None:
    """``silu(gate) * up @ W^T`` -> ``[1, N]`` in one launch for the gate/up row ``[1, 2K]``, where the
    tuned launch for one row of this weight is a GEMV variant; else None (the caller runs the two)."""
    if gate_up.dim() != 2 or gate_up.shape[0] != 1 or gate_up.dtype != torch.bfloat16:
        return None
    gate_up = gate_up.contiguous()
    cfg = choose(gate_up[:, : wt.k], wt)  # (the tuned choice for one row: the row's gate half stands in)
    if not _is_gemv(cfg):
        return None
    return gemv(gate_up, wt, GEMV_VARIANTS[cfg - GEMV_BASE], silu=True)


def default_config(m: int) -> int:
    """Before tuning (inside a graph capture): stream-K 16-row tiles up to 16 rows, else 128 x 128."""
    return 5 if m <= 16 else 0


UNBOUNDED = 1 << 62  # the bucket of every M above the last
_LAST_BUCKET = 16384
_TUNE_AT_TOP_UP_TO = 4096  # larger buckets are tuned on the call's own rows (no extra activations)


def m_bucket(m: int) -> int:
    """The tuning bucket of ``m`` rows, named by its largest M: powers of two up to 256, then two a
    octave (384, 512, 768, 1,024, 1,536, ... 16,384), then one for all. The wide tiles' waves and
    token-tile padding change within an octave (at 384 rows a 128 x 192 tile wins, at 512 it pads a
    third), so the buckets above 256 are half-octaves; those up to 4,096 are tuned at their largest M."""
    if m <= 256:
        return 1 << max(m - 1, 0).bit_length()
    if m > _LAST_BUCKET:
        return UNBOUNDED
    p = 1 << (m - 1).bit_length()  # the next power of two
    return p * 3 // 4 if m <= p * 3 // 4 else p


_tuned: dict[tuple, int] = {}
_disk: dict[str, dict] | None = None
tuning_log: dict[tuple, list[tuple[int, float]]] = {}


def _disk_key(tkey: tuple) -> str:
    index, mb, n, k, g = tkey
    name = torch.cuda.get_device_name(index)
    files = (SOURCE.name, HEADER.name, GEMV_SOURCE, "w4a16_common.cuh")
    sources = b"".join((cuda_jit.SOURCE_DIR / f).read_bytes() for f in files)
    sources += (Path(__file__).parent / "w4a16_cutlass_dequant.py").read_bytes()
    tuning = (
        "half-octave buckets above 256, tuned at the bucket's largest M",
        (DEQUANTS, DEQUANT_FROM_M, _TUNE_AT_TOP_UP_TO, _LAST_BUCKET),
        GEMV_VARIANTS,
        cuda_jit.enabled(),
    )
    tag = hashlib.sha1(sources + repr(tuning).encode()).hexdigest()[:8]
    return f"{tuning_cache.environment_key(name)}|{tag}|m{mb}|n{n}|k{k}|g{g}"


def _check_against_cutlass(cfg: int, x2: torch.Tensor, wt: CutlassWeight, tol: float = 1e-2) -> None:
    """Raise unless launch ``cfg`` agrees with the cooperative 128 x 128 tile (config 0) on ``x2``,
    relative to the largest output: the tuner's guard for the launches that are not CUTLASS's own."""
    x2 = x2[:1024]  # (enough rows to check, without a second full-size output)
    want = torch.empty(x2.shape[0], wt.n, dtype=torch.bfloat16, device=x2.device)
    got = torch.empty_like(want)
    _launch(0, x2, wt, want)
    _launch(cfg, x2, wt, got)
    err = float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))
    if not err < tol:
        raise RuntimeError(f"its result is {err:.3g} (relative) from the CUTLASS tile's, over {tol}")


def choose(x2: torch.Tensor, wt: CutlassWeight) -> int:
    """The configuration for this call: tuned per (device, M bucket, N, K, group) outside capture, on
    random rows as many as the bucket's largest M up to 4,096 (:func:`m_bucket`), so that there the
    choice does not depend on which M of the bucket came first; the larger buckets are tuned on the
    call's own rows (the piecewise prefill graphs are captured largest first)."""
    from hotloop.kernels.w4a16_gemm import graph_time_us

    global _disk
    m = x2.shape[0]
    index = _index(x2.device)
    tkey = (index, m_bucket(m), wt.n, wt.k, wt.group_size)
    cfg = _tuned.get(tkey)
    if cfg is not None:
        return cfg
    if _disk is None:
        _disk = tuning_cache.load(TUNING_FAMILY)
    stored = _disk.get(_disk_key(tkey))
    if stored is not None:
        cfg = int(stored["config"])
        if _is_dequant(cfg):
            if _ensure_scratch(x2.device, wt.n * wt.k) is None:
                return default_config(m)  # (inside a capture before any eager call: not remembered)
            _dequant_chosen.add(index)
        _tuned[tkey] = cfg
        return cfg
    if torch.cuda.is_current_stream_capturing():
        return default_config(m)
    rows = tkey[1] if tkey[1] <= _TUNE_AT_TOP_UP_TO else m
    try:
        xt = x2 if rows == m else torch.randn(rows, wt.k, device=x2.device, dtype=x2.dtype)
        y = torch.empty(rows, wt.n, dtype=torch.bfloat16, device=x2.device)
    except torch.cuda.OutOfMemoryError:
        logger.warning(
            "CUTLASS W4A16 tuning at M=%d N=%d K=%d: out of memory; the default runs", rows, wt.n, wt.k
        )
        return default_config(m)
    timed = []
    for c in candidates(rows, wt.n, wt.k, wt.group_size):
        try:
            if _is_dequant(c):
                _check_against_cutlass(c, xt, wt)
            timed.append((c, graph_time_us(partial(_launch, c, xt, wt, y), x2.device)))
        except Exception as e:  # a candidate that cannot build or run here is skipped, and said
            logger.warning("CUTLASS W4A16 tuning: %s at M=%d N=%d K=%d skipped: %s", config_label(c), rows,
                           wt.n, wt.k, str(e).splitlines()[0] if str(e) else type(e).__name__)  # fmt: skip
            torch.cuda.synchronize(x2.device)
    tuning_log[tkey] = timed
    del xt, y
    if not timed:  # (nothing ran: not remembered, so the next call reports the launch's error)
        _release_unused_scratch(index)
        return default_config(m)
    best = min(timed, key=lambda t: t[1])[0]
    if _is_dequant(best):
        _dequant_chosen.add(index)
    _release_unused_scratch(index)
    _tuned[tkey] = best
    tuning_cache.store(TUNING_FAMILY, _disk_key(tkey), {"config": best})
    _disk[_disk_key(tkey)] = {"config": best}
    return best


def config_label(cfg: int) -> str:
    """A configuration id as a name: the GEMV's ``gemv GxW`` or the library's (where it is loaded)."""
    if cfg == DEQUANT:
        return "dequant + cuBLAS"
    if cfg == DEQUANT_KN:
        return "dequant [K, N] + cuBLAS"
    if _is_gemv(cfg):
        groups, warps = GEMV_VARIANTS[cfg - GEMV_BASE]
        return f"gemv {groups}x{warps}"
    for lib in _libs.values():
        return str(lib.hl_w4c_config_name(cfg).decode())
    return f"config {cfg}"


def tuned_launches() -> list[dict[str, object]]:
    """The configurations chosen in this process (tuned or read from disk), one record per (M bucket,
    N, K, group), with the candidates' times where they were timed here: for a benchmark's JSON."""
    out: list[dict[str, object]] = []
    for tkey, cfg in sorted(_tuned.items()):
        _index, mb, n, k, group = tkey
        timed = {config_label(c): round(us, 2) for c, us in tuning_log.get(tkey, [])}
        out.append(
            {"m_bucket": mb, "n": n, "k": k, "group": group, "config": config_label(cfg), "timed_us": timed}
        )
    return out


def gemm(x: torch.Tensor, wt: CutlassWeight, config: int | None = None) -> torch.Tensor:
    """``x [..., K] @ W^T`` -> ``[..., N]`` in bf16 (x bf16 on the weight's device)."""
    if x.dtype != torch.bfloat16:
        raise ValueError(f"the CUTLASS W4A16 GEMM takes bfloat16 x (got {x.dtype})")
    if x.shape[-1] != wt.k:
        raise ValueError(f"x has {x.shape[-1]} input features; the weight has {wt.k}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, wt.k)
    if x2.data_ptr() % 16 or not x2.is_contiguous():
        x2 = x2.contiguous().clone()
    y = torch.empty(x2.shape[0], wt.n, dtype=torch.bfloat16, device=x.device)
    if x2.shape[0] == 0:
        return y.reshape(*lead, wt.n)
    if config is None:
        _launch(choose(x2, wt), x2, wt, y, strict=False)
    else:
        if _is_dequant(config):  # (a caller's explicit choice may be captured: its scratch stays)
            _dequant_chosen.add(_index(x.device))
        _launch(config, x2, wt, y)
    return y.reshape(*lead, wt.n)
