"""Checks on user text shared by the Python API and the server (no layer above ``utils``)."""

from __future__ import annotations


def unicode_error(text: str, param: str) -> str | None:
    """Why ``text`` cannot be tokenized, or None: a lone UTF-16 surrogate (a JSON string cut inside
    an emoji by a UTF-16 client) has no UTF-8 form."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"{param} is not valid Unicode: an unpaired UTF-16 surrogate (U+{ord(text[e.start]):04X}) at "
            f"character {e.start}; send whole characters"
        )
    return None
