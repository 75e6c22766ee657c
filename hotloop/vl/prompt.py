"""Prompts with images as users write them, reduced to (text or text-only messages, images).

Accepted: ``(text, image)``, ``(text, [images])``, ``(messages, images)``, and OpenAI message lists
whose ``content`` holds ``{"type": "text"}`` and ``{"type": "image_url"}`` (or ``"image"``) parts.
An image part becomes the model's placeholder (e.g. ``<image>``) followed by a newline where it
stands; a ``(text, images)`` prompt without placeholders gets them in front of the text.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hotloop.messages import RequestError
from hotloop.vl.image import is_image

Message = dict[str, Any]
IMAGE_PART_TYPES = ("image_url", "image")


@dataclass
class VLPrompt:
    """A text prompt or message list, and the images it refers to in order."""

    prompt: str | list[Message]
    images: list[Any]


def _is_image_source(obj: Any, strings_are_images: bool) -> bool:
    if is_image(obj) or isinstance(obj, os.PathLike):
        return True
    if isinstance(obj, dict):
        return obj.get("type") in IMAGE_PART_TYPES or "url" in obj
    return strings_are_images and isinstance(obj, str)


def is_vl_prompt(p: Any, strings_are_images: bool = True) -> bool:
    """``(text_or_messages, image_or_images)`` tuples (a tuple, so a list of strings stays a batch).

    A path or URL given as a plain string counts as an image only with ``strings_are_images`` (for a
    text model ``("a", "b")`` is two prompts).
    """
    if not isinstance(p, tuple) or len(p) != 2:
        return False
    first, second = p
    if not isinstance(first, (str, list)):
        return False
    if isinstance(second, (list, tuple)):
        return all(_is_image_source(x, strings_are_images) for x in second)
    return _is_image_source(second, strings_are_images)


def to_vl_prompt(p: tuple[Any, Any]) -> VLPrompt:
    prompt, images = p
    imgs = list(images) if isinstance(images, (list, tuple)) else [images]
    return VLPrompt(prompt if isinstance(prompt, str) else list(prompt), imgs)


def messages_have_images(messages: Sequence[Message]) -> bool:
    return any(
        isinstance(m.get("content"), list)
        and any(isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES for part in m["content"])
        for m in messages
    )


def _part_image(part: dict[str, Any]) -> Any:
    value = part.get(part["type"])
    if value is None:
        raise RequestError(f"a {part['type']!r} content part has no {part['type']!r} field", "messages")
    return value


def flatten_messages(messages: Sequence[Message], placeholder: str) -> tuple[list[Message], list[Any]]:
    """Messages whose list contents become strings, and the images in order of appearance: each
    image part becomes ``placeholder`` and the parts are joined by newlines, as the server's
    ``chat.message_dicts`` does (a pipeline call and a request give the same prompt)."""
    out: list[Message] = []
    images: list[Any] = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            out.append(dict(m))
            continue
        text = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                text.append(str(part.get("text", "")))
            elif kind in IMAGE_PART_TYPES:
                images.append(_part_image(part))
                text.append(placeholder)
            else:
                raise RequestError(f"unsupported message content part type {kind!r}", "messages")
        out.append({**m, "content": "\n".join(text)})
    return out, images


def place_images(text: str, num_images: int, placeholder: str, marker: str | None = None) -> str:
    """``text`` with one placeholder per image in front of it, unless it already places images:
    it holds ``marker`` (the image token itself, e.g. Qwen2-VL's bare ``<|image_pad|>``, which
    transformers' processor accepts as well as the full ``<|vision_start|>..<|vision_end|>``
    placeholder), or the placeholder when no marker is given."""
    if num_images == 0 or (marker or placeholder) in text:
        return text
    return (placeholder + "\n") * num_images + text


def attach_images(
    prompt: VLPrompt, placeholder: str, marker: str | None = None
) -> tuple[str | list[Message], list[Any]]:
    """A ``VLPrompt`` -> (text or flattened messages with placeholders, all images in order)."""
    if isinstance(prompt.prompt, str):
        return place_images(prompt.prompt, len(prompt.images), placeholder, marker), list(prompt.images)
    messages, found = flatten_messages(prompt.prompt, placeholder)
    if prompt.images:  # extra images join the last user message
        for m in reversed(messages):
            if m.get("role") == "user":
                m["content"] = place_images(
                    str(m.get("content", "")), len(prompt.images), placeholder, marker
                )
                break
        else:
            raise RequestError("images were given but the messages have no user message", "messages")
    return messages, found + list(prompt.images)
