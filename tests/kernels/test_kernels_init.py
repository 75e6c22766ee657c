"""``hotloop.kernels``' import-time settings."""

from __future__ import annotations

import os
import subprocess
import sys


def _fp_fusion_after_import(env: dict[str, str]) -> str:
    code = "import os, hotloop.kernels; print(os.environ.get('TRITON_DEFAULT_FP_FUSION'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_fp_fusion_default_is_pinned_but_a_user_setting_wins() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_DEFAULT_FP_FUSION"}
    assert _fp_fusion_after_import(env) == "1"
    assert _fp_fusion_after_import({**env, "TRITON_DEFAULT_FP_FUSION": "0"}) == "0"
