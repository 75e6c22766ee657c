"""Calibration text sources and token windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hotloop.lite import calib_data


def test_pydoc_calib_and_heldout_are_disjoint() -> None:
    calib, heldout, full = (calib_data.load_text("pydoc", s) for s in ("calib", "heldout", "all"))
    assert calib + heldout == full
    assert len(heldout) == pytest.approx(0.1 * len(full), rel=0.01)


def test_text_and_jsonl_files(tmp_path: Path) -> None:
    txt = tmp_path / "a.txt"
    txt.write_text("hello world " * 50)
    assert calib_data.load_text(str(txt), "all").startswith("hello world")
    jl = tmp_path / "b.jsonl"
    jl.write_text("\n".join(json.dumps({"id": i, "text": f"line {i}"}) for i in range(3)))
    assert calib_data.load_text(str(jl), "all") == "line 0\n\nline 1\n\nline 2"
    with pytest.raises(ValueError, match="neither one of"):
        calib_data.load_text(str(tmp_path / "missing.txt"))
    # a line without a text field is refused (it once calibrated on the first string, e.g. an id),
    # and a malformed line is named by file and line
    jl.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"id": "abc123"}) + "\n")
    with pytest.raises(ValueError, match=r"b.jsonl, line 2: no string 'text' field"):
        calib_data.load_text(str(jl), "all")
    jl.write_text(json.dumps({"text": "fine"}) + "\n\n{oops\n")
    with pytest.raises(ValueError, match=r"b.jsonl, line 3: not JSON"):
        calib_data.load_text(str(jl), "all")


def test_gensim_corpus_names_its_fix_when_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calib_data, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(calib_data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip download --no-deps gensim==4.3.3"):
        calib_data.load_text("lee")


def test_token_windows_are_spread_and_sized(tiny_tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    text = calib_data.load_text("pydoc")
    w = calib_data.token_windows(tok, text, 5, 64)
    assert w.shape == (5, 64)
    assert len({tuple(r) for r in w.tolist()}) == 5
    with pytest.raises(ValueError, match="fewer than calib_seqlen"):
        calib_data.token_windows(tok, "short", 1, 64)
