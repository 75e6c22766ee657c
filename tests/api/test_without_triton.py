"""The CPU path without Triton installed: Triton is a test and GPU extra (``pyproject.toml``), so a
plain ``pip install -e .`` on a CPU machine must build an engine and generate. Run in a subprocess
whose import system reports no ``triton`` package."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

BLOCK_TRITON = """
import importlib.abc, importlib.util, sys

class _NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "triton":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, _NoTriton())
_find = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] == "triton" else _find(name, *a)
"""


def test_cpu_engine_builds_and_generates_without_triton(make_tiny_model: Callable[[str], Path]) -> None:
    path = make_tiny_model("llama_gqa_llama3rope")
    script = BLOCK_TRITON + textwrap.dedent(
        f"""
        from hotloop.api.build import build_engine
        from hotloop.config import EngineConfig
        from hotloop.messages import GenerationConfig

        engine = build_engine({str(path)!r}, EngineConfig(device="cpu", dtype="float32", quant_policy=8)).engine
        engine.add_request("a", [5, 6, 7, 8], GenerationConfig(max_new_tokens=4, ignore_eos=True))
        n = 0
        while engine.has_unfinished():
            n += sum(len(o.new_token_ids) for o in engine.step())
        assert n == 4, n
        assert not any(m.split(".")[0] == "triton" for m in sys.modules)
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
