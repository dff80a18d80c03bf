"""The sweep verb, ``%finetune sweep ACTION [SWEEP]`` / ``nbtrain sweep ACTION [SWEEP]``: status (the
default: the view in a notebook, a table in a terminal), list, stop, resume, extend, clone and best; and how
a sweep a ``%%finetune`` cell (the run verb) started is shown."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.ui.lazy import lazy_module
from nbtrain.ui.verb import Arg, Args, VerbUsageError, arg

if TYPE_CHECKING:
    from nbtrain.control.config import yamlsafe
    from nbtrain.control.sweep import sweep as core
    from nbtrain.ui import sweeps as sweeps_api
else:
    core = lazy_module("nbtrain.control.sweep.sweep")
    sweeps_api = lazy_module("nbtrain.ui.sweeps")
    yamlsafe = lazy_module("nbtrain.control.config.yamlsafe")

ACTIONS = ("status", "list", "stop", "resume", "extend", "clone", "best")
SWEEP_ARGS: tuple[Arg, ...] = (
    arg("action", nargs="?", default="status", choices=ACTIONS, help="what to do (status)"),
    arg("sweep", nargs="?", default=None, help="sweep id, name or folder (default: the newest)"),
    arg("--trials", type=int, default=None, help="extend: how many more trials"),
    arg("--trial", type=int, default=None, help="clone: the trial whose values the new trial starts from"),
    arg(
        "--set",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="clone: a key the new trial changes (dotted, YAML value: train.learning_rate=2e-4), repeatable",
    ),
    arg(
        "--from-checkpoint",
        action="store_true",
        help="clone: start from the trial's weights (its last checkpoint), not from the model",
    ),
    arg("--wait", action="store_true", help="block until the sweep ends"),
)


def changes(pairs: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise VerbUsageError(f"--set {pair!r}: give KEY=VALUE, e.g. --set train.learning_rate=2e-4")
        out[key.strip()] = yamlsafe.load_yaml(text) if text.strip() else None
    return out


def call_sweep(a: Args) -> Any:
    if a.action == "list":
        return sweeps_api.sweeps()
    s = sweeps_api.get_sweep(a.sweep)
    if a.action == "stop":
        s.stop()
    elif a.action == "resume":
        s.resume()
    elif a.action == "extend":
        if a.trials is None:
            raise VerbUsageError("extend: say how many more trials, e.g. --trials 4")
        s.extend(a.trials)
    elif a.action == "clone":
        if a.trial is None:
            raise VerbUsageError("clone: say which trial, e.g. --trial 3 --set train.learning_rate=2e-4")
        s.clone(a.trial, changes(a.set), from_checkpoint=a.from_checkpoint)
    elif a.action == "best":
        return s.best_config()
    return s


def table(s: core.Sweep) -> str:
    """The sweep in a terminal: its line, how many at once, and its trials ranked."""
    from nbtrain.ui.figures.sweep import ranked

    st = s.status()
    lines = [f"sweep {s.id}: {st.describe()}", f"  {s.why}"]
    for t in ranked(st.trials, st.direction != "maximize"):
        params = " ".join(f"{k.split('.')[-1]}={v}" for k, v in {**t["params"], **t.get("set", {})}.items())
        value = t["value"] if t.get("value") is not None else t.get("last")
        mark = "*" if t["number"] == st.best else " "
        shown = f"{st.metric}={value:.4g}" if isinstance(value, (int, float)) else ""
        step = f" step {t['step']}/{t['max_steps']}" if t.get("max_steps") else ""
        note = f"  ({t['reason']})" if t.get("reason") else ""
        lines.append(f"{mark} t{t['number']:<3} {t['state']:<9} {params}  {shown}{step}{note}")
    return "\n".join(lines)


def _follow_in_terminal(s: core.Sweep) -> int:
    last = ""
    while True:
        st = s.status()
        line = st.describe()
        if line != last:
            print(f"sweep {s.id}: {line}", flush=True)
            last = line
        if st.done or st.state == "interrupted":
            return 0 if st.state == "completed" else 1
        time.sleep(1.0)


def sweep_in_terminal(result: Any, a: Args) -> int:
    if isinstance(result, str):
        print(result, end="" if result.endswith("\n") else "\n")
        return 0
    if isinstance(result, list):
        for s in result:
            print(f"{s.id}  {s.status().describe()}")
        if not result:
            print("no sweeps yet")
        return 0
    if getattr(a, "action", None) in (None, "status") and not a.wait:
        print(table(result))
        return 0
    if getattr(a, "action", "") == "stop":
        print(f"sweep {result.id}: {result.status().describe()}")
        return 0
    print(f"sweep {result.id} ({result.why})\n  folder: {result.paths.root}")
    return _follow_in_terminal(result) if a.wait else 0


def sweep_in_notebook(result: Any, a: Args) -> Any:
    if isinstance(result, str):  # best: the config, as a cell below this one
        from IPython.core.getipython import get_ipython

        shell = get_ipython()
        if shell is not None:
            shell.set_next_input("%%finetune\n" + result, replace=False)
        print(result, end="")
        return None
    if isinstance(result, list):
        for s in result:
            print(f"{s.id}  {s.status().describe()}")
        return None
    view = result.show() if not getattr(a, "no_view", False) else None
    if a.wait:
        st = view.wait() if view is not None else result.wait()
        if st.state != "completed":
            raise NbtrainError(f"sweep {result.id} ended {st.state}: {st.describe()}")
    return None
