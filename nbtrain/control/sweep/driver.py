"""A sweep's driver: ``python -m nbtrain.control.sweep.driver SWEEP_DIR``, a detached process of its own.

It keeps ``at_once`` trials going: asks Optuna's study for a trial's parameters, starts it as an ordinary
run (``prepare`` then ``start``, warm where the warm process serves), follows each run's metrics (one
incremental reader a trial), reports every value of the metric to the pruner at its step and stops a trial
the pruner gives up on, and when a run ends tells the study its final value (the metric's last), or that it
failed or was stopped. Everything the study knows is written to ``trials.json`` for the views.

Nothing it holds is lost when it dies: the study is on disk, each trial names its run, and the runs go on
without it. Started again (``Sweep.resume``) it adopts the study's unfinished trials: a run still going is
followed, one that ended meanwhile is told, one the sweep's stop left stopped is resumed from its
checkpoint; finished trials are never run again.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from nbtrain.contract.errors import ConfigError, NbtrainError
from nbtrain.contract.rundir import request_control
from nbtrain.control.config.schema.sections import SweepSettings
from nbtrain.control.launch import process, warm
from nbtrain.control.prepare import prepare
from nbtrain.control.runs.metrics import JsonlTail
from nbtrain.control.runs.run import Run, get_run, last_checkpoint
from nbtrain.control.start import ClusterBusy, resume, start
from nbtrain.control.sweep import space
from nbtrain.control.sweep.folder import PRUNED, STOPPED_BY_SWEEP, SweepPaths, write_json

POLL = 0.2  # s between looks at the trials' runs and the requests
HOLD_AFTER_EVAL = 30.0  # s a pruned sweep's trial waits after an evaluation for the driver's word
WRITE_EVERY = 2.0  # s between rewrites of trials.json while nothing but steps changed


def _say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def sampler(s: SweepSettings, budget: int) -> optuna.samplers.BaseSampler:
    if s.method == "tpe":  # a third of a small budget explores at random before TPE models what it saw
        return optuna.samplers.TPESampler(
            seed=s.seed, n_startup_trials=min(10, max(2, budget // 3)), constant_liar=True
        )
    return optuna.samplers.RandomSampler(seed=s.seed)  # grid: its combinations are enqueued, in order


def pruner(s: SweepSettings, budget: int, max_steps: int | None) -> optuna.pruners.BasePruner:
    if s.prune == "median":
        # after a few trials finished, each one's value at a step is compared with theirs, from a quarter of
        # the steps on (the first evaluation's loss says little of where a trial ends)
        warmup = max_steps // 4 if max_steps else 0
        startup = min(5, max(1, budget // 4))
        return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
    if s.prune == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_steps or "auto")
    return optuna.pruners.NopPruner()


@dataclass
class Active:
    """A trial whose run the driver follows."""

    trial: optuna.Trial
    run: Run
    tail: JsonlTail
    reported: set[int] = field(default_factory=set)
    last: float | None = None  # the metric's last logged value
    stopping: str | None = None  # why the driver asked the run to stop (pruned, the sweep's stop)


class Driver:
    def __init__(self, paths: SweepPaths) -> None:
        self.paths = paths
        self.spec = paths.read_spec()
        self.settings = SweepSettings.model_validate(self.spec["settings"])
        self.base: dict[str, Any] = self.spec["base"]
        self.name: str = self.spec["name"]
        self.at_once: int = int(self.spec["at_once"])
        self.dists = space.distributions(self.settings.space)
        self.active: dict[int, Active] = {}
        self.waiting: list[optuna.Trial] = []  # asked for, not started: the cluster's cap for the student
        self.stoppers: list[threading.Thread] = []
        self.written = 0.0
        self.state = "running"
        self.error: str | None = None
        storage = optuna.storages.RDBStorage(
            paths.storage_url(), engine_kwargs={"connect_args": {"timeout": 30}}
        )
        budget = int(self.spec["budget"])
        self.study = optuna.create_study(
            storage=storage,
            study_name="sweep",
            direction="maximize" if self.settings.goal == "maximize" else "minimize",
            sampler=sampler(self.settings, budget),
            pruner=pruner(self.settings, budget, self.spec.get("max_steps")),
            load_if_exists=True,
        )
        if "budget" not in self.study.user_attrs:  # the first start: the grid's combinations, in order
            self.study.set_user_attr("budget", budget)
            if self.settings.method == "grid":
                for params in self.settings.grid()[:budget]:
                    self.study.enqueue_trial({k: space.encode(v) for k, v in params.items()})

    # ------------------------------------------------------------------------------------------ budget
    @property
    def budget(self) -> int:
        return int(self.study.user_attrs.get("budget", self.spec["budget"]))

    def started(self) -> int:
        """Trials asked for so far (any state), clones included: what the budget counts."""
        return sum(1 for t in self.study.get_trials(deepcopy=False) if t.state != TrialState.WAITING)

    # ------------------------------------------------------------------------------------------- trials
    def start_trial(self, trial: optuna.Trial) -> None:
        params = {k: space.decode(v) for k, v in trial.params.items()}
        changes = trial.user_attrs.get("set") or {}
        run_name = f"{self.name}-t{trial.number:03d}"
        try:
            cfg = space.apply(space.apply(self.base, params), changes)
            cfg["name"] = run_name
            prep = prepare(cfg, capture_notebook=False)
            prep.hooks = self._captured("hooks.pkl")
            prep.rewards = self._captured("rewards.pkl")
            prep.threads = self.spec.get("threads")
            prep.sweep = {
                "id": self.spec["id"],
                "name": self.name,
                "dir": str(self.paths.root),
                "trial": trial.number,
                # under a pruner the run waits after each evaluation for the driver's word (go on or stop)
                "hold_after_eval": HOLD_AFTER_EVAL if self.settings.prune != "none" else 0,
            }
            run = start(prep)
        except ClusterBusy as e:  # the course's cap on the cluster: it starts once one of the student's ends
            if trial not in self.waiting:
                self.waiting.append(trial)
                _say(f"trial {trial.number} waits: {e}")
            return
        except (ConfigError, NbtrainError) as e:
            self._fail(trial, f"could not start: {e}")
            return
        if trial in self.waiting:
            self.waiting.remove(trial)
        trial.set_user_attr("run_id", run.id)
        trial.set_user_attr("run_dir", str(run.dir))
        self._follow(trial, run)
        _say(f"trial {trial.number} started as run {run.id}: {space.describe(params)}")

    def _captured(self, name: str) -> bytes | None:
        p = self.paths.root / name
        return p.read_bytes() if p.is_file() else None

    def _follow(self, trial: optuna.Trial, run: Run) -> None:
        a = Active(trial, run, JsonlTail(run.paths.metrics, below=run.dir))
        a.reported = set(self.study._storage.get_trial(trial._trial_id).intermediate_values)
        self.active[trial.number] = a

    def _fail(self, trial: optuna.Trial | int, reason: str, state: str = "failed") -> None:
        number = trial if isinstance(trial, int) else trial.number
        tid = self._trial_id(number)
        self.study._storage.set_trial_user_attr(tid, "state", state)
        self.study._storage.set_trial_user_attr(tid, "reason", reason[:2000])
        self.study.tell(number, state=TrialState.FAIL)
        _say(f"trial {number} {state}: {reason}")

    def _trial_id(self, number: int) -> int:
        return self.study._storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)

    def poll(self, a: Active) -> None:
        """New metrics to the pruner; a run that ended, to the study (its last evaluations are its value,
        never a reason to prune it: a run read late, already at its end, has nothing left to save)."""
        st = a.run.status()
        self.read_metrics(a, may_prune=not st.done)
        if not st.done:
            st = a.run.status()
        if st.done:
            self.read_metrics(a, may_prune=False)  # what it logged between the read above and its end
            self.ended(a, st.state, st.error, st.stop_reason)

    def read_metrics(self, a: Active, *, may_prune: bool) -> None:
        metric = self.settings.metric
        for rec in a.tail.read():
            v, step = rec.get(metric), rec.get("step")
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                continue
            a.last = float(v)
            pruning = self.settings.prune != "none" and a.stopping is None  # (a pruned trial is told)
            if not pruning or not isinstance(step, int) or step in a.reported:
                continue
            a.trial.report(float(v), step)
            a.reported.add(step)
            st = a.run.status()
            final = st.max_steps is not None and step >= st.max_steps
            if may_prune and not final and a.trial.should_prune() and not a.run.status().done:
                self.prune(a, step, float(v))
            elif not final:
                request_control(a.run.paths, f"go-{step}")  # the run waits for this after the evaluation

    def prune(self, a: Active, step: int, value: float) -> None:
        reason = self._prune_reason(a.trial.number, step, value)
        tid = a.trial._trial_id
        self.study._storage.set_trial_user_attr(tid, "state", PRUNED)
        self.study._storage.set_trial_user_attr(tid, "reason", reason)
        self.study._storage.set_trial_user_attr(tid, "pruned_at", step)
        self.study._storage.set_trial_user_attr(tid, "steps", step)
        self.study.tell(a.trial.number, state=TrialState.PRUNED)
        a.stopping = PRUNED
        self._stop_run(a.run, PRUNED)
        _say(f"trial {a.trial.number} {reason}")

    def _prune_reason(self, number: int, step: int, value: float) -> str:
        metric = self.settings.metric
        if self.settings.prune == "hyperband":
            return (
                f"pruned at step {step}: {metric} {value:.4g} was not among the best of its bracket "
                "(successive halving, hyperband)"
            )
        others = [
            t.intermediate_values[step]
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if step in t.intermediate_values and t.number != number
        ]
        worse = "higher" if self.settings.goal == "minimize" else "lower"
        if not others:
            return f"pruned at step {step}: {metric} {value:.4g}"
        median = statistics.median(others)
        n = len(others)
        return (
            f"pruned at step {step}: {metric} {value:.4g} is {worse} than the median {median:.4g} of the "
            f"{n} finished trial{'s' if n > 1 else ''} at that step"
        )

    def _stop_run(self, run: Run, by: str) -> None:
        t = threading.Thread(target=_stop_quietly, args=(run, by), daemon=True, name=f"stop {run.id}")
        t.start()
        self.stoppers.append(t)

    def ended(self, a: Active, state: str, error: dict[str, Any] | None, stop_reason: str | None) -> None:
        del self.active[a.trial.number]
        number = a.trial.number
        if a.stopping == PRUNED:
            return  # told when pruned
        if a.stopping != STOPPED_BY_SWEEP and stop_reason != STOPPED_BY_SWEEP:  # (it goes on later)
            self.study._storage.set_trial_user_attr(a.trial._trial_id, "steps", a.run.status().step)
        if state == "completed":
            if a.last is None:
                self._fail(number, f"its run completed without logging {self.settings.metric}")
                return
            self.study._storage.set_trial_user_attr(a.trial._trial_id, "state", "completed")
            self.study.tell(number, a.last)
            _say(f"trial {number} completed: {self.settings.metric} {a.last:.4g}")
        elif state == "stopped" and (a.stopping == STOPPED_BY_SWEEP or stop_reason == STOPPED_BY_SWEEP):
            return  # the sweep's own stop: the trial stays unfinished and goes on when the sweep resumes
        elif state == "stopped":
            self._fail(number, f"its run was stopped ({stop_reason or 'by a signal'})", state="stopped")
        else:
            err = error or {}
            self._fail(number, f"its run failed: {err.get('type', 'error')}: {err.get('message', '')}")

    # --------------------------------------------------------------------------------------- adoption
    def adopt(self) -> None:
        """The study's unfinished trials, as this driver finds them (a restart)."""
        for ft in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            trial = optuna.Trial(self.study, ft._trial_id)
            run_id = ft.user_attrs.get("run_id")
            if not run_id:  # asked for, then the driver died before its run was made
                self.start_trial(trial)
                continue
            try:
                run = get_run(run_id)
            except NbtrainError:
                self._fail(ft.number, f"its run {run_id} is gone (deleted?)")
                continue
            st = run.status()
            if st.state == "stopped" and st.stop_reason == STOPPED_BY_SWEEP:
                if last_checkpoint(run) is None:  # stopped before its first checkpoint: start it again
                    self.start_trial(trial)
                    continue
                try:
                    run = resume(run)
                except NbtrainError as e:
                    self._fail(ft.number, f"its run {run.id} could not be resumed: {e}")
                    continue
                _say(f"trial {ft.number}: run {run.id} resumed")
            self._follow(trial, run)
            if not st.done:
                _say(f"trial {ft.number}: following run {run.id} ({st.state})")

    # ----------------------------------------------------------------------------------------- requests
    def requests(self) -> bool:
        """Carry out the kernel's requests; True when one is a stop."""
        for kind, path, body in self.paths.pending():
            try:
                if kind == "stop":
                    return True
                if kind == "extend":
                    add = body.get("add")
                    if isinstance(add, int) and 0 < add <= 1000:
                        self.study.set_user_attr("budget", self.budget + add)
                        _say(f"budget extended by {add} to {self.budget}")
                elif kind == "clone":
                    self.clone(body)
            except Exception as e:  # noqa: BLE001 - a bad request is said in the log, the sweep goes on
                _say(f"request {path.name} not carried out: {e}")
            path.unlink(missing_ok=True)
        return False

    def clone(self, body: dict[str, Any]) -> None:
        number, changes = body.get("trial"), body.get("set") or {}
        src = next((t for t in self.study.get_trials(deepcopy=False) if t.number == number), None)
        if src is None or not isinstance(changes, dict):
            raise NbtrainError(f"no trial {number} to clone")
        params = dict(src.params)
        extra = dict(src.user_attrs.get("set") or {})
        for key, value in changes.items():
            if self._in_space(key, value):
                params[key] = space.encode(value)
            else:  # outside the space: set on the config, shown with the trial
                extra[key] = value
        self.study.enqueue_trial(params, user_attrs={"clone_of": number, "set": extra})
        self.study.set_user_attr("budget", self.budget + 1)
        _say(f"trial {number} cloned with {changes}")

    def _in_space(self, key: str, value: Any) -> bool:
        dist = self.dists.get(key)
        if dist is None:
            return False
        try:
            return bool(dist._contains(dist.to_internal_repr(space.encode(value))))
        except (ValueError, TypeError):  # a choice the list does not have, a value of another type
            return False

    # --------------------------------------------------------------------------------------- the loop
    def warm_up(self, wait: float = 30.0) -> None:
        """More trials than run at once: have the warm process ready before the first ones start, so every
        trial is forked from it (one import of the training stack for the sweep, not one a trial)."""
        if not self.spec.get("trials_here", True):
            return  # each trial is a SLURM or Ray job: none is forked here
        if self.budget - self.started() <= 1 or not process.start_warm():
            return  # one trial left, or one is running already (or warm starts are off)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if any(w["this_kernel"] and w.get("socket") for w in warm.status()):
                _say("warm process ready: trials start warm")
                return
            time.sleep(0.2)

    def run(self) -> int:
        self.warm_up()
        self.adopt()
        self.write(force=True)
        while True:
            if self.requests():
                return self.stop()
            for a in list(self.active.values()):
                self.poll(a)
            for trial in list(self.waiting):  # first those the cluster's cap held back
                if len(self.active) < self.at_once:
                    self.start_trial(trial)
            while not self.waiting and len(self.active) < self.at_once and self.started() < self.budget:
                self.start_trial(self.study.ask(self.dists))
                self.write(force=True)
            if not self.active and not self.waiting and self.started() >= self.budget:
                self.state = "completed"
                self.write(force=True)
                _say("sweep completed")
                return 0
            self.write()
            time.sleep(POLL)

    def stop(self) -> int:
        """The sweep's stop: every trial's run stops at a checkpoint; they go on when the sweep resumes."""
        for a in self.active.values():
            if a.stopping is None:
                a.stopping = STOPPED_BY_SWEEP
                self._stop_run(a.run, STOPPED_BY_SWEEP)
        for t in self.stoppers:
            t.join()
        for a in list(self.active.values()):
            self.poll(a)
        (self.paths.requests / "stop").unlink(missing_ok=True)
        self.state = "stopped"
        self.write(force=True)
        _say("sweep stopped")
        return 0

    # ------------------------------------------------------------------------------------ trials.json
    def write(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self.written < WRITE_EVERY:
            return
        write_json(self.paths.trials, self.snapshot())
        self.written = time.monotonic()

    def snapshot(self) -> dict[str, Any]:
        trials = []
        best: int | None = None
        for t in self.study.get_trials(deepcopy=False):
            if t.state == TrialState.WAITING:
                continue
            a = self.active.get(t.number)
            state = t.user_attrs.get("state") or {TrialState.RUNNING: "running"}.get(t.state, "failed")
            if t.state == TrialState.RUNNING and a is None:
                state = "stopped" if self.state != "running" else "queued"
            rec: dict[str, Any] = {
                "number": t.number,
                "params": {k: space.decode(v) for k, v in t.params.items()},
                "set": t.user_attrs.get("set") or {},
                "clone_of": t.user_attrs.get("clone_of"),
                "state": state,
                "run_id": t.user_attrs.get("run_id"),
                "run_dir": t.user_attrs.get("run_dir"),
                "value": t.value if t.state == TrialState.COMPLETE else None,
                "last": a.last if a is not None else _last(t.intermediate_values),
                "reason": t.user_attrs.get("reason"),
                "evaluations": {str(k): v for k, v in sorted(t.intermediate_values.items())},
                "steps": t.user_attrs.get("steps"),  # the steps it trained, once it ended
            }
            if a is not None:
                st = a.run.status()
                rec["step"], rec["max_steps"] = st.step, st.max_steps
            trials.append(rec)
            if t.state == TrialState.COMPLETE and t.value is not None:
                better = best is None or (
                    t.value < trials[best]["value"]
                    if self.settings.goal == "minimize"
                    else t.value > trials[best]["value"]
                )
                if better:
                    best = len(trials) - 1
        return {
            "id": self.spec["id"],
            "state": self.state,
            "error": self.error,
            "budget": self.budget,
            "at_once": self.at_once,
            "metric": self.settings.metric,
            "direction": self.settings.goal,
            "updated": time.time(),
            "driver_pid": os.getpid(),
            "trials": trials,
            "best": trials[best]["number"] if best is not None else None,
        }


def _last(values: dict[int, float]) -> float | None:
    return values[max(values)] if values else None


def _stop_quietly(run: Run, by: str) -> None:
    try:
        run.stop(by=by)
    except Exception as e:  # noqa: BLE001 - said in the log; the run's own state says the rest
        _say(f"stopping run {run.id}: {e}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m nbtrain.control.sweep.driver SWEEP_DIR", file=sys.stderr)
        return 2
    paths = SweepPaths(Path(argv[0]).resolve())
    lock = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"another driver is running sweep {paths.root}; not starting a second", file=sys.stderr)
        return 3
    driver = None
    try:
        driver = Driver(paths)
        return driver.run()
    except Exception:  # noqa: BLE001 - the sweep says it failed and why; its trials' runs go on
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        if driver is not None:
            driver.state, driver.error = "failed", tb.strip().splitlines()[-1]
            with contextlib.suppress(Exception):
                driver.write(force=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
