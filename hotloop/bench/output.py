"""Where a benchmark writes its results: checked before the benchmark runs, not after."""

from __future__ import annotations

from pathlib import Path


def check_writable(path: str | None, flag: str) -> None:
    """Raise ``ValueError`` naming ``flag`` when ``path`` (a results file) cannot be written: its
    folder is missing, it is a folder, or the filesystem refuses it. Leaves no file behind."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path}: is a folder; give a file name")
    if not p.parent.is_dir():
        raise ValueError(f"{flag} {path}: the folder {p.parent} does not exist")
    existed = p.exists()
    try:
        with p.open("a"):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    if not existed:
        p.unlink()
