"""``bench/output.py``: a results path is checked before a benchmark runs, and leaves no file."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotloop.bench.output import check_writable


def test_check_writable(tmp_path: Path) -> None:
    check_writable(None, "--x")
    new = tmp_path / "r.json"
    check_writable(str(new), "--x")
    assert not new.exists()  # the probe is removed
    new.write_text("old")
    check_writable(str(new), "--x")
    assert new.read_text() == "old"  # an existing file is left as it was
    for bad, words in (
        (tmp_path, "is a folder"),
        (tmp_path / "missing" / "r.json", "does not exist"),
        (Path("/proc/self/r.json"), "cannot write there"),
    ):
        with pytest.raises(ValueError, match=f"--result-file {bad}: .*{words}"):
            check_writable(str(bad), "--result-file")
