"""Every attention-kernel variant the launchers use on a GPU compiles for sm_90 (on the CPU).

A Triton compiler crash otherwise shows up only on the GPU machine: a float32 int4 prefill variant
crashed Triton's TritonGPUOptimizeDotOperands pass on 2026-11-30. The variants are listed in
``hotloop.kernels.aot.VARIANTS``; they compile in a subprocess because this test session runs the
kernels interpreted (``TRITON_INTERPRET=1``), and interpreted kernels cannot be compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

_PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


@pytest.mark.skipif(not os.path.exists(_PTXAS), reason="Triton's bundled ptxas is missing")
@pytest.mark.timeout(600)
def test_attention_kernels_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, "-m", "hotloop.kernels.aot"], capture_output=True, text=True, env=env, timeout=580
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no result (rc {r.returncode}): {r.stderr[-2000:]}"
    results = json.loads(lines[-1])
    from hotloop.kernels.aot import VARIANTS

    assert set(results) == set(VARIANTS)
    failed = {name: err for name, err in results.items() if err != "ok"}
    assert not failed, f"variants that do not compile for sm_90: {failed}"
    assert r.returncode == 0
