"""Loading images from what users pass: a ``PIL.Image``, a local path, an http(s) URL or a ``data:`` URL.

URL fetching is bounded (timeout, byte limit) and by default refuses hosts that resolve to
addresses that are not public (loopback, private, link-local, ...), so a server cannot be used to
probe its own network. Every failure is an ``ImageLoadError`` (a ``RequestError``) naming the problem.
"""

from __future__ import annotations

import base64
import binascii
import io
import ipaddress
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from hotloop.messages import RequestError

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_BYTES = 20 * 2**20
MAX_PIXELS = 64 * 2**20  # refuse decompression bombs before decoding them
# refuse slivers: a processor resizes the short side up to its input size, so a 100000 x 1 image
# (a few hundred bytes) would become gigabytes of pixels; Qwen2-VL's own limit is 200
MAX_ASPECT_RATIO = 200


class ImageLoadError(RequestError):
    """An image could not be read; the message says which and why."""

    def __init__(self, message: str, param: str = "image_url") -> None:
        super().__init__(message, param)


@dataclass(frozen=True, slots=True)
class ImageFetchPolicy:
    """Limits for fetching images from URLs (one place that the API and the server share)."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    max_bytes: int = DEFAULT_MAX_BYTES
    allow_private: bool = False
    allow_local_files: bool = True


DEFAULT_POLICY = ImageFetchPolicy()


def is_image(obj: Any) -> bool:
    """Whether ``obj`` is a ``PIL.Image.Image``."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        return False
    return isinstance(obj, Image.Image)


def load_image(source: Any, policy: ImageFetchPolicy = DEFAULT_POLICY) -> Any:
    """A decoded ``PIL.Image`` (RGB conversion is left to the model's processor).

    ``source``: a ``PIL.Image``, a path, ``file://``/``http(s)://``/``data:image/...;base64,`` URL,
    or an OpenAI ``{"url": ...}`` / ``{"type": "image_url", "image_url": {...}}`` part.
    """
    if is_image(source):
        return source
    if isinstance(source, dict):
        inner = source.get("image_url", source.get("image", source))
        source = inner.get("url") if isinstance(inner, dict) else inner
        if is_image(source):  # a PIL.Image in an OpenAI-style part (Python callers)
            return source
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source.strip():
        raise ImageLoadError(f"an image must be a PIL.Image, a path or a URL, not {type(source).__name__}")
    source = source.strip()
    if source[:5].lower() == "data:":
        return _decode(_data_url_bytes(source, policy), "the data: URL")
    scheme = urllib.parse.urlsplit(source).scheme.lower()
    if scheme in ("http", "https"):
        return _decode(fetch_url(source, policy), _short(source))
    if scheme == "file":
        source = urllib.request.url2pathname(urllib.parse.urlsplit(source).path)
    elif scheme and len(scheme) > 1:  # "c:" is a Windows drive, not a scheme
        raise ImageLoadError(
            f"image URL scheme {scheme!r} is not supported (use http, https, data or a path)"
        )
    if not policy.allow_local_files:
        raise ImageLoadError("local image paths are not accepted here; send the image as a URL or base64")
    try:
        with open(source, "rb") as f:
            data = f.read(policy.max_bytes + 1)
    except OSError as e:
        raise ImageLoadError(f"cannot read image file {source!r}: {e.strerror or e}") from None
    _check_size(len(data), policy, source)
    return _decode(data, source)


def _short(url: str) -> str:
    return url if len(url) <= 100 else url[:97] + "..."


def _check_size(n: int, policy: ImageFetchPolicy, what: str) -> None:
    if n > policy.max_bytes:
        raise ImageLoadError(f"image {_short(what)} is larger than the limit of {policy.max_bytes} bytes")


def _data_url_bytes(url: str, policy: ImageFetchPolicy = DEFAULT_POLICY) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep:
        raise ImageLoadError("malformed data: URL (expected 'data:image/...;base64,<data>')")
    if not header.lower().endswith(";base64"):
        raise ImageLoadError("data: URLs must be base64 encoded (';base64,')")
    # before decoding: base64 decodes to at most 3 bytes per 4 characters
    _check_size(len(payload) // 4 * 3, policy, "the data: URL")
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError) as e:
        raise ImageLoadError(f"the data: URL holds invalid base64: {e}") from None


def _decode(data: bytes, what: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
        if img.width * img.height > MAX_PIXELS:
            raise ImageLoadError(f"image {what} has {img.width}x{img.height} pixels, over {MAX_PIXELS}")
        if max(img.width, img.height) > MAX_ASPECT_RATIO * max(1, min(img.width, img.height)):
            raise ImageLoadError(
                f"image {what} is {img.width}x{img.height}: its aspect ratio is over the limit of "
                f"{MAX_ASPECT_RATIO}:1"
            )
        img.load()
    except UnidentifiedImageError:
        raise ImageLoadError(
            f"cannot decode image {what}: not a readable image (PNG, JPEG, GIF, WebP, BMP, ...)"
        ) from None
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        if isinstance(e, ImageLoadError):
            raise
        raise ImageLoadError(f"cannot decode image {what}: not a readable image ({e})") from None
    return img


def check_public_host(host: str, port: int | None) -> None:
    """Raise ``ImageLoadError`` unless every address ``host`` resolves to is public."""
    try:
        infos = socket.getaddrinfo(host, port or 80, proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise ImageLoadError(f"cannot resolve image host {host!r}: {e}") from None
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not addr.is_global or addr.is_multicast:
            raise ImageLoadError(
                f"image host {host!r} resolves to the non-public address {addr}; "
                "fetching from private, loopback or link-local addresses is disabled "
                "(allow_private / --allow-private-image-urls enables it)"
            )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by ``fetch_url`` itself, so each hop's host is checked."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def fetch_url(url: str, policy: ImageFetchPolicy = DEFAULT_POLICY, max_redirects: int = 5) -> bytes:
    """GET ``url`` within the policy's timeout and byte limit; each redirect hop is checked too."""
    opener = urllib.request.build_opener(_NoRedirect)
    for _ in range(max_redirects + 1):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ImageLoadError(f"image URL {_short(url)!r} is not an http(s) URL")
        if not policy.allow_private:
            check_public_host(parts.hostname, parts.port)
        req = urllib.request.Request(url, headers={"User-Agent": "hotloop-image-fetch"})
        try:
            with opener.open(req, timeout=policy.timeout_s) as resp:
                length = resp.headers.get("Content-Length")
                if length is not None and length.isdigit():
                    _check_size(int(length), policy, url)
                data = resp.read(policy.max_bytes + 1)
                _check_size(len(data), policy, url)
                return bytes(data)
        except urllib.error.HTTPError as e:
            if e.code in (301, 302, 303, 307, 308) and e.headers.get("Location"):
                url = urllib.parse.urljoin(url, e.headers["Location"])
                continue
            raise ImageLoadError(f"fetching image {_short(url)} failed: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ImageLoadError(f"fetching image {_short(url)} failed: {reason}") from None
    raise ImageLoadError(f"image URL {_short(url)} redirected more than {max_redirects} times")
