"""Calibration and held-out text: where it comes from and how it becomes token windows.

``pydoc`` (Python's own ``pydoc_data`` topics, no install) is the default. ``lee`` and
``wikipedia`` are gensim's test corpora: install gensim, or extract its wheel's
``gensim/test/test_data`` files into ``$HOTLOOP_CACHE/datasets/gensim``. Any other value is a path
to a ``.txt`` file or a ``.jsonl`` file (a ``text`` field per line). The last 10% of every text is
held out (``split='heldout'``) for perplexity checks and never used for calibration.
"""

from __future__ import annotations

import bz2
import html
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import torch

from hotloop.utils.env import cache_dir

DATASETS = ("pydoc", "lee", "wikipedia")
SPLITS = ("calib", "heldout", "all")
HELDOUT_FRACTION = 0.1
_GENSIM_FILES = {"lee": "lee_background.cor", "wikipedia": "enwiki-latest-pages-articles1.xml*.bz2"}


def load_text(dataset: str, split: str = "calib") -> str:
    """The text of ``dataset`` (a name in ``DATASETS`` or a file path), cut to ``split``."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} must be one of {SPLITS}")
    text = _read_dataset(dataset)
    if not text.strip():
        raise ValueError(f"--calib-dataset {dataset!r} holds no text; pass a file with some")
    cut = int(len(text) * (1 - HELDOUT_FRACTION))
    if split == "calib":
        return text[:cut]
    if split == "heldout":
        return text[cut:]
    return text


def _read_dataset(dataset: str) -> str:
    if dataset == "pydoc":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k] for k in sorted(topics))
    if dataset in _GENSIM_FILES:
        path = _gensim_file(dataset)
        if dataset == "lee":
            return path.read_text(encoding="utf-8", errors="replace")
        with bz2.open(path, "rt", encoding="utf-8", errors="replace") as f:
            return _strip_wiki_markup(f.read())
    path = Path(dataset)
    if not path.is_file():
        raise ValueError(
            f"--calib-dataset {dataset!r} is neither one of {DATASETS} nor a path to a .txt/.jsonl file"
        )
    try:  # (an unreadable file, or a .jsonl that is not UTF-8, as JSON must be)
        raw = path.read_text(encoding="utf-8", errors="strict" if path.suffix == ".jsonl" else "replace")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"--calib-dataset {dataset!r}: cannot read it ({why})") from None
    if path.suffix == ".jsonl":
        texts = []
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    texts.append(_jsonl_text(line))
                except ValueError as e:
                    raise ValueError(f"--calib-dataset {dataset}, line {n}: {e}") from None
        return "\n\n".join(texts)
    return raw


def _gensim_file(dataset: str) -> Path:
    pattern = _GENSIM_FILES[dataset]
    roots = [cache_dir() / "datasets" / "gensim"]
    spec = importlib.util.find_spec("gensim")  # located, never imported
    if spec is not None and spec.submodule_search_locations:
        roots.insert(0, Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data")
    for root in roots:
        found = sorted(root.glob(pattern))
        if found:
            return found[0]
    raise ValueError(
        f"--calib-dataset {dataset}: {pattern} not found in {[str(r) for r in roots]}. Either "
        "`pip install gensim==4.3.3`, or `pip download --no-deps gensim==4.3.3 -d /tmp/g` and unzip "
        f"'gensim/test/test_data/{pattern}' from the wheel into {roots[-1]}"
    )


def _jsonl_text(line: str) -> str:
    """One JSONL line's text: a JSON string, or an object's string ``text`` field."""
    try:
        item: Any = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at column {e.colno}): {line[:80]!r}") from None
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return str(item["text"])
    raise ValueError(f"no string 'text' field (one JSON object with a 'text' per line): {line[:80]!r}")


def _strip_wiki_markup(xml: str) -> str:
    """Article bodies of a MediaWiki XML dump, with templates, links and tags reduced to words."""
    bodies = re.findall(r"<text[^>]*>(.*?)</text>", xml, flags=re.S)
    text = html.unescape("\n\n".join(b for b in bodies if not b.startswith("#REDIRECT")))
    text = re.sub(r"<ref[^>]*>.*?</ref>|<[^>]+>", "", text, flags=re.S)
    text = re.sub(r"\{\{[^{}]*\}\}", "", text)
    text = re.sub(r"\[\[(?:[^\]|]*\|)?([^\]]*)\]\]", r"\1", text)
    text = re.sub(r"'''?|==+", "", text)
    return re.sub(r"\n{3,}", "\n\n", text)


def token_windows(tokenizer: Any, text: str, num_samples: int, seqlen: int) -> torch.Tensor:
    """``num_samples`` windows of ``seqlen`` token ids ``[N, L]``, spread evenly over ``text``."""
    if num_samples < 1 or seqlen < 2:
        raise ValueError(f"need calib_samples >= 1 and calib_seqlen >= 2; got {num_samples}, {seqlen}")
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)
    if ids.numel() < seqlen:
        raise ValueError(f"the text has {ids.numel()} tokens, fewer than calib_seqlen={seqlen}")
    last = ids.numel() - seqlen
    starts = torch.linspace(0, last, num_samples).round().long()
    return torch.stack([ids[s : s + seqlen] for s in starts.tolist()])
