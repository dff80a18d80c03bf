"""The kernel's side of a sweep: ``start_sweep`` (check the config and the space, decide how many trials run
at once, write the folder, start the driver) and ``Sweep``, the handle every surface holds (status, trials,
best, stop, resume, extend, clone), which reads ``trials.json`` and leaves requests: it never opens the
study, so the kernel imports no Optuna."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import ConfigError, NbtrainError, Problem
from nbtrain.contract.paths import runs_root
from nbtrain.contract.pickles import write_private
from nbtrain.control.config.schema.sections import SweepSettings
from nbtrain.control.config.yamlsafe import load_yaml
from nbtrain.control.launch import process
from nbtrain.control.launch.process import LaunchFailed
from nbtrain.control.prepare import Prepared, prepare
from nbtrain.control.runs import registry
from nbtrain.control.runs.run import Run, get_run, has_trained_weights, last_checkpoint, new_run_id
from nbtrain.control.sweep import space
from nbtrain.control.sweep.capacity import capacity
from nbtrain.control.sweep.folder import STOPPED_BY_SWEEP, SweepPaths, is_sweep_dir, sweeps_root, write_json

DRIVER = "nbtrain.control.sweep.driver"


@dataclass
class SweepStatus:
    state: str  # running, completed, stopped, failed; interrupted: running, but its driver is gone
    budget: int
    at_once: int
    metric: str
    direction: str
    trials: list[dict[str, Any]] = field(default_factory=list)
    best: int | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.state in ("completed", "stopped", "failed")

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            out[t["state"]] = out.get(t["state"], 0) + 1
        return out

    def describe(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items()) or "no trials yet"
        best = self.best_trial()
        tail = f"; best: trial {best['number']} {self.metric} {best['value']:.4g}" if best else ""
        return f"{self.state}: {len(self.trials)}/{self.budget} trials ({counts}){tail}"

    def best_trial(self) -> dict[str, Any] | None:
        return next((t for t in self.trials if t["number"] == self.best), None)


def _base(prep: Prepared) -> dict[str, Any]:
    """The config each trial varies: as the user wrote it, without the sweep, its name or resume."""
    raw = load_yaml(prep.resolved.text)
    assert isinstance(raw, dict)  # prepare has read it as a mapping
    return {k: v for k, v in raw.items() if k not in ("sweep", "name", "resume")}


def budget_of(s: SweepSettings) -> int:
    if s.method == "grid":
        n = len(s.grid())
        return min(s.trials or n, n)
    assert s.trials is not None  # the schema asks for it
    return s.trials


def trials_plan(prep: Prepared) -> tuple[str, list[str]]:
    """The sweep ``prep`` would start, as the panel's plan says it before Launch: one line (its trials, how
    they are chosen and judged, how many run at once and why), and the warnings that hold for its trials
    (those of every corner of the space: the base config's own values of swept keys are never trained),
    a corner that would not start among them."""
    s = prep.resolved.config.sweep
    assert s is not None
    budget = budget_of(s)
    cap = capacity(prep, budget, s.at_once)
    judged = f"{s.metric}, {'higher' if s.goal == 'maximize' else 'lower'} is better"
    pruned = f", pruned by the {s.prune}" if s.prune != "none" else ""
    line = (
        f"Sweep: {budget} trial{'s' if budget != 1 else ''} ({s.method} over {', '.join(s.space)}; {judged}"
        f"{pruned}), {cap.why}"
    )
    refused: list[str] = []
    common: dict[str, str] | None = None  # by a warning's head ("likely to under-train"): its first words
    corners = 0
    for params, warned in _corners(_base(prep), s, f"{prep.name}-t000", on=prep.on):
        corners += 1
        if isinstance(warned, NbtrainError):
            refused.append(f"a trial at {space.describe(params)} would not start: {warned}")
            continue
        said = {w.split(":")[0]: f"{w} (at {space.describe(params)}" for w in warned.plan.warnings}
        common = said if common is None else {k: v for k, v in common.items() if k in said}
    also = "; the space's other ends warn so too)" if corners > 1 else ")"
    return line, refused + [w + also for w in (common or {}).values()]


def _corners(
    base: dict[str, Any], s: SweepSettings, name: str, *, on: str | None = None
) -> Iterator[tuple[dict[str, Any], Prepared | NbtrainError]]:
    """Each config that stands for the space (``space.corners``), prepared, or why it could not be."""
    for params in space.corners(s.space):
        try:
            yield params, prepare(space.apply(base, params), name=name, capture_notebook=False, on=on)
        except NbtrainError as e:  # ConfigError among them
            yield params, e


def check_space(base: dict[str, Any], s: SweepSettings, name: str) -> None:
    """Every choice and each range's ends make a config that validates and plans, or the sweep does not
    start: one ConfigError naming the values that do not."""
    problems: list[Problem] = []
    for params, e in _corners(base, s, name):
        if isinstance(e, ConfigError):
            where = ", ".join(f"{k}={v}" for k, v in params.items())
            problems += [
                Problem(p.path or "sweep.space", f"a trial with {where}: {p.message}") for p in e.problems
            ]
        elif isinstance(e, NbtrainError):
            problems.append(Problem("sweep.space", str(e)))
        if problems:
            break  # the first corner that fails says enough
    if problems:
        raise ConfigError(problems)


def start_sweep(
    config: str | Path | dict[str, Any],
    *,
    name: str | None = None,
    namespace: Mapping[str, Any] | None = None,
    prepared: Prepared | None = None,
) -> Sweep:
    """Check ``config`` (which has a ``sweep:`` section) and its space, then start its driver: trials run
    as ordinary runs, ``at_once`` at a time. Nothing is written before every check passed. ``prepared``:
    the config already through ``prepare`` (a cell that looked at it first)."""
    prep = prepared or prepare(config, name=name, namespace=namespace)
    s = prep.resolved.config.sweep
    if s is None:
        raise NbtrainError("this config has no sweep: section; start it as a run (nbtrain.finetune)")
    base = _base(prep)
    sweep_name = prep.name
    check_space(base, s, f"{sweep_name}-t000")
    budget = budget_of(s)
    cap = capacity(prep, budget, s.at_once)
    sweep_id = new_run_id(sweep_name)
    paths = SweepPaths(sweeps_root() / sweep_id)
    paths.root.mkdir(parents=True, mode=0o700)
    try:
        for file, payload in (("hooks.pkl", prep.hooks), ("rewards.pkl", prep.rewards)):
            if payload is not None:
                write_private(paths.root / file, payload)
        write_json(
            paths.spec,
            {
                "id": sweep_id,
                "name": sweep_name,
                "created": time.time(),
                "config_text": prep.resolved.text,
                "base": base,
                "settings": s.model_dump(mode="json"),
                "budget": budget,
                "at_once": cap.at_once,
                "at_once_why": cap.why,
                "threads": cap.threads,
                "trials_here": cap.here,
                "max_steps": prep.plan.steps,
                "cwd": str(Path.cwd()),
                "runs_root": str(runs_root()),
            },
        )
        registry.add_sweep(sweep_id, sweep_name, paths.root)
        sweep = Sweep(paths.root)
        sweep.resume()
    except BaseException:
        import shutil

        shutil.rmtree(paths.root, ignore_errors=True)
        raise
    return sweep


class Sweep:
    """A sweep, by its folder: what every surface holds."""

    def __init__(self, root: str | Path) -> None:
        self.paths = SweepPaths(Path(root))
        self._spec: dict[str, Any] | None = None

    @property
    def spec(self) -> dict[str, Any]:
        if self._spec is None:
            self._spec = self.paths.read_spec()
        return self._spec

    @property
    def id(self) -> str:
        return str(self.spec["id"])

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def why(self) -> str:
        """How many trials run at once, and why."""
        return str(self.spec.get("at_once_why", ""))

    # ------------------------------------------------------------------------------------------ reading
    def driver_alive(self) -> bool:
        try:
            rec = self.paths.read_driver()
        except NbtrainError:
            return False
        return process.group_alive(rec)

    def status(self) -> SweepStatus:
        data = self.paths.read_trials()
        state = str(data.get("state", "running"))
        if state == "running" and not self.driver_alive():
            state = "interrupted"
        return SweepStatus(
            state=state,
            budget=int(data.get("budget", self.spec["budget"])),
            at_once=int(data.get("at_once", self.spec["at_once"])),
            metric=str(data.get("metric", self.spec["settings"]["metric"])),
            direction=str(data.get("direction", "minimize")),
            trials=list(data.get("trials") or []),
            best=data.get("best"),
            error=data.get("error"),
        )

    def trials(self) -> list[dict[str, Any]]:
        return self.status().trials

    def trial_run(self, number: int) -> Run:
        t = next((t for t in self.trials() if t["number"] == number), None)
        if t is None:
            raise NbtrainError(f"sweep {self.id} has no trial {number}")
        if not t.get("run_id"):
            raise NbtrainError(
                f"trial {number} of sweep {self.id} has no run ({t.get('reason') or t['state']})"
            )
        return get_run(t.get("run_dir") or t["run_id"])

    def best(self) -> dict[str, Any] | None:
        """The best finished trial (its number, params, value, run), None while no trial finished."""
        return self.status().best_trial()

    def best_run(self) -> Run:
        best = self.best()
        if best is None:
            raise NbtrainError(f"sweep {self.id} has no finished trial yet")
        return get_run(best.get("run_dir") or best["run_id"])

    def best_config(self) -> str:
        """The best trial's config, as a ``%%finetune`` cell's body (its own name, the sweep's values)."""
        run = self.best_run()
        text = run.paths.config.read_text(encoding="utf-8")
        best = self.best() or {}
        params = {**best.get("params", {}), **best.get("set", {})}
        head = f"# the best trial ({best.get('number')}) of sweep {self.id}: {space.describe(params)}\n"
        body = [line for line in text.splitlines() if not line.startswith(("# %%finetune", "name:"))]
        return head + "".join(line + "\n" for line in body) + f"name: {self.name}-best\n"

    # ------------------------------------------------------------------------------------------- acting
    def resume(self) -> Sweep:
        """Start the driver (again): it adopts the unfinished trials; finished ones are never re-run."""
        if self.driver_alive():
            if self.paths.read_trials().get("state") == "running":
                return self  # it reads the requests left for it
            # it said the sweep ended and is exiting: a request left now is for the next driver
            deadline = time.monotonic() + 30
            while self.driver_alive():
                if time.monotonic() > deadline:
                    raise NbtrainError(f"sweep {self.id}: its driver is still ending; try again in a moment")
                time.sleep(0.1)
        (self.paths.requests / "stop").unlink(missing_ok=True)
        if self.paths.trials.exists():  # running again from now: no reader takes the old end for this one's
            write_json(self.paths.trials, {**self.paths.read_trials(), "state": "running", "error": None})
        spec = self.spec
        result = process.start_process(
            [sys.executable, "-m", DRIVER, str(self.paths.root)],
            log=self.paths.log,
            cwd=Path(spec["cwd"]),
            env={"NBTRAIN_RUNS_DIR": spec["runs_root"]},
            warm=False,
        )
        if isinstance(result, LaunchFailed):
            raise NbtrainError(f"sweep {self.id}: its driver could not start: {result.reason}")
        write_json(self.paths.driver, {**result.record, "argv": result.argv, "started": time.time()})
        return self

    def stop(self, timeout: float | None = None) -> SweepStatus:
        """Stop the sweep: each running trial stops at a checkpoint (``resume`` goes on with them)."""
        if not self.driver_alive():
            for t in self.trials():
                if t["state"] in ("running", "queued") and t.get("run_id"):
                    run = get_run(t.get("run_dir") or t["run_id"])
                    if not run.status().done:
                        run.stop(by=STOPPED_BY_SWEEP)
            return self.status()
        self.paths.request("stop")
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.driver_alive():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {self.id} is still stopping its trials after {timeout} s")
            time.sleep(0.2)
        return self.status()

    def extend(self, trials: int) -> Sweep:
        """Run ``trials`` more trials (the driver starts again if the sweep had ended)."""
        if not isinstance(trials, int) or not 0 < trials <= 1000:
            raise NbtrainError(f"extend a sweep by 1 to 1000 trials, not {trials!r}")
        s = SweepSettings.model_validate(self.spec["settings"])
        if s.method == "grid" and self.status().budget + trials > len(s.grid()):
            raise NbtrainError(
                f"a grid has {len(s.grid())} combinations: extend by at most "
                f"{len(s.grid()) - self.status().budget}, or clone a trial with other values"
            )
        self.paths.request("extend", {"add": trials})
        return self.resume()

    def clone(
        self, trial: int, changes: Mapping[str, Any] | None = None, *, from_checkpoint: bool = False
    ) -> Sweep:
        """A new trial: trial ``trial``'s values with ``changes`` (dotted keys; ones outside the space are set
        on its config too); ``from_checkpoint``: starting from that trial's weights (its last checkpoint, or
        its output once it ended without one: ``init_from:``), its optimizer and schedule afresh."""
        if not any(t["number"] == trial for t in self.trials()):
            raise NbtrainError(f"sweep {self.id} has no trial {trial} to clone")
        changes = dict(changes or {})
        if from_checkpoint:
            changes["init_from"] = str(self._weights_of(trial))
        base = self.spec["base"]
        src = next(t for t in self.trials() if t["number"] == trial)
        cfg = space.apply(space.apply(base, {**src["params"], **src.get("set", {})}), changes)
        prepare(
            cfg, name=f"{self.name}-clone", capture_notebook=False
        )  # a bad change is said here, not later
        self.paths.request("clone", {"trial": trial, "set": changes})
        return self.resume()

    def _weights_of(self, trial: int) -> Path:
        run = self.trial_run(trial)
        found = last_checkpoint(run)
        if found is None and has_trained_weights(run):  # ended without a checkpoint: its output
            found = run.paths.output
        if found is None:
            raise NbtrainError(
                f"trial {trial} of sweep {self.id} has no checkpoint yet ({run.status().describe()}): "
                "clone it without from_checkpoint, or once it has saved one"
            )
        return found

    def wait(self, timeout: float | None = None, poll: float = 0.5) -> SweepStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status()
            if st.done or st.state == "interrupted":
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {self.id} is still running after {timeout} s: {st.describe()}")
            time.sleep(poll)

    def __repr__(self) -> str:
        try:
            return f"Sweep({self.id}: {self.status().describe()})"
        except NbtrainError as e:
            return f"Sweep({self.paths.root}: {e})"


def all_sweeps() -> list[Sweep]:
    """The registered sweeps whose folders are this user's, and any in this runs root's sweeps folder, oldest
    first."""
    root = sweeps_root()
    folders = [Path(r.run_dir) for r in registry.sweep_rows()]
    folders += sorted(root.iterdir()) if root.is_dir() else []
    seen: dict[Path, Sweep] = {}
    for p in folders:
        if p not in seen and is_sweep_dir(p):
            seen[p] = Sweep(p)
    return sorted(seen.values(), key=lambda s: s.paths.root.name)


def get_sweep(ref: str | Path | Sweep | None = None) -> Sweep:
    """A sweep by id, name (the newest of that name), folder, or the newest one when ``ref`` is None."""
    if isinstance(ref, Sweep):
        return ref
    if ref is not None and is_sweep_dir(Path(ref)):
        return Sweep(Path(ref))
    sweeps = all_sweeps()
    if ref is None:
        if not sweeps:
            raise NbtrainError(f"no sweeps in {sweeps_root()}")
        return sweeps[-1]
    for s in reversed(sweeps):
        if ref in (s.paths.root.name, s.name):
            return s
    raise NbtrainError(f"no sweep {ref!r} in {sweeps_root()}")
