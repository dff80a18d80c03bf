"""Running nbtrain side by side with another fine-tuning tool (LLaMA-Factory, ms-swift): the pieces the
comparisons share.

- ``Peer``: a tool in a venv of its own, built by its set-up script (bench/setup_<name>.sh; the tools pin
  older transformers/trl/peft than nbtrain's, so they cannot share nbtrain's venv); ``missing`` says in
  one message what to run when the venv is not there, ``setup`` runs the script.
- ``run_peer``: runs the tool's own command line and measures what the nbtrain runs report, the same
  way for every tool: time to first step from the moment the process is asked for, steps/s from the
  median step interval, peak RSS of the whole process tree (bench_overhead.watch), the last logged loss.
  The step times come from a step clock put into the tool's training process (``STEP_CLOCK``, a
  ``sitecustomize`` on PYTHONPATH, inherited by the processes the tool's CLI starts): once the tool
  imports ``transformers.trainer`` it adds one ``TrainerCallback`` to every Trainer, which notes the
  time at each step's end and each logged loss, and writes them out when training ends. It changes
  nothing else; each tool's own log files have no timestamps finer than a second.
- ``run_nbtrain_as``: nbtrain cold (``NBTRAIN_WARM=0``: a new Python process imports the stack) or warm
  (forked by the warm process, ``start_warm``), checked from the run's log.
- ``rotated``: the order of the systems in repeat i (each one first in turn).
- ``lora_job``: the job every system runs (the tiny-model LoRA config), resolved by nbtrain: its
  resolved.json (the bare TRL script's input) and the settings the peers' own configs are written from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_overhead import run_nbtrain, steady, watch  # noqa: E402

CLOCK_ENV = "NBTRAIN_BENCH_STEP_CLOCK"
STEP_CLOCK = textwrap.dedent(
    """
    # Written by nbtrain's bench/peers.py: a step clock for a peer tool's training process. Standard
    # library only until the tool itself imports transformers.trainer.
    import os
    import sys

    _OUT = os.environ.get("NBTRAIN_BENCH_STEP_CLOCK")


    def _patch(mod):
        import functools
        import json
        import time

        from transformers.trainer_callback import TrainerCallback

        steps, losses = [], []

        class StepClock(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                steps.append(time.time())

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    losses.append([state.global_step, float(logs["loss"])])

            def on_train_end(self, args, state, control, **kwargs):
                with open(_OUT, "w") as f:
                    json.dump({"step_times": steps, "losses": losses}, f)

        init = mod.Trainer.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.add_callback(StepClock())

        mod.Trainer.__init__ = __init__


    class _Finder:
        def find_spec(self, name, path=None, target=None):
            if name != "transformers.trainer":
                return None
            sys.meta_path.remove(self)
            import importlib.util

            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _patch(module)

            spec.loader.exec_module = exec_module
            return spec


    if _OUT:
        sys.meta_path.insert(0, _Finder())
    """
)


@dataclass(frozen=True)
class Peer:
    """A tool in its own venv: ``bench/.venv-<name>``, built by ``bench/setup_<name>.sh``."""

    name: str  # as in the file names: llamafactory, msswift
    title: str  # as users know it
    cli: str  # the command in the venv's bin/
    entry: str  # the module its training command imports: the set-up is done when this imports
    packages: tuple[str, ...]  # versions recorded in the results

    @property
    def venv(self) -> Path:
        """``$<NAME>_VENV`` where set (as the set-up script reads it), else bench/.venv-<name>."""
        return Path(os.environ.get(f"{self.name.upper()}_VENV") or ROOT / "bench" / f".venv-{self.name}")

    @property
    def script(self) -> Path:
        return ROOT / "bench" / f"setup_{self.name}.sh"

    @property
    def log(self) -> Path:
        return self.venv.with_name(f".venv-{self.name}.log")

    @property
    def exe(self) -> Path:
        return self.venv / "bin" / self.cli

    def missing(self) -> str | None:
        """Why the venv cannot run the tool, with what to run; None when it can."""
        py, venv = self.venv / "bin" / "python", _shown(self.venv)
        if not (py.exists() and self.exe.exists()):
            why = f"{self.title}'s venv {venv} is missing (no bin/{self.cli})"
        else:
            rc = subprocess.run([str(py), "-c", f"import {self.entry}"], capture_output=True, check=False)
            if rc.returncode == 0:
                return None
            why = f"{self.title}'s venv {venv} does not import {self.entry}"
        return (f"{why}: run `bash {_shown(self.script)}` (installs {self.title} from PyPI into its own "
                "venv, a few minutes and ~2 GB), or pass --setup, then run this again")  # fmt: skip

    def setup(self) -> str | None:
        """Run the set-up script (a no-op once the venv works), its output to ``log``; the failure."""
        with open(self.log, "a") as f:
            rc = subprocess.run(["bash", str(self.script)], stdout=f, stderr=subprocess.STDOUT, check=False)
        if rc.returncode == 0 and self.exe.exists():
            return None
        lines = self.log.read_text(errors="replace").splitlines()
        tail = [ln for ln in lines if not ln.startswith("WARNING: Location")]
        head = f"{_shown(self.script)} failed (rc {rc.returncode}); the end of {self.log}:\n"
        return head + "\n".join(tail[-15:])

    def versions(self) -> dict[str, str]:
        code = (
            "import importlib.metadata as m, json\n"
            f"print(json.dumps({{p: m.version(p) for p in {self.packages!r}}}))"
        )
        out = subprocess.run(
            [str(self.venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
        )
        return dict(json.loads(out.stdout))


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it lies in it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def run_peer(
    argv: Sequence[str], cwd: Path, log: Path, *, env: dict[str, str] | None = None, skip: int = 2
) -> dict[str, float]:
    """Run a peer's command line (in ``cwd``, its output to ``log``, ``env`` added to this process's) with
    the step clock in its training process; what it measured (steps/s: the median interval between the
    steps after the first ``skip``)."""
    clock_dir = cwd / "step-clock"
    clock_dir.mkdir(exist_ok=True)
    (clock_dir / "sitecustomize.py").write_text(STEP_CLOCK)
    clock = cwd / "step-clock.json"
    clock.unlink(missing_ok=True)
    path = os.pathsep.join(p for p in (str(clock_dir), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": path,
        CLOCK_ENV: str(clock),
        "TOKENIZERS_PARALLELISM": "false",
    }
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(list(argv), cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        peak = watch(psutil.Process(proc.pid), lambda: proc.poll() is not None)
    if proc.returncode != 0 or not clock.exists():
        tail = log.read_text(errors="replace")[-3000:]
        why = f"rc {proc.returncode}" if proc.returncode else "its training never ended (no step clock)"
        raise RuntimeError(f"{argv[0]} failed ({why}):\n{tail}")
    got = json.loads(clock.read_text())
    times = got["step_times"]
    return {
        "first_step_s": times[0] - t0,
        "steady_steps_per_s": steady(times, skip),
        "final_loss": got["losses"][-1][1],
        "peak_rss": peak,
    }


def start_warm() -> dict[str, Any]:
    """Start this process's nbtrain warm process (as ``%load_ext nbtrain`` does) and wait until it serves."""
    from nbtrain.control.launch import warm

    warm.start()
    while not (mine := [w for w in warm.status() if w["this_kernel"]]):
        time.sleep(0.2)
    return dict(mine[0])


def run_nbtrain_as(warm: bool, config: str, work: Path, name: str, *, skip: int = 2) -> dict[str, float]:
    """One nbtrain run, forked by the warm process or cold; the run's log must say which it was. A warm
    run that went cold because nbtrain's files changed under the warm process (a working tree being
    edited while the bench runs) is run again, up to twice, once nbtrain's fresh warm process is up."""
    os.environ["NBTRAIN_WARM"] = "1" if warm else "0"
    for attempt in range(3):
        run_name = f"retry{attempt}-{name}" if attempt else name
        t = time.time()
        r = run_nbtrain(config, work, run_name, skip=skip)
        log = next((work / "runs").glob(f"*{run_name}*/logs/rank0.log")).read_text()
        if ("cold start" in log) != warm:
            return r
        if not (warm and "changed since" in log):
            break
        _wait_for_warm(started_after=t)
    raise RuntimeError(
        f"nbtrain run {run_name} was meant to start {'warm' if warm else 'cold'}:\n{log[:400]}"
    )


def _wait_for_warm(started_after: float, timeout: float = 300) -> None:
    from nbtrain.control.launch import warm

    deadline = time.time() + timeout
    while time.time() < deadline:
        now = time.time()
        if any(w["this_kernel"] and now - w["uptime_s"] > started_after for w in warm.status()):
            return
        warm.start()  # nbtrain asked for a fresh one; this starts it if the stale one held the lock then
        time.sleep(1)
    raise RuntimeError(f"no fresh nbtrain warm process within {timeout:.0f} s")


def rotated(systems: Sequence[str], i: int) -> list[str]:
    """The order of repeat ``i``: each system starts a repeat in turn, so a slow spell of a shared machine
    or caches warmed by the one before do not always favour the same one."""
    k = i % len(systems)
    return [*systems[k:], *systems[:k]]


# Everyday chat prompts the serving benchmarks ask (bench_gguf the first 8, bench_serving all).
CHAT_PROMPTS = [
    "Name three colours of the rainbow.",
    "What is the capital of Italy?",
    "Give me a short tip for sleeping well.",
    "What do bees make?",
    "Write one sentence about the sea.",
    "How many days are in a week?",
    "What is a synonym of happy?",
    "Describe a cat in one sentence.",
    "Why is the sky blue?",
    "Name a fruit that is yellow.",
    "What is 12 times 12?",
    "Suggest a name for a dog.",
]


def lora_config(model: Path, data: Path, steps: int, extra: str = "", train_extra: str = "") -> str:
    """The benchmarks' LoRA job: batch 8, lr 1e-3, no checkpoints, a loss logged at every step;
    ``train_extra`` adds keys to its train section (", key: value")."""
    return (
        textwrap.dedent(
            f"""
        model: {model}
        method: lora
        data: {{train: {data}}}
        train: {{max_steps: {steps}, per_device_train_batch_size: 8, learning_rate: 1.0e-3,
                 save_strategy: "no", logging_steps: 1{train_extra}}}
        """
        )
        + extra
    )


def lora_job(model: Path, data: Path, steps: int, resolved: Path) -> tuple[str, dict[str, Any]]:
    """(nbtrain's config, the settings a peer's config is written from); nbtrain's resolved job is
    written to ``resolved`` for the bare TRL script."""
    import nbtrain
    from nbtrain.control.config import trainargs

    config = lora_config(model, data, steps)
    prep = nbtrain.prepare(config)
    resolved.write_text(json.dumps(prep.to_dict()))
    est_inputs = prep.plan.estimate["inputs"] if prep.plan.estimate else {}
    return config, {
        "lora": prep.to_dict()["config"]["lora"], "train_args": prep.train_args,
        "targets": est_inputs.get("lora_targets") or ["q_proj", "v_proj"],
        "max_length": trainargs.value(prep.train_args, "max_length"),
    }  # fmt: skip
