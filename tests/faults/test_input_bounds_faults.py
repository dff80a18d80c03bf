"""Input that costs more than it looks, wherever it enters (issue 57): JSON nested deep (a warm-start
request, a server request's tools or a call's arguments given as JSON strings, a data row's), a completion
request of 100k prompts, an image host that trickles its status line and headers, a huge picture in a small
file checked by the kernel, and an image URL's user name and password. Each is refused by name, by the
one limit that applies everywhere (JSON: nbtrain.contract.jsonbound.MAX_DEPTH; pixels:
contract.images.MAX_IMAGE_PIXELS; a fetch: one deadline), and whatever serves stays up for the next."""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nbtrain.control.jobs.serve import ServerHandle
from tests.faults.test_image_faults import trickle
from tests.faults.test_serve_faults import ASK, assert_answers, call, server  # noqa: F401 - the module's server

DEEP = "[" * 100_000 + "]" * 100_000  # 200 KB of JSON nested 100k deep
PAST_THE_LIMIT = "levels deep, past the 100 levels of arrays and objects nbtrain reads"


# ------------------------------------------------------------------------------ the warm process
def test_a_warm_request_nested_100k_deep_is_refused_and_the_warm_process_forks_the_next(
    tmp_path: Path, warm_processes: Path
) -> None:
    from nbtrain.contract import warmproto
    from nbtrain.control.launch import process, warmclient
    from tests.control.launch.test_warm import wait_ready

    ready = wait_ready()
    body = ('{"argv": ' + DEEP + "}").encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(ready["socket"])
        s.sendall(struct.pack(">I", len(body)) + body)
        s.settimeout(30)
        reply = warmproto.recv_reply(s)
    assert f"nested 100001 {PAST_THE_LIMIT}" in reply["cold"], reply  # refused, and told why
    assert psutil.pid_exists(ready["pid"])  # alive...
    env = {**os.environ, **process.job_env()}
    argv = [sys.executable, "-m", "nbtrain.worker.jobs.preview"]  # no arguments: it exits at once
    with open(tmp_path / "job.log", "ab") as log:
        child = warmclient.try_warm(argv, log_fd=log.fileno(), cwd=tmp_path, env=env, pass_fds=())
    assert isinstance(child, warmclient.WarmChild), child  # ...and forking the next request
    logs = "".join(p.read_text() for p in warm_processes.glob("*.log"))
    assert f"the warm request is nested 100001 {PAST_THE_LIMIT}" in logs


# ---------------------------------------------------------------------------------- the server
DEEP_ARGUMENTS = {
    "role": "assistant",
    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": DEEP}}],
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"tools": [DEEP]}, "tools", f"tools[0] is JSON nested 100000 {PAST_THE_LIMIT}"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]},
            "tools",
            f"tools[0].parameters is JSON nested 100000 {PAST_THE_LIMIT}",
        ),
        (
            {"messages": [ASK, DEEP_ARGUMENTS, {"role": "tool", "content": "1"}]},
            "messages",
            f"messages[1].tool_calls[0].arguments is JSON nested 100000 {PAST_THE_LIMIT}",
        ),
    ],
    ids=["a tool", "a tool's parameters", "a call's arguments"],
)
def test_json_strings_nested_100k_deep_in_tools_or_arguments_get_a_json_400_naming_the_limit(
    server: ServerHandle,  # noqa: F811
    extra: dict,
    param: str,
    says: str,
) -> None:
    status, out, r = call(server, "/chat/completions", {"messages": [ASK], "max_tokens": 2, **extra})
    assert status == 400 and r.getheader("Content-Type") == "application/json", out
    assert out["error"]["param"] == param and says in out["error"]["message"], out
    assert_answers(server)


@pytest.mark.slow
def test_a_completion_request_of_100k_prompts_is_refused_before_tokenizing_them(
    server: ServerHandle,  # noqa: F811
) -> None:
    t = time.monotonic()
    status, out, _ = call(server, "/completions", {"prompt": ["What"] * 100_000, "max_tokens": 1})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded", out
    assert out["error"]["param"] == "prompt"
    assert (
        "the 100000 prompts have 400000 characters, more than that many tokens could hold"
        in out["error"]["message"]
    )
    assert time.monotonic() - t < 10
    # under the characters' bound, over the tokens': refused as they are tokenized, as one chat would be
    status, out, _ = call(server, "/completions", {"prompt": ["What is 2 + 3?"] * 300, "max_tokens": 1})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded", out
    assert "prompts of this request hold more than that together" in out["error"]["message"]
    assert time.monotonic() - t < 20
    assert_answers(server, within=5)


# ------------------------------------------------------------------------------------ the kernel
def test_a_data_row_whose_tool_arguments_are_nested_100k_deep_is_a_data_problem(workdir: Path) -> None:
    from nbtrain.control.prepare import validate

    row = {
        "messages": [
            {"role": "user", "content": "2 + 3?"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": DEEP}}],
            },
            {"role": "tool", "name": "add", "content": "5"},
            {"role": "assistant", "content": "5"},
        ]
    }
    (workdir / "deep.jsonl").write_text(json.dumps(row) + "\n")
    config = "model: ./tiny-llama\nmethod: lora\ndata:\n  train: deep.jsonl\n  format: auto\n"
    problems = [p.message for p in validate(config) if p.path.startswith("data")]
    assert (
        len(problems) == 1
        and f"tool_calls[0].arguments is JSON nested 100000 {PAST_THE_LIMIT}" in problems[0]
    ), problems


# ------------------------------------------------------------------------------------- images
def png(width: int, height: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def test_the_kernel_refuses_a_huge_picture_in_a_small_file_from_its_header_as_the_worker_would(
    tmp_path: Path,
) -> None:
    from nbtrain.control.config.datacheck import DataProblem, check_images

    (tmp_path / "bomb.png").write_bytes(png(12000, 12000))  # 144 megapixels in a file of ~200 KB
    parts = [{"type": "image", "path": "bomb.png"}, {"type": "text", "text": "?"}]
    row = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "a dot"}]}
    before = psutil.Process().memory_info().rss
    with pytest.raises(
        DataProblem, match=r"row 3: the image bomb\.png is 12000 x 12000 pixels, over 50 megapixels"
    ):
        check_images([(3, row)], "messages", None, tmp_path, "data.jsonl")
    assert psutil.Process().memory_info().rss - before < 100 * 2**20  # never decoded (144 MB and more)


@pytest.fixture
def trickling_headers() -> Iterator[str]:
    """An HTTP server on loopback that sends its status line and headers a byte every 0.1 s (for 30 s)."""
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Slow-%d: yes\r\n" % i for i in range(90))
    yield from trickle(b"", head, 0.1)


def test_an_image_host_that_trickles_its_status_line_and_headers_ends_the_fetch_at_its_deadline(
    trickling_headers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.worker import data

    monkeypatch.setenv("NBTRAIN_IMAGE_HOSTS", "127.0.0.1")  # the test's server is on loopback: trusted here
    monkeypatch.setattr(data, "URL_TIMEOUT", 2.0)  # each byte comes well within it; the headers never do
    began = time.monotonic()
    with pytest.raises(data.DataError, match=r"row 4: the image .* took over 2 s to fetch \(0 bytes came\)"):
        data.fetch_image(trickling_headers, "row 4")
    assert time.monotonic() - began < 5


def test_an_image_urls_user_name_and_password_are_in_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.control.config.datacheck import DataProblem, check_images
    from nbtrain.worker import data

    listener = socket.create_server(("127.0.0.1", 0))  # nothing answers: the fetch fails
    port = listener.getsockname()[1]
    listener.close()
    monkeypatch.setenv("NBTRAIN_IMAGE_HOSTS", "127.0.0.1")
    said = []
    for url in (f"http://user:secret@127.0.0.1:{port}/x.png", f"http://user:secret@127.0.0.1:{port}x/x.png"):
        with pytest.raises(data.DataError) as e:
            data.fetch_image(url, "row 1")
        said.append(str(e.value))
    monkeypatch.delenv("NBTRAIN_IMAGE_HOSTS")
    row = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://user:secret@10.1.2.3/a.png"}}]},
                        {"role": "assistant", "content": "a dot"}]}  # fmt: skip
    with pytest.raises(DataProblem) as kernel:
        check_images([(1, row)], "messages", None, tmp_path, "data.jsonl")
    said.append(str(kernel.value))
    assert all("secret" not in s and "user:" not in s for s in said), said
    assert all("http://***@127.0.0.1" in s for s in said[:2]) and "http://***@10.1.2.3/a.png" in said[2], said
    assert "could not be fetched" in said[0] and "10.1.2.3 (10.1.2.3), a private address" in said[2], said


def test_the_panels_preview_makes_no_thumbnail_of_a_huge_picture_and_never_decodes_it(tmp_path: Path) -> None:
    from nbtrain.ui.panel.datapreview import thumbnails

    (tmp_path / "bomb.png").write_bytes(png(12000, 12000))
    (tmp_path / "dot.png").write_bytes(png(32, 32))
    before = psutil.Process().memory_info().rss
    made = thumbnails(["bomb.png", "dot.png"], tmp_path)
    assert len(made) == 1 and made[0].startswith("data:image/png;base64,")  # the small one alone
    assert psutil.Process().memory_info().rss - before < 100 * 2**20  # 144 megapixels never decoded
