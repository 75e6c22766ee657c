"""``hotloop.vl.load_image``: paths, data: URLs, http(s) URLs from a local server, and refusals."""

from __future__ import annotations

import base64
import http.server
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hotloop.vl import ImageFetchPolicy, ImageLoadError, load_image
from hotloop.vl.image import check_public_host

LOCAL_OK = ImageFetchPolicy(allow_private=True, timeout_s=5.0)


def _png(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(images: list[Any]) -> Iterator[str]:
    """A local HTTP server: /ok.png, /big.png (over a small limit), /junk, /redirect, 404 elsewhere."""
    files = {"/ok.png": _png(images[1]), "/big.png": _png(images[0]), "/junk": b"not an image"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/ok.png")
                self.end_headers()
                return
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_pil_path_file_url_and_data_url(tmp_path: Path, images: list[Any]) -> None:
    img = images[1]
    assert load_image(img) is img
    f = tmp_path / "a.png"
    f.write_bytes(_png(img))
    for source in (str(f), f, f.as_uri()):
        assert load_image(source).size == img.size
    data_url = "data:image/png;base64," + base64.b64encode(_png(img)).decode()
    loaded = load_image({"type": "image_url", "image_url": {"url": data_url, "detail": "low"}})
    assert loaded.size == img.size and loaded.convert("RGB").tobytes() == img.convert("RGB").tobytes()
    # a PIL.Image inside an OpenAI-style part, as Python callers write it
    assert load_image({"type": "image_url", "image_url": {"url": img}}) is img
    assert load_image({"type": "image", "image": img}) is img


def test_http_url_with_private_addresses_allowed(server: str, images: list[Any]) -> None:
    assert load_image(server + "/ok.png", LOCAL_OK).size == images[1].size
    assert load_image(server + "/redirect", LOCAL_OK).size == images[1].size


@pytest.mark.parametrize(
    "path,policy,match",
    [
        ("/ok.png", ImageFetchPolicy(), "non-public address 127.0.0.1"),
        ("/missing.png", LOCAL_OK, "HTTP 404"),
        ("/junk", LOCAL_OK, "not a readable image"),
        (
            "/big.png",
            ImageFetchPolicy(allow_private=True, max_bytes=1000),
            "larger than the limit of 1000 bytes",
        ),
    ],
)
def test_http_refusals(server: str, path: str, policy: ImageFetchPolicy, match: str) -> None:
    with pytest.raises(ImageLoadError, match=match) as e:
        load_image(server + path, policy)
    assert e.value.param == "image_url"


@pytest.mark.parametrize("host", ["localhost", "10.1.2.3", "169.254.169.254", "192.168.0.1", "::1"])
def test_non_public_hosts_refused(host: str) -> None:
    with pytest.raises(ImageLoadError, match="non-public"):
        check_public_host(host, 80)


@pytest.mark.parametrize(
    "source,match",
    [
        ("data:image/png;base64,!!!notbase64", "not a readable image|invalid base64"),
        ("data:image/png,rawbytes", "base64"),
        ("/no/such/file.png", "cannot read image file"),
        ("ftp://example.com/a.png", "scheme 'ftp'"),
        (123, "PIL.Image, a path or a URL"),
    ],
)
def test_bad_sources(source: Any, match: str) -> None:
    with pytest.raises(ImageLoadError, match=match):
        load_image(source)


def test_local_files_can_be_refused(tmp_path: Path, images: list[Any]) -> None:
    f = tmp_path / "a.png"
    f.write_bytes(_png(images[1]))
    with pytest.raises(ImageLoadError, match="local image paths are not accepted"):
        load_image(str(f), ImageFetchPolicy(allow_local_files=False))


def _blank_png(w: int, h: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


def test_data_urls_case_space_and_size_limit() -> None:
    """The scheme and ';base64' in any case, surrounding spaces allowed; --image-max-bytes holds for
    data: URLs as for files and URLs (checked before decoding)."""
    b64 = base64.b64encode(_blank_png(8, 8)).decode()
    for url in (f"DATA:image/png;BASE64,{b64}", f"  data:image/png;base64,{b64}\n"):
        assert load_image(url).size == (8, 8)
    big = base64.b64encode(_blank_png(300, 300) + b"\0" * 20000).decode()
    with pytest.raises(ImageLoadError, match="larger than the limit of 10000 bytes"):
        load_image(f"data:image/png;base64,{big}", ImageFetchPolicy(max_bytes=10_000))


def test_slivers_are_refused_before_preprocessing() -> None:
    """A 10000 x 1 PNG is a few hundred bytes, but resized to a 336-pixel short side it would be
    3.4 billion pixels: refused by its aspect ratio, naming the limit; 200:1 itself loads."""
    b64 = base64.b64encode(_blank_png(10000, 1)).decode()
    with pytest.raises(ImageLoadError, match="10000x1.*aspect ratio.*200:1"):
        load_image(f"data:image/png;base64,{b64}")
    assert load_image(f"data:image/png;base64,{base64.b64encode(_blank_png(400, 2)).decode()}").size == (
        400,
        2,
    )


def test_undecodable_bytes_name_no_python_object() -> None:
    with pytest.raises(ImageLoadError, match="not a readable image") as e:
        load_image("data:image/png;base64," + base64.b64encode(b"not an image at all").decode())
    assert "BytesIO" not in str(e.value)
