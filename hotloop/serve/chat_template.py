"""Chat messages -> prompt token ids, the same way ``Pipeline.encode`` does it.

The template renders to text (``tokenize=False``) which is then encoded without adding special
tokens, because the template already writes them. Imports nothing of hotloop, so it can move to a
lower layer and serve the pipeline too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (no template, or the template raised)."""


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a path to a Jinja file, or the template text itself."""
    if not value:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text()
    if "{%" in value or "{{" in value:
        return value
    raise FileNotFoundError(f"--chat-template {value!r}: no such file (and it is not a Jinja template)")


def has_chat_template(tokenizer: Any, chat_template: str | None = None) -> bool:
    return bool(chat_template or getattr(tokenizer, "chat_template", None))


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


def encode_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Render ``messages`` with the chat template and encode the text."""
    if not has_chat_template(tokenizer, chat_template):
        raise ChatTemplateError(
            "this model has no chat template, so messages cannot be formatted; start the server with "
            "--chat-template, or use /v1/completions with a plain prompt"
        )
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, chat_template=chat_template
        )
    except Exception as e:  # jinja raises TemplateError subclasses, and templates raise their own
        raise ChatTemplateError(f"the chat template could not render these messages: {e}") from e
    problem = unicode_error(text, "messages")
    if problem is not None:
        raise ChatTemplateError(problem)
    return list(tokenizer.encode(text, add_special_tokens=False))
