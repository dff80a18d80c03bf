"""What every REST handler of nbtrain's server extension shares: one bounded thread pool their work runs on
(never the IOLoop that serves every other request of the Jupyter server), nbtrain's errors as 409s naming
the cause, and bounded integer arguments."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import tornado.web
from jupyter_server.base.handlers import APIHandler
from tornado.ioloop import IOLoop

from nbtrain.contract.errors import NbtrainError

T = TypeVar("T")

# Stops wait up to their timeout each; a pool of their own would only hide a pile-up, so one bounded pool
# serves all handlers and is sized so a few slow stops leave room for the 2 s polls.
_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="nbtrain-server")


class _Base(APIHandler):
    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await IOLoop.current().run_in_executor(_POOL, fn, *args)

    async def _reply(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            result = await self._off_loop(fn, *args)
        except tornado.web.HTTPError:
            raise
        except NbtrainError as e:  # a run that is not running, or runs on another host
            raise tornado.web.HTTPError(409, str(e)) from e
        self.finish(json.dumps(result, default=str))

    def _int_arg(self, name: str, default: int, lo: int, hi: int) -> int:
        raw = self.get_argument(name, str(default))
        try:
            value = int(raw)
        except ValueError:
            raise tornado.web.HTTPError(400, f"{name} must be an integer, not {raw!r}") from None
        if not lo <= value <= hi:
            raise tornado.web.HTTPError(400, f"{name} must be between {lo} and {hi}")
        return value
