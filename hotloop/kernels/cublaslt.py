"""cuBLASLt through ctypes: ``y = x @ W^T`` with an algorithm chosen by timing, not by the heuristic.

``torch.nn.functional.linear`` runs cuBLAS' first heuristic choice. For some of the decode step's
shapes that choice is wave-quantised: at batch 256 Llama-3-8B's gate/up projection (N = 28,672)
runs 224 tiles of 256x128 on 132 multiprocessors, two waves of which the second is 70% full. The
heuristic also returns other algorithms (other tiles, split-K, stream-K); this module asks for
them, and ``kernels/dense_tune.py`` times them once per shape.

Owns: loading ``libcublasLt`` (the one torch loaded), one handle and one workspace per device, the
matmul, layout and preference descriptors per problem (cached), ``heuristics`` (the candidate
algorithms of a problem) and ``matmul`` (one launch with a given algorithm on the current stream).
Nothing here decides which algorithm runs; callers pass one.

Layouts: row-major ``x [M, K]`` and ``W [N, K]`` (``nn.Linear``) are column-major ``x^T [K, M]`` and
``W^T [K, N]``; ``y^T [N, M] = op(W^T)^T @ x^T`` is cuBLAS' ``TRANSA = T, TRANSB = N`` problem with
``m = N, n = M, k = K``, written column-major into ``y [M, N]`` row-major. float32 accumulation,
16-bit (fp16 / bf16) operands and output, no bias.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Algo", "CublasLtError", "available", "heuristics", "matmul", "version"]

# cublasLt.h / library_types.h / cublas_api.h
_CUBLAS_COMPUTE_32F = 68
_CUDA_R_32F = 0
_DTYPES = {torch.float16: 2, torch.bfloat16: 14}
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_REDUCTION_SCHEME_MASK = 3
_REDUCTION_SCHEME_COMPUTE_TYPE = 2  # split-K partials added in float32 (not in place, not in 16 bits)
ALIGNMENT = 256  # the heuristic's default assumption for every buffer (cublasLt.h, MIN_ALIGNMENT)
_ALGO_CONFIG_ID, _ALGO_CONFIG_TILE_ID, _ALGO_CONFIG_SPLITK_NUM, _ALGO_CONFIG_STAGES_ID = 0, 1, 2, 6
WORKSPACE_BYTES = 32 << 20  # per device; what torch gives cuBLASLt on Hopper


class CublasLtError(RuntimeError):
    """A cuBLASLt call returned a status other than success."""


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [
        ("algo", _Algo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


@dataclass(frozen=True)
class Algo:
    """One cuBLASLt algorithm of one problem: its opaque bytes and what it says about itself."""

    data: tuple[int, ...]  # cublasLtMatmulAlgo_t's eight words
    workspace: int  # bytes it needs
    waves: float  # the heuristic's waves count
    algo_id: int
    tile_id: int
    splitk: int
    stages_id: int

    def describe(self) -> str:
        return f"algo {self.algo_id} tile {self.tile_id} splitk {self.splitk} stages {self.stages_id} waves {self.waves:.2f}"


_lock = threading.Lock()
_lib_handle: Any = None
_lib_error: str | None = None
_handles: dict[int, tuple[ctypes.c_void_p, torch.Tensor]] = {}
_problems: dict[tuple[int, torch.dtype, int, int, int], tuple[ctypes.c_void_p, ...]] = {}
_ONE = ctypes.c_float(1.0)
_ZERO = ctypes.c_float(0.0)


def _candidates() -> list[str]:
    # the soname of the CUDA torch was built with first: dlopen then returns the copy torch loaded
    major = (torch.version.cuda or "13").split(".")[0]
    names = [f"libcublasLt.so.{major}"] + [
        n for n in ("libcublasLt.so.13", "libcublasLt.so.12") if major not in n
    ]
    names.append("libcublasLt.so")
    here = os.path.dirname(torch.__file__)
    found: list[str] = []
    for sub in ("nvidia/cu13/lib", "nvidia/cublas/lib"):
        found += sorted(glob.glob(os.path.join(here, "..", sub, "libcublasLt.so*")))
    return names + found


def _lib() -> Any:
    """The cuBLASLt library (the copy torch already loaded, found by its soname), or raise."""
    global _lib_handle, _lib_error
    if _lib_handle is not None:
        return _lib_handle
    if _lib_error is not None:
        raise CublasLtError(_lib_error)
    errors = []
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            errors.append(f"{name}: {e}")
            continue
        lib.cublasLtMatmul.restype = ctypes.c_int
        lib.cublasLtMatmulAlgoGetHeuristic.restype = ctypes.c_int
        _lib_handle = lib
        return lib
    _lib_error = "libcublasLt could not be loaded (" + "; ".join(errors[:3]) + ")"
    raise CublasLtError(_lib_error)


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} returned cuBLAS status {status}")


def version() -> int:
    """``cublasLtGetVersion()`` of the loaded library (0 when it does not load)."""
    try:
        lib = _lib()
    except CublasLtError:
        return 0
    lib.cublasLtGetVersion.restype = ctypes.c_size_t
    return int(lib.cublasLtGetVersion())


def available(device: torch.device) -> bool:
    """Whether cuBLASLt can be called on ``device`` (a CUDA device whose library loads)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        _lib()
    except CublasLtError:
        return False
    return True


def _handle(device: torch.device) -> tuple[ctypes.c_void_p, torch.Tensor]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        if index not in _handles:
            lib = _lib()
            h = ctypes.c_void_p()
            with torch.cuda.device(index):
                _check(lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
                ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=f"cuda:{index}")
            _handles[index] = (h, ws)
        return _handles[index]


def _problem(device: torch.device, dtype: torch.dtype, m: int, n: int, k: int) -> tuple[ctypes.c_void_p, ...]:
    """(matmul desc, W layout, x layout, y layout) of ``y [m, n] = x [m, k] @ W [n, k]^T``, cached."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, dtype, m, n, k)
    got = _problems.get(key)
    if got is not None:
        return got
    lib = _lib()
    dt = _DTYPES[dtype]
    desc = ctypes.c_void_p()
    _check(
        lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _CUBLAS_COMPUTE_32F, _CUDA_R_32F), "MatmulDescCreate"
    )
    for attr, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
        v = ctypes.c_int32(op)
        _check(
            lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), ctypes.c_size_t(4)),
            "DescSetAttribute",
        )
    layouts = []
    for rows, cols, ld in ((k, n, k), (k, m, k), (n, m, n)):  # W^T, x^T, y^T (column-major)
        lay = ctypes.c_void_p()
        _check(
            lib.cublasLtMatrixLayoutCreate(
                ctypes.byref(lay), dt, ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(ld)
            ),
            "MatrixLayoutCreate",
        )
        layouts.append(lay)
    got = (desc, *layouts)
    with _lock:
        _problems.setdefault(key, got)
        return _problems[key]


def _algo_attr(lib: Any, algo: _Algo, attr: int) -> int:
    v = ctypes.c_uint32(0)
    written = ctypes.c_size_t(0)
    status = lib.cublasLtMatmulAlgoConfigGetAttribute(
        ctypes.byref(algo), attr, ctypes.byref(v), ctypes.c_size_t(4), ctypes.byref(written)
    )
    return int(v.value) if status == 0 else -1


def heuristics(
    device: torch.device, dtype: torch.dtype, m: int, n: int, k: int, count: int = 32
) -> list[Algo]:
    """Up to ``count`` algorithms the heuristic offers for ``x [m, k] @ W [n, k]^T``, its first
    choice first; only those that fit the workspace."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype}: cuBLASLt GEMMs here take float16 or bfloat16")
    if min(m, n, k) < 1 or count < 1:
        raise ValueError(f"m={m}, n={n}, k={k}, count={count}: each must be >= 1")
    lib = _lib()
    h, _ = _handle(device)
    desc, wl, xl, yl = _problem(device, dtype, m, n, k)
    pref = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "MatmulPreferenceCreate")
    try:
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(
            lib.cublasLtMatmulPreferenceSetAttribute(
                pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), ctypes.c_size_t(8)
            ),
            "PreferenceSetAttribute",
        )
        # split-K only with float32 partials, as torch's default (no reduced-precision reductions)
        mask = ctypes.c_uint32(_REDUCTION_SCHEME_COMPUTE_TYPE)
        _check(
            lib.cublasLtMatmulPreferenceSetAttribute(
                pref, _PREF_REDUCTION_SCHEME_MASK, ctypes.byref(mask), ctypes.c_size_t(4)
            ),
            "PreferenceSetAttribute",
        )
        results = (_Heuristic * count)()
        returned = ctypes.c_int(0)
        _check(
            lib.cublasLtMatmulAlgoGetHeuristic(
                h, desc, wl, xl, yl, yl, pref, ctypes.c_int(count), results, ctypes.byref(returned)
            ),
            "MatmulAlgoGetHeuristic",
        )
    finally:
        lib.cublasLtMatmulPreferenceDestroy(pref)
    out = []
    for r in results[: returned.value]:
        if r.state != 0 or r.workspaceSize > WORKSPACE_BYTES:
            continue
        out.append(
            Algo(
                data=tuple(int(w) for w in r.algo.data),
                workspace=int(r.workspaceSize),
                waves=float(r.wavesCount),
                algo_id=_algo_attr(lib, r.algo, _ALGO_CONFIG_ID),
                tile_id=_algo_attr(lib, r.algo, _ALGO_CONFIG_TILE_ID),
                splitk=_algo_attr(lib, r.algo, _ALGO_CONFIG_SPLITK_NUM),
                stages_id=_algo_attr(lib, r.algo, _ALGO_CONFIG_STAGES_ID),
            )
        )
    return out


_algo_structs: dict[tuple[int, ...], _Algo] = {}


def matmul(
    x: torch.Tensor, weight: torch.Tensor, algo: Algo, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x [M, K] @ weight [N, K]^T`` with ``algo`` (from ``heuristics`` for this M, N, K and dtype) on
    the current stream; both contiguous, same 16-bit dtype, same CUDA device."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: want x [M, K] and weight [N, K]"
        )
    if x.dtype != weight.dtype or x.dtype not in _DTYPES:
        raise ValueError(f"x {x.dtype}, weight {weight.dtype}: want one dtype, float16 or bfloat16")
    if not (x.is_contiguous() and weight.is_contiguous()):
        raise ValueError("x and weight must be contiguous")
    if not x.is_cuda or weight.device != x.device:
        raise ValueError(f"x ({x.device}) and weight ({weight.device}) must be on one CUDA device")
    m, k = x.shape
    n = weight.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{m}, {n}] {x.dtype} tensor on {x.device}")
    if any(t.data_ptr() % ALIGNMENT for t in (x, weight, out)):
        raise ValueError(
            f"x, weight and out must start at multiples of {ALIGNMENT} bytes (the heuristic's assumption)"
        )
    lib = _lib()
    h, ws = _handle(x.device)
    desc, wl, xl, yl = _problem(x.device, x.dtype, m, n, k)
    a = _algo_structs.get(algo.data)
    if a is None:
        a = _Algo()
        for i, w in enumerate(algo.data):
            a.data[i] = w
        _algo_structs[algo.data] = a
    stream = ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream)
    _check(
        lib.cublasLtMatmul(
            h,
            desc,
            ctypes.byref(_ONE),
            ctypes.c_void_p(weight.data_ptr()),
            wl,
            ctypes.c_void_p(x.data_ptr()),
            xl,
            ctypes.byref(_ZERO),
            ctypes.c_void_p(out.data_ptr()),
            yl,
            ctypes.c_void_p(out.data_ptr()),
            yl,
            ctypes.byref(a),
            ctypes.c_void_p(ws.data_ptr()),
            ctypes.c_size_t(WORKSPACE_BYTES),
            stream,
        ),
        "cublasLtMatmul",
    )
    return out
