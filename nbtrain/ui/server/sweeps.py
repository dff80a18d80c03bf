"""A sweep's routes (``sweeps/<id>/figure``, ``best``, ``stop``, ``resume``, ``extend``, ``clone``) for
the lab extension's view (``labextension/src/sweepview.ts``): the notebook's sweep figure (``SweepView``:
every trial's curve, parameters against the metric, the ranked trials), read from the sweep's folder and its
trials' run directories, so it is the same with or without the kernel that started the sweep; and the
sweep's verbs carried out as the CLI does.

One view per sweep is kept for the server's life (the ``KEPT`` most recently asked), so each request reads
only the metrics appended since; asked with the version it drew, the page gets ``figure: null`` while
nothing in it changed."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import tornado.web

from nbtrain.contract.errors import NbtrainError
from nbtrain.ui.server.base import _Base

KEPT = 16
_LOCK = threading.Lock()
_VIEWS: OrderedDict[str, Any] = OrderedDict()


def _view(sweep_id: str) -> Any:
    from nbtrain.ui.sweeps import SweepView, get_sweep

    with _LOCK:
        view = _VIEWS.pop(sweep_id, None)
        if view is None:
            s = get_sweep(sweep_id)
            if s.id != sweep_id:  # a name or a folder: the view is asked for by id only
                raise NbtrainError(f"no sweep with id {sweep_id!r}")
            view = SweepView(s)
        _VIEWS[sweep_id] = view
        while len(_VIEWS) > KEPT:
            _VIEWS.popitem(last=False)
        return view


def _trial(t: dict[str, Any]) -> dict[str, Any]:
    """A trial as the view's picker shows it: ``3 · clone of 0 (its weights) · learning_rate=0.003 ·
    running``, and its run."""
    from nbtrain.control.sweep.space import describe

    changed = dict(t.get("set") or {})
    warm = changed.pop("init_from", None) is not None
    origin = ""
    if t.get("clone_of") is not None:
        origin = f"clone of {t['clone_of']}{' (its weights)' if warm else ''} · "
    params = describe({**t["params"], **changed})
    return {"number": t["number"], "state": t["state"], "run_id": t.get("run_id"),
            "label": f"{t['number']} · {origin}{params} · {t['state']}"}  # fmt: skip


def sweep_figure(sweep_id: str, since: str | None = None) -> dict[str, Any]:
    """``{"version", "state", "text", "trials", "figure"}``: the sweep's figure as plotly JSON (None when
    ``since`` is the version it would have) and its trials for the view's picker."""
    view = _view(sweep_id)
    st = view.sweep.status()
    version = json.dumps(view.signature(st), default=str)
    out: dict[str, Any] = {
        "version": version, "state": st.state, "done": st.done, "text": st.describe(),
        "trials": [_trial(t) for t in st.trials],
    }  # fmt: skip
    if since == version:
        return {**out, "figure": None}
    fig = view.figure(st)
    fig.update_layout(width=None, autosize=True)
    return {**out, "figure": json.loads(fig.to_json())}


def sweep_act(sweep_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
    """stop, resume, extend (``{"trials": N}``) or clone (``{"trial": N, "set": "KEY=VALUE; ...",
    "from_checkpoint": bool}``, the CLI's ``--set`` pairs); the sweep's status after."""
    s = _view(sweep_id).sweep
    note = ""
    if action == "stop":
        s.stop()
    elif action == "resume":
        s.resume()
    elif action == "extend":
        n = body.get("trials")
        if not isinstance(n, int) or isinstance(n, bool):
            raise NbtrainError('extend takes {"trials": N}, a whole number of more trials')
        s.extend(n)
    elif action == "clone":
        trial, text = body.get("trial"), body.get("set", "")
        if (
            not isinstance(trial, int)
            or isinstance(trial, bool)
            or not isinstance(text, str)
            or len(text) > 10_000
        ):
            raise NbtrainError(
                'clone takes {"trial": N, "set": "KEY=VALUE; ..."}: which trial, and what it changes'
            )
        changed, warm = set_pairs(text), body.get("from_checkpoint") is True
        s.clone(trial, changed, from_checkpoint=warm)
        what = "; ".join(f"{k}={v}" for k, v in changed.items()) or "nothing changed"
        start = ", from its checkpoint" if warm else ""
        note = f"trial {trial} cloned ({what}{start}): it runs as the sweep's next trial. "
    else:
        raise NbtrainError(f"a sweep can be stopped, resumed, extended or cloned, not {action!r}")
    st = s.status()
    return {"id": s.id, "state": st.state, "text": note + st.describe()}


def set_pairs(text: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs, one a line or separated by ``;``, each value YAML, read as the CLI reads its
    ``--set`` (``ui/verbs/sweeps.changes``)."""
    from nbtrain.ui.verbs.sweeps import changes

    return changes([p.strip() for p in text.replace("\n", ";").split(";") if p.strip()])


def sweep_best(sweep_id: str) -> dict[str, Any]:
    """The best trial's config as a ``%%finetune`` cell."""
    return {"id": sweep_id, "cell": "%%finetune\n" + _view(sweep_id).sweep.best_config()}


class SweepFigureHandler(_Base):
    @tornado.web.authenticated
    async def get(self, sweep_id: str) -> None:
        since = self.get_argument("since", None)
        await self._reply(sweep_figure, sweep_id, since if since and len(since) <= 100_000 else None)


class SweepBestHandler(_Base):
    @tornado.web.authenticated
    async def get(self, sweep_id: str) -> None:
        await self._reply(sweep_best, sweep_id)


class SweepActionHandler(_Base):
    @tornado.web.authenticated
    async def post(self, sweep_id: str, action: str) -> None:
        body = self.get_json_body() or {}
        await self._reply(sweep_act, sweep_id, action, body if isinstance(body, dict) else {})


_SWEEP = r"sweeps/(?P<sweep_id>[\w.-]+)"
ROUTES: list[tuple[str, type[_Base]]] = [
    (_SWEEP + "/figure", SweepFigureHandler),
    (_SWEEP + "/best", SweepBestHandler),
    (_SWEEP + r"/(?P<action>stop|resume|extend|clone)", SweepActionHandler),
]
