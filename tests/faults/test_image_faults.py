"""Images that cost more than they look (issue 36): a small file of a huge picture, a request of many, a
FIFO named as an image, an image URL whose server trickles its bytes, and image URLs that point at this
machine or its network (refused in the kernel for the sampled rows and by the worker before each fetch and
redirect). Each is refused from what it
says of itself (its header, its kind of file, the time the fetch has taken), before it costs memory or
holds a process for ever."""

from __future__ import annotations

import base64
import io
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

PIL = pytest.importorskip("PIL")


def png(width: int, height: int) -> bytes:
    """A one-colour PNG: a few kB on disk, ``width * height * 3`` bytes once decoded to RGB."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_a_small_file_of_a_huge_picture_is_refused_from_its_header(tmp_path: Path) -> None:
    from nbtrain.worker.serve.images import request_image
    from nbtrain.worker.serve.request import RequestError

    bomb = png(12000, 12000)
    assert len(bomb) < 200_000  # what crosses the wire is small
    before = psutil.Process().memory_info().rss
    with pytest.raises(RequestError, match=r"12000 x 12000 \(144 megapixels\); at most 50 megapixels per"):
        request_image(data_uri(bomb), "messages[0].content[0]")
    assert psutil.Process().memory_info().rss - before < 100 * 2**20  # never decoded (it would be 432 MB)
    (tmp_path / "bomb.png").write_bytes(bomb)
    with pytest.raises(RequestError, match="144 megapixels"):
        request_image((tmp_path / "bomb.png").as_uri(), "messages[0].content[1]")


def test_a_request_of_many_big_pictures_is_refused_past_its_total(tmp_path: Path) -> None:
    from nbtrain.worker.serve.images import content_parts
    from nbtrain.worker.serve.request import RequestError

    big = data_uri(png(6000, 6000))  # 36 megapixels: allowed alone, and twice
    content = [{"type": "image_url", "image_url": {"url": big}} for _ in range(8)]
    images: list[object] = []
    with pytest.raises(RequestError, match=r"content\[2\].*at most 28 megapixels left for this request"):
        content_parts(content, "messages[0]", images)
    assert len(images) == 2


def test_a_fifo_named_as_an_image_is_refused_at_once(tmp_path: Path) -> None:
    from nbtrain.worker.serve.images import request_image
    from nbtrain.worker.serve.request import RequestError

    fifo = tmp_path / "image.png"
    os.mkfifo(fifo)
    began = time.monotonic()
    with pytest.raises(RequestError, match="is not a regular file"):
        request_image(fifo.as_uri(), "messages[0].content[0]")
    assert time.monotonic() - began < 5


def test_a_huge_picture_in_the_data_is_refused_naming_the_row(tmp_path: Path) -> None:
    from nbtrain.worker.data import DataError, image_entry

    (tmp_path / "bomb.png").write_bytes(png(12000, 12000))
    with pytest.raises(DataError, match=r"row 7: the image .*12000 x 12000 pixels, over 50 megapixels"):
        image_entry("bomb.png", str(tmp_path), "row 7")


def trickle(head: bytes, trickled: bytes, every: float, most: float = 30.0) -> Iterator[str]:
    """An HTTP server on loopback for one request: ``head`` at once, then ``trickled`` a byte every
    ``every`` s (for ``most`` s at the longest); yields its URL."""
    srv = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(head)
            stop = time.monotonic() + most
            for byte in trickled:
                if done.is_set() or time.monotonic() > stop:
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(every)

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/slow.png"
    done.set()
    srv.close()


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """An HTTP server on loopback that sends its headers, then one byte of the body every 0.2 s."""
    yield from trickle(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n",
                       b"\x00" * 100000, 0.2)  # fmt: skip


def test_an_image_url_that_trickles_ends_the_fetch_at_its_deadline(
    trickling_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.worker import data

    monkeypatch.setenv("NBTRAIN_IMAGE_HOSTS", "127.0.0.1")  # the test's server is on loopback: trusted here
    monkeypatch.setattr(data, "URL_TIMEOUT", 2.0)  # each byte comes well within it; the whole never does
    began = time.monotonic()
    with pytest.raises(data.DataError, match=r"row 3: the image .* took over 2 s to fetch"):
        data.fetch_image(trickling_server, "row 3")
    assert time.monotonic() - began < 6


VISION_ROW = {"messages": [
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "URL"}},
                                 {"type": "text", "text": "?"}]},
    {"role": "assistant", "content": "a dot"},
]}  # fmt: skip


def row_with(url: str) -> dict:
    import json

    return json.loads(json.dumps(VISION_ROW).replace('"URL"', json.dumps(url)))


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9/a.png", "http://localhost/a.png", "http://169.254.169.254/latest/meta-data",
     "http://[::1]:8080/a.png", "http://10.1.2.3/a.png"],
)  # fmt: skip
def test_an_image_url_of_a_host_that_is_not_public_is_refused_in_the_kernel_naming_the_row(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.control.config.datacheck import DataProblem, check_images

    monkeypatch.delenv("NBTRAIN_IMAGE_HOSTS", raising=False)
    refused = r"data.jsonl: row 5: the image .* address, and nbtrain fetches images from public hosts only"
    with pytest.raises(DataProblem, match=refused + r"; .*NBTRAIN_IMAGE_HOSTS"):
        check_images([(5, row_with(url))], "messages", None, tmp_path, "data.jsonl")
    host = url.split("/")[2].rsplit(":", 1)[0] if "[" not in url else "::1"
    monkeypatch.setenv("NBTRAIN_IMAGE_HOSTS", f"example.org, {host}")  # a host you trust is fetched
    assert check_images([(5, row_with(url))], "messages", None, tmp_path, "data.jsonl") == (1, 1)


@pytest.fixture
def image_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on loopback: /redirect sends the client to the same server by the name localhost,
    anything else is a PNG. Yields its base URL and the paths asked for."""
    import http.server

    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/a.png")
                self.end_headers()
                return
            body = png(4, 4)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", asked
    srv.shutdown()
    srv.server_close()


def test_the_worker_fetches_no_loopback_image_and_follows_no_redirect_to_one(
    image_server: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.worker import data

    base, asked = image_server
    monkeypatch.delenv("NBTRAIN_IMAGE_HOSTS", raising=False)
    with pytest.raises(data.DataError, match=r"row 2: the image .* a loopback address"):
        data.fetch_image(f"{base}/a.png", "row 2")
    assert asked == []  # refused before it connected
    monkeypatch.setenv("NBTRAIN_IMAGE_HOSTS", "127.0.0.1")  # this address is trusted; localhost is not
    assert data.fetch_image(f"{base}/a.png", "row 2") == png(4, 4)
    with pytest.raises(data.DataError, match=r"row 2: the image .*/redirect redirects to http://localhost:"):
        data.fetch_image(f"{base}/redirect", "row 2")
    assert asked == ["/a.png", "/redirect"]  # the redirect's target was never asked for
