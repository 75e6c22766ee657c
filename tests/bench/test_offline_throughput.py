"""``bench/offline.py``'s throughput run on the CPU: token counts and the wall time split by step kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hotloop.bench.offline import _wall_by_kind


def test_wall_by_kind_charges_the_previous_step_when_overlapped() -> None:
    kinds = ["eager", "graph", "graph", "eager"]
    walls = [1.0, 2.0, 4.0, 8.0]
    # overlapped: call i collects call i-1's step, so its wall time is charged to kinds[i - 1]
    assert _wall_by_kind(kinds, walls, overlap=True) == {"eager": 3.0, "graph": 12.0}
    assert _wall_by_kind(kinds, walls, overlap=False) == {"eager": 9.0, "graph": 6.0}
    assert _wall_by_kind([], [], overlap=True) == {"eager": 0.0, "graph": 0.0}


def test_throughput_on_cpu_counts_tokens_and_splits_wall_time(tmp_path: Path) -> None:
    from hotloop.cli.main import main

    out = tmp_path / "t.json"
    argv = ["bench", "throughput", "--model", "smollm2-135m", "--load-format", "dummy", "--device", "cpu",
            "--num-prompts", "3", "--input-len", "8", "--output-len", "4", "--output-json", str(out)]  # fmt: skip
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    r = json.loads(out.read_text())
    assert r["output_tokens"] == 12 and r["num_prompts"] == 3
    split = r["wall_s_by_step_kind"]
    assert split["graph"] == 0.0  # the CPU runs every step eagerly
    assert 0.0 < split["eager"] <= r["elapsed_s"] + 1e-3
    assert r["steps"] >= 4  # one prefill step, then a step per further token


if __name__ == "__main__":
    pytest.main([__file__])
