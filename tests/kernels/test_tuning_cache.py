"""``kernels/tuning_cache.py`` and the W4A16 tuner's use of it (the timing itself needs a GPU)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from hotloop.kernels import tuning_cache, w4a16_gemm


@pytest.fixture(autouse=True)
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path))
    monkeypatch.delenv(tuning_cache.ENV, raising=False)
    monkeypatch.setattr(w4a16_gemm, "_disk", None)
    return tmp_path


def test_store_and_load_merge_entries(cache_root: Path) -> None:
    assert tuning_cache.load("fam") == {}
    tuning_cache.store("fam", "a", {"x": 1})
    tuning_cache.store("fam", "b", {"x": 2})
    assert tuning_cache.load("fam") == {"a": {"x": 1}, "b": {"x": 2}}
    assert tuning_cache.path_for("fam") == cache_root / "tuning" / "fam.json"
    assert [p.name for p in (cache_root / "tuning").iterdir()] == ["fam.json"]  # no temp files left


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 99, "entries": {"a": {}}}), "[]"])
def test_unusable_files_read_as_empty_and_are_replaced(content: str) -> None:
    path = tuning_cache.path_for("fam")
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert tuning_cache.load("fam") == {}
    tuning_cache.store("fam", "k", {"v": 1})
    assert tuning_cache.load("fam") == {"k": {"v": 1}}


def test_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tuning_cache.ENV, "0")
    tuning_cache.store("fam", "k", {"v": 1})
    assert not tuning_cache.path_for("fam").exists() and tuning_cache.load("fam") == {}


def test_w4a16_choices_round_trip_through_the_disk() -> None:
    # the module's class as it is now (test_w4a16_gemm's fixture reloads the module)
    cfg = w4a16_gemm.GemmConfig("dot", 64, 128, 64, split_k=2, num_warps=8, num_stages=4, swap_ab=True)
    tkey = (0, torch.bfloat16, 16, 4096, 4096, 128)
    key = w4a16_gemm.disk_key(tkey)
    for part in ("torch", "triton", "m16", "n4096", "k4096", "g128", "bfloat16"):
        assert part in key
    assert w4a16_gemm._from_disk(tkey) is None
    w4a16_gemm._to_disk(tkey, cfg)
    w4a16_gemm._disk = None  # a new process: read back from the file
    assert w4a16_gemm._from_disk(tkey) == cfg
    assert w4a16_gemm._from_disk((0, torch.bfloat16, 32, 4096, 4096, 128)) is None  # another M bucket
    assert w4a16_gemm.config_from_dict(asdict(cfg)) == cfg
    assert (
        w4a16_gemm.config_from_dict({"kind": "warp-drive", "block_m": 1, "block_n": 8, "block_k": 8}) is None
    )
    assert w4a16_gemm.config_from_dict({"unknown_field": 1}) is None


def test_one_row_choices_are_kept_per_early_load_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-row choice tuned under one ``HOTLOOP_W4A16_EARLY`` form is not reused under another (its
    kernels hold other registers); larger M buckets do not depend on it."""
    from hotloop.kernels import w4a16_cuda

    one = (0, torch.bfloat16, 1, 4096, 4096, 128)
    many = (0, torch.bfloat16, 16, 4096, 4096, 128)
    keys = {}
    for value in w4a16_cuda.EARLY_VALUES:
        monkeypatch.setenv(w4a16_cuda.EARLY_ENV, value)
        keys[value] = (w4a16_gemm.disk_key(one), w4a16_gemm.disk_key(many))
    assert len({k[0] for k in keys.values()}) == len(w4a16_cuda.EARLY_VALUES)
    assert len({k[1] for k in keys.values()}) == 1
    monkeypatch.delenv(w4a16_cuda.EARLY_ENV)
    assert w4a16_gemm.disk_key(one) == keys["ld"][0]  # the default form
    cfg = w4a16_gemm.GemmConfig("cuda", 1, 128, 32, split_k=2, num_warps=8)
    w4a16_gemm._to_disk(one, cfg)
    w4a16_gemm._disk = None
    assert w4a16_gemm._from_disk(one) == cfg
    monkeypatch.setenv(w4a16_cuda.EARLY_ENV, "all")
    w4a16_gemm._disk = None
    assert w4a16_gemm._from_disk(one) is None
