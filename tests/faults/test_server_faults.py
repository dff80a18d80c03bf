"""The Jupyter server extension against run directories that hold traps: a FIFO where a log or launch.json
belongs, a metrics file linked to /etc/passwd, a run directory that is a link, a 50 MB metrics file that
is one line with no end. Every route answers at once (a 409 naming the file, or the run marked in the
listing), nothing outside the run is served, and the server keeps answering the healthy run.

Driven through a real Jupyter server (pytest-jupyter, the fixtures of tests/ui/server); the run
directories are written by hand, no training. The tests are plain functions that run their requests on
the fixtures' loop: pytest-jupyter's async hooks apply only under tests/ui/server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tests.ui.server.conftest import *  # noqa: F403 - the server fixtures, with the shipped extension config
from tests.ui.server.fakes import make_run

Fetch = Any  # pytest-jupyter's jp_fetch factory (untyped)
QUICK_S = 5.0  # every answer comes well within this (a blocked read would never come back at all)
HUGE = 50 << 20


@pytest.fixture
def traps(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Registered runs: ok-1 (healthy), fifo-1 (FIFO rank0.log and launch.json), link-1 (metrics.jsonl ->
    /etc/passwd), huge-1 (one 50 MB line, no newline), dirlink-1 (the run directory is a link)."""
    ok = make_run("ok-1", state="running", step=3, losses=(2.0, 1.5))
    fifo = make_run("fifo-1", state="running")
    for p in (fifo.rank_log(0), fifo.launch):
        p.unlink(missing_ok=True)
        os.mkfifo(p)
    link = make_run("link-1", losses=(1.0,))
    link.metrics.unlink()
    link.metrics.symlink_to("/etc/passwd")
    huge = make_run("huge-1")
    with open(huge.metrics, "ab") as f:
        f.write(b'{"step": 1, "pad": "' + b"x" * HUGE)
    moved = make_run("dirlink-1", losses=(9.0,))
    outside = tmp_path / "outside" / "dirlink-1"
    outside.parent.mkdir()
    shutil.move(moved.root, outside)
    moved.root.symlink_to(outside)
    yield {"ok": ok.root, "fifo": fifo.root, "link": link.root, "huge": huge.root, "dirlink": moved.root}
    # Were a reader ever blocked on a FIFO (a regression), opening it for writing and closing it frees that
    # thread, so the test fails instead of the process hanging at exit.
    for p in (fifo.rank_log(0), fifo.launch):
        with contextlib.suppress(OSError):
            os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
    huge.metrics.unlink()  # 50 MB less left behind in the kept temp directories


def run(loop: asyncio.AbstractEventLoop, fn: Callable[[], Awaitable[Any]]) -> Any:
    return loop.run_until_complete(fn())


async def timed(jp_fetch: Fetch, *parts: str, **kw: Any) -> tuple[int, Any, float]:
    """(status code, JSON body, seconds) of one request; an error status is returned, not raised."""
    t0 = time.monotonic()
    try:
        resp = await jp_fetch("nbtrain", *parts, request_timeout=20, **kw)
        code, body = resp.code, resp.body
    except HTTPClientError as e:
        assert e.response is not None, f"no answer to {parts}: {e}"  # 599: timed out, the server is wedged
        code, body = e.code, e.response.body
    return code, json.loads(body) if body else None, time.monotonic() - t0


def test_trap_files_get_a_quick_clear_error_and_nothing_outside_the_run_is_served(
    jp_fetch: Fetch, jp_asyncio_loop: asyncio.AbstractEventLoop, traps: dict[str, Path]
) -> None:
    async def go() -> None:
        code, runs, took = await timed(jp_fetch, "runs")
        assert code == 200 and took < QUICK_S
        by_id = {r["id"]: r for r in runs}
        assert set(by_id) == {"ok-1", "fifo-1", "link-1", "huge-1", "dirlink-1"}  # one bad run breaks none
        assert (by_id["ok-1"]["loss"], by_id["ok-1"]["problems"]) == (1.5, [])
        assert by_id["fifo-1"]["error"]["type"] == "unreadable"
        assert "launch.json is a FIFO (named pipe)" in by_id["fifo-1"]["error"]["message"]
        assert by_id["link-1"]["loss"] is None
        assert "metrics.jsonl is a symbolic link" in by_id["link-1"]["problems"][0]
        assert "is a symbolic link" in by_id["dirlink-1"]["error"]["message"]
        assert by_id["dirlink-1"]["loss"] is None  # its metrics were not read through the link
        assert "root:" not in json.dumps(runs)

        for parts, says in [
            (("runs", "fifo-1", "logs"), "rank0.log is a FIFO (named pipe)"),
            (("runs", "fifo-1"), "launch.json is a FIFO (named pipe)"),
            (("runs", "link-1", "metrics"), "metrics.jsonl is a symbolic link"),
            (("runs", "dirlink-1"), "the run directory"),
            (("runs", "dirlink-1", "metrics"), "is a symbolic link"),
            (("runs", "dirlink-1", "logs"), "is a symbolic link"),
        ]:
            code, body, took = await timed(jp_fetch, *parts)
            assert code == 409 and took < QUICK_S, (parts, code, took)
            message = body["message"]
            assert says in message and ("remove it" in message or "move the run directory" in message)
            assert "root:" not in json.dumps(body)

        # link-1's log and status are regular files: they are still served
        code, logs, _ = await timed(jp_fetch, "runs", "link-1", "logs", params={"n": 1})
        assert (code, logs["text"]) == (200, "line 99")

    run(jp_asyncio_loop, go)


def test_a_huge_line_is_gone_through_in_bounded_requests_while_the_server_keeps_answering(
    jp_fetch: Fetch, jp_asyncio_loop: asyncio.AbstractEventLoop, traps: dict[str, Path]
) -> None:
    from nbtrain.ui.server.handlers import MAX_READ_BYTES

    async def go() -> None:
        # The trap requests at once, with the healthy run asked for meanwhile: all answered, none waits
        # on another (a FIFO read would hold a pool thread forever, a whole-line read the loss trail's lock).
        t0 = time.monotonic()
        answers = await asyncio.gather(
            timed(jp_fetch, "runs", "fifo-1", "logs"),
            timed(jp_fetch, "runs", "huge-1", "metrics"),
            timed(jp_fetch, "runs"),
            timed(jp_fetch, "runs", "link-1", "metrics"),
            timed(jp_fetch, "runs", "ok-1", "metrics"),
        )
        assert time.monotonic() - t0 < 2 * QUICK_S
        assert [code for code, _, _ in answers] == [409, 200, 200, 409, 200]
        assert [r["loss"] for r in answers[4][1]["records"]] == [2.0, 1.5]

        first = answers[1][1]
        assert first["records"] == [] and first["skipped"] == 1 and first["caught_up"] is False
        assert first["offset"] <= MAX_READ_BYTES + (1 << 20)  # this request read a budget, not 50 MB
        offset, requests = first["offset"], 1
        while True:  # the client goes on from each offset: every request reads only bytes not yet read
            code, got, took = await timed(jp_fetch, "runs", "huge-1", "metrics", params={"offset": offset})
            requests += 1
            assert code == 200 and took < QUICK_S and got["records"] == [] and got["offset"] > offset
            offset = got["offset"]
            if got["caught_up"]:
                break
        assert requests >= 3
        size = (traps["huge"] / "metrics.jsonl").stat().st_size
        assert offset == size  # past the skipped line's bytes: a later poll reads none of them again

        with open(traps["huge"] / "metrics.jsonl", "ab") as f:  # the line ends; training logs on
            f.write(b'"}\n{"step": 2, "loss": 0.5}\n')
        code, got, took = await timed(jp_fetch, "runs", "huge-1", "metrics", params={"offset": offset})
        assert (code, got["records"], got["skipped"]) == (200, [{"step": 2, "loss": 0.5}], 0)
        assert took < QUICK_S

        # the listing's loss trail went through the same line in bounded polls and now has the new loss
        for _ in range(HUGE // MAX_READ_BYTES + 2):
            code, runs, took = await timed(jp_fetch, "runs")
            assert code == 200 and took < QUICK_S
            huge = next(r for r in runs if r["id"] == "huge-1")
            if huge["loss"] is not None:
                break
        assert huge["loss"] == 0.5

    run(jp_asyncio_loop, go)
