"""Chat messages -> prompt token ids, the same way ``Pipeline.encode`` does it.

The template renders to text (``tokenize=False``) which is then encoded without adding special
tokens, because the template already writes them. Imports nothing of hotloop, so it can move to a
lower layer and serve the pipeline too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hotloop.utils.text import unicode_error


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (no template, or the template raised)."""


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a path to a Jinja file, or the template text itself. The text must be a
    Jinja template that compiles: LMDeploy's JSON chat-template configs and plain text (which would
    render as the whole prompt, dropping the messages) are refused, as are syntax errors (which
    would otherwise surface at the first chat request, as the client's 400)."""
    if not value:
        return None
    path = Path(value)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"--chat-template {value!r}: not a UTF-8 text file ({e.reason} at byte {e.start})"
            ) from None
        where = f"--chat-template {value!r}"
    elif "{%" in value or "{{" in value:
        text, where = value, "--chat-template (template text)"
    else:
        raise FileNotFoundError(f"--chat-template {value!r}: no such file (and it is not a Jinja template)")
    check_template_text(text, where)
    return text


def check_template_text(text: str, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` unless ``text`` is a Jinja template that compiles."""
    import json

    try:
        as_json = json.loads(text)
    except ValueError:
        as_json = None
    if isinstance(as_json, dict):
        raise ValueError(
            f"{where} is a JSON chat-template config (LMDeploy's format), which hotloop does not read: pass "
            "a Jinja chat template (the chat_template of a tokenizer_config.json), or leave the flag out "
            "to use the model's own"
        )
    if "{%" not in text and "{{" not in text:
        raise ValueError(
            f"{where} holds no Jinja tags ({{% %}} or {{{{ }}}}): as a template it would render the same "
            "text for every conversation; pass a Jinja chat template"
        )
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:  # (transformers renders with this environment and the loopcontrols extension)
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"{where}: Jinja syntax error at line {e.lineno}: {e.message}") from None


def has_chat_template(tokenizer: Any, chat_template: str | None = None) -> bool:
    return bool(chat_template or getattr(tokenizer, "chat_template", None))


def encode_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Render ``messages`` (and ``tools``, OpenAI's function definitions, for templates that take
    them) with the chat template and encode the text."""
    if not has_chat_template(tokenizer, chat_template):
        raise ChatTemplateError(
            "this model has no chat template, so messages cannot be formatted; start the server with "
            "--chat-template, or use /v1/completions with a plain prompt"
        )
    try:
        extra = {"tools": tools} if tools else {}
        text = tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            chat_template=chat_template,
            **extra,
        )
    except Exception as e:  # jinja raises TemplateError subclasses, and templates raise their own
        raise ChatTemplateError(f"the chat template could not render these messages: {e}") from e
    problem = unicode_error(text, "messages")
    if problem is not None:
        raise ChatTemplateError(problem)
    return list(tokenizer.encode(text, add_special_tokens=False))
