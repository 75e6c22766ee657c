"""CUDA C kernels compiled with nvcc at first use and launched through the CUDA driver API.

A few kernels are faster written in CUDA C than in Triton (``kernels/cuda/*.cu``; today the W4A16
one-row GEMV, ``w4a16_cuda.py``). They need no PyTorch extension build: the source is compiled by
``nvcc -cubin`` for the GPU's architecture (a few seconds, once: the cubin is kept under
``$HOTLOOP_CACHE/cuda/``, keyed by the source, the headers beside it, the architecture and the nvcc version), loaded with
``cuModuleLoadData`` and launched with ``cuLaunchKernelEx`` on torch's current stream, so the
launches are captured by CUDA graphs like any other. Where there is no nvcc (``$HOTLOOP_NVCC``,
``$CUDA_HOME/bin/nvcc``, ``/usr/local/cuda/bin/nvcc`` or ``nvcc`` on the PATH), or it fails,
:func:`available` is false and callers keep their Triton kernels; ``HOTLOOP_CUDA_KERNELS=0`` turns
the CUDA kernels off.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from hotloop.utils.env import cache_dir

logger = logging.getLogger(__name__)

ENV = "HOTLOOP_CUDA_KERNELS"
SOURCE_DIR = Path(__file__).parent / "cuda"
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a kernel may take without opting in


class CudaError(RuntimeError):
    """A CUDA driver call or an nvcc compile failed."""


def enabled() -> bool:
    """Whether CUDA C kernels may be used (``HOTLOOP_CUDA_KERNELS`` is not 0)."""
    return os.environ.get(ENV, "1") != "0"


def find_nvcc() -> str | None:
    """The nvcc to use, or ``None``."""
    candidates = [os.environ.get("HOTLOOP_NVCC")]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        candidates.append(str(Path(home) / "bin" / "nvcc"))
    candidates += ["/usr/local/cuda/bin/nvcc", shutil.which("nvcc")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


_nvcc_versions: dict[str, str] = {}


def _nvcc_version(nvcc: str) -> str:
    if nvcc not in _nvcc_versions:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
        _nvcc_versions[nvcc] = out.stdout.strip().splitlines()[-1] if out.returncode == 0 else "unknown"
    return _nvcc_versions[nvcc]


def arch_of(device: torch.device) -> str:
    """``sm_XY`` of a CUDA device (``sm_90a`` on Hopper: the arch-specific features are allowed)."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def headers(source: Path) -> list[Path]:
    """The headers a source may include (every ``.cuh`` beside it): part of its cache key."""
    return sorted(source.parent.glob("*.cuh"))


def compile_cubin(source: Path, arch: str, nvcc: str | None = None) -> bytes:
    """``source`` compiled for ``arch`` (cached on disk); raises :class:`CudaError` on failure."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise CudaError("no nvcc found (set HOTLOOP_NVCC or CUDA_HOME, or install the CUDA toolkit)")
    flags = ["-cubin", f"-arch={arch}", "-O3", "-std=c++17"]
    text = source.read_bytes() + b"".join(h.read_bytes() for h in headers(source))
    key = hashlib.sha256(text + arch.encode() + _nvcc_version(nvcc).encode() + " ".join(flags).encode())
    path = cache_dir() / "cuda" / f"{source.stem}-{arch}-{key.hexdigest()[:16]}.cubin"
    if path.is_file():
        return path.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    logger.info("compiling %s for %s with %s (once; cached in %s)", source.name, arch, nvcc, path.parent)
    try:
        proc = subprocess.run(
            [nvcc, *flags, "-o", str(tmp), str(source)], capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            raise CudaError(f"nvcc failed on {source.name} for {arch}:\n{proc.stderr[-4000:]}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_bytes()


class _LaunchAttribute(ctypes.Structure):
    # (c_ubyte arrays, not c_char: reading a c_char array field gives a new bytes object, and
    # writing through it would write into that object, not the struct)
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_ubyte * 4), ("value", ctypes.c_ubyte * 64)]


def pdl_attribute() -> _LaunchAttribute:
    """The launch attribute that allows programmatic dependent launch (the kernel's
    ``griddepcontrol.wait`` then orders it after the kernel before)."""
    attr = _LaunchAttribute()
    attr.id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    ctypes.c_int.from_buffer(attr, _LaunchAttribute.value.offset).value = 1
    return attr


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


class _Driver:
    """The few libcuda entry points used here."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuLaunchKernelEx.argtypes = [
            ctypes.POINTER(_LaunchConfig),
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
        ]

    def check(self, status: int, what: str) -> None:
        if status != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(status, ctypes.byref(name))
            raise CudaError(f"{what} failed: {name.value.decode() if name.value else status}")

    def ensure_context(self, index: int) -> None:
        """Make the device's primary context (the one torch uses) current on this thread, where
        ``torch.cuda.device(index)`` has not already (a retain, once: torch holds the same context)."""
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if ctx.value:
            dev = ctypes.c_int()
            self.check(self.lib.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
            if dev.value == index:
                return
        dev_handle = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev_handle), index), "cuDeviceGet")
        self.check(
            self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev_handle), "cuDevicePrimaryCtxRetain"
        )
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


_driver: _Driver | None = None
_lock = threading.Lock()


def _get_driver() -> _Driver:
    global _driver
    if _driver is None:
        _driver = _Driver()
    return _driver


class Kernel:
    """One ``extern "C"`` kernel of a loaded module; call it with a grid, a block size and its
    arguments (tensors, ``None`` for a null pointer, ints as 32-bit, floats as 32-bit)."""

    def __init__(self, name: str, handle: int, device_index: int) -> None:
        self.name = name
        self.handle = handle
        self.device_index = device_index
        self._shared_opt_in = _DEFAULT_SHARED_LIMIT

    def __call__(
        self,
        grid: Sequence[int],
        block: int,
        args: Sequence[torch.Tensor | int | float | None],
        shared_bytes: int = 0,
        pdl: bool = False,
    ) -> None:
        # the device's primary context current for the launch; torch's current device restored after
        with torch.cuda.device(self.device_index):
            self._launch(grid, block, args, shared_bytes, pdl)

    def _launch(
        self,
        grid: Sequence[int],
        block: int,
        args: Sequence[torch.Tensor | int | float | None],
        shared_bytes: int,
        pdl: bool,
    ) -> None:
        drv = _get_driver()
        drv.ensure_context(self.device_index)
        if shared_bytes > self._shared_opt_in:
            # more than 48 KB of dynamic shared memory needs the kernel's opt-in (once per size)
            drv.check(
                drv.lib.cuFuncSetAttribute(
                    ctypes.c_void_p(self.handle),
                    _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    ctypes.c_int(shared_bytes),
                ),
                f"cuFuncSetAttribute({self.name}, max dynamic shared memory {shared_bytes})",
            )
            self._shared_opt_in = shared_bytes
        values: list[ctypes._SimpleCData] = []
        for a in args:
            if isinstance(a, torch.Tensor):
                values.append(ctypes.c_void_p(a.data_ptr()))
            elif a is None:
                values.append(ctypes.c_void_p(0))
            elif isinstance(a, bool) or isinstance(a, int):
                if not -(2**31) <= int(a) < 2**31:
                    raise ValueError(f"{self.name}: integer argument {a} does not fit a 32-bit int")
                values.append(ctypes.c_int(int(a)))
            elif isinstance(a, float):
                values.append(ctypes.c_float(a))
            else:
                raise TypeError(f"{self.name}: unsupported argument {type(a).__name__}")
        params = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values]
        )
        gx, gy, gz = (list(grid) + [1, 1])[:3]
        stream = torch.cuda.current_stream(self.device_index).cuda_stream
        attrs = (_LaunchAttribute * 1)()
        n_attrs = 0
        if pdl:
            attrs[n_attrs] = pdl_attribute()
            n_attrs += 1
        config = _LaunchConfig(
            gx,
            gy,
            gz,
            block,
            1,
            1,
            shared_bytes,
            stream,
            ctypes.cast(attrs, ctypes.POINTER(_LaunchAttribute)),
            n_attrs,
        )
        drv.check(
            drv.lib.cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(self.handle), params, None),
            f"cuLaunchKernelEx({self.name})",
        )


_modules: dict[tuple[str, int], dict[str, Kernel] | None] = {}


def load(source_name: str, device: torch.device, names: Sequence[str]) -> dict[str, Kernel] | None:
    """The kernels ``names`` of ``kernels/cuda/<source_name>`` (an absolute path is taken as it is:
    the benchmarks' probes) on ``device``, compiled and loaded once per process and device; ``None``
    (logged once) where CUDA kernels are off, there is no nvcc, or the compile or load fails."""
    if not enabled() or device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (source_name, index)
    with _lock:
        if key in _modules:
            return _modules[key]
        try:
            cubin = compile_cubin(SOURCE_DIR / source_name, arch_of(torch.device("cuda", index)))
            drv = _get_driver()
            kernels = {}
            with torch.cuda.device(index):  # loaded into the primary context torch uses
                drv.ensure_context(index)
                module = ctypes.c_void_p()
                buf = ctypes.create_string_buffer(cubin, len(cubin))
                drv.check(drv.lib.cuModuleLoadData(ctypes.byref(module), buf), "cuModuleLoadData")
                for name in names:
                    fn = ctypes.c_void_p()
                    drv.check(
                        drv.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                        f"cuModuleGetFunction({name})",
                    )
                    kernels[name] = Kernel(name, int(fn.value or 0), index)
            _modules[key] = kernels
        except (
            CudaError,
            OSError,
            AttributeError,
            subprocess.SubprocessError,
        ) as e:  # (old libcuda: no symbol)
            logger.warning(
                "CUDA kernels of %s unavailable (%s); the Triton kernels stay in use", source_name, e
            )
            _modules[key] = None
        return _modules[key]
