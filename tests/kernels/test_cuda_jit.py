"""``cuda_jit``'s compile cache and launch attributes, on the CPU (a stand-in nvcc)."""

from __future__ import annotations

import ctypes
import stat
from pathlib import Path

import pytest

from hotloop.kernels import cuda_jit


def _fake_nvcc(tmp_path: Path) -> str:
    """An "nvcc" that prints a version and writes its source's bytes as the cubin, counting its runs."""
    script = tmp_path / "nvcc"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "fake nvcc 1.0"; exit 0; fi\n'
        f'echo run >> "{tmp_path}/runs"\n'
        'while [ $# -gt 1 ]; do if [ "$1" = "-o" ]; then out=$2; fi; shift; done\n'
        'cat "$1" > "$out"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_cache_key_covers_the_headers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cu").write_text('#include "common.cuh"\n')
    (src / "common.cuh").write_text("// one\n")
    nvcc = _fake_nvcc(tmp_path)
    runs = tmp_path / "runs"
    assert cuda_jit.headers(src / "k.cu") == [src / "common.cuh"]
    cuda_jit.compile_cubin(src / "k.cu", "sm_90a", nvcc)
    cuda_jit.compile_cubin(src / "k.cu", "sm_90a", nvcc)  # cached: not compiled again
    assert runs.read_text().count("run") == 1
    (src / "common.cuh").write_text("// two\n")  # a header change is a new key: compiled again
    cuda_jit.compile_cubin(src / "k.cu", "sm_90a", nvcc)
    assert runs.read_text().count("run") == 2


def test_pdl_launch_attribute_layout() -> None:
    # CUlaunchAttribute: a 4-byte id, 4 bytes of padding, then a 64-byte value (here one int, 1);
    # 72 bytes in all
    attr = cuda_jit.pdl_attribute()
    assert attr.id == 6 and bytes(attr.value[:4]) == (1).to_bytes(4, "little")
    assert ctypes.sizeof(attr) == 72
