"""The processes beside the runs: ``warm`` (the warm process that starts runs in a fraction of a second:
its status, start, stop) and ``tensorboard`` (TensorBoard on a run's logs, or stopped) -- each verb's call
and how its result is shown. The table (``nbtrain.ui.verbs``) names them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtrain.ui.lazy import lazy_module
from nbtrain.ui.verb import Args

if TYPE_CHECKING:
    from nbtrain.control.runs import run as run_core
else:
    run_core = lazy_module("nbtrain.control.runs.run")  # on first use, not at `%load_ext` (ui/lazy.py)


def warm(a: Args) -> str:
    from nbtrain.contract.warmproto import ENV_OFF, enabled
    from nbtrain.control.launch import warm as manager

    if a.action == "start":
        if manager.start():
            return "warm process starting"
        if why := manager.memory_short():
            return f"no warm process started: {why}"
        return "a warm process answers already (or is starting)"
    if a.action == "stop":
        return f"stopped {manager.stop()} warm process(es)"
    rows = manager.status(every_home=True)  # the bound (NBTRAIN_WARM_MAX) is per user, whatever the home
    lines = [] if enabled() else [f"warm start is off ({ENV_OFF}=0): every run starts cold"]
    for r in rows:
        idle = f"idle {r['idle_s']:.0f} s, " if r["idle_s"] is not None else ""
        ready = f", ready after {r['ready_s']} s" if r["ready_s"] is not None else ""
        lines.append(
            f"warm process {r['pid']}: {r['rss_bytes'] / 2**20:.0f} MiB held, {idle}up {r['uptime_s']:.0f} s"
            f"{ready}, environment {r['key']} ({r['python']}, {r['folder']})"
            + (", serves this kernel" if r["this_kernel"] else "")
        )
    return "\n".join(lines or ["no warm process (the next run starts one; `start` starts it now)"])


def tensorboard(a: Args) -> Any:
    from nbtrain.control.launch.tracking import stop_tensorboard
    from nbtrain.control.launch.tracking import tensorboard as start_tensorboard

    run = run_core.get_run(a.run)
    if a.stop:
        return f"run {run.id}: TensorBoard {'stopped' if stop_tensorboard(run.dir) else 'was not running'}"
    return start_tensorboard(run.dir)


def tensorboard_in_notebook(result: Any, a: Args) -> Any:
    if isinstance(result, str):
        print(result)
        return None
    from IPython.display import IFrame, display

    display(result)
    return IFrame(result.url, width="100%", height=720)


def tensorboard_in_terminal(result: Any, a: Args) -> int:
    print(result if isinstance(result, str) else f"{result!r}; stop with nbtrain tensorboard {a.run} --stop")
    return 0
