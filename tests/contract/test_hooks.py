"""hooks: in the kernel: each name looked up in the notebook and captured before anything starts, every
problem refused with the key, its line and the fix, the rows looked at after hooks: preprocess, and the
combinations the trainers cannot take refused. (The runs that use them: tests/worker/test_hooks.py.)"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.contract import hooks
from nbtrain.contract.errors import ConfigError
from nbtrain.contract.pickles import write_private
from nbtrain.examples import write_dataset


def yaml_for(
    hooks_yaml: str, *, data: str = "data/add.jsonl", objective: str = "sft", extra: str = ""
) -> str:
    return f"""\
model: ./tiny-llama
objective: {objective}
data:
  train: {data}
train:
  max_steps: 2
{extra}{hooks_yaml}"""


def problems_of(text: str, namespace: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as ei:
        nbtrain.prepare(text, namespace=namespace)
    return {p.path: p.render() for p in ei.value.problems}


def exact(eval_pred: Any) -> dict[str, float]:
    return {"exact": 1.0}


def test_a_missing_name_fails_before_start_and_leaves_no_run_directory(workdir: Path) -> None:
    text = yaml_for("hooks:\n  compute_metrics: exakt\n", extra="  eval_steps: 1\n").replace(
        "  train: data/add.jsonl", "  train: data/add.jsonl\n  eval_split: 0.1"
    )
    with pytest.raises(ConfigError) as ei:
        nbtrain.finetune(text, namespace={"exact": exact})
    (p,) = ei.value.problems
    assert p.path == "hooks.compute_metrics" and p.line == 10
    assert p.message.startswith(
        "hooks: compute_metrics: no function named 'exakt' in the notebook; did you mean 'exact'? Otherwise "
        "define it in a cell run before this one (compute_metrics(eval_pred) -> dict of numbers"
    )
    runs_root = Path(os.environ["NBTRAIN_RUNS_DIR"])
    assert nbtrain.runs() == [] and (not runs_root.exists() or not any(runs_root.iterdir()))
    # with the function defined, the same config captures it
    prep = nbtrain.prepare(text, namespace={"exakt": exact})
    assert prep.hooks is not None and "hooks:     compute_metrics exakt" in prep.summary()


def test_objects_the_trainer_cannot_call_or_the_worker_cannot_load_are_refused(workdir: Path) -> None:
    from transformers import TrainerCallback

    class NeedsArgs(TrainerCallback):
        def __init__(self, path: str) -> None:
            self.path = path

    class NotACallback:
        def on_log(self, *args: Any, **kwargs: Any) -> None: ...

    lock = threading.Lock()

    def on_log_no_kwargs(args: Any, state: Any, control: Any) -> None: ...

    def locked(row: dict[str, Any]) -> dict[str, Any]:
        with lock:
            return row

    def metrics_two(eval_pred: Any, extra: Any) -> dict[str, float]:
        return {}

    def loss_no_items(outputs: Any, labels: Any) -> Any: ...

    namespace = {
        "NeedsArgs": NeedsArgs, "NotACallback": NotACallback, "on_log_no_kwargs": on_log_no_kwargs,
        "locked": locked, "metrics_two": metrics_two, "loss_no_items": loss_no_items, "ratio": 0.5,
    }  # fmt: skip
    text = yaml_for(
        "hooks:\n  callbacks: [NeedsArgs, NotACallback, on_log_no_kwargs]\n  compute_metrics: metrics_two\n"
        "  loss: loss_no_items\n  preprocess: locked\n  preprocess_logits_for_metrics: ratio\n"
    ).replace("  train: data/add.jsonl", "  train: data/add.jsonl\n  eval_split: 0.1")
    out = problems_of(text, namespace)
    assert set(out) == {
        "hooks.callbacks.0", "hooks.callbacks.1", "hooks.callbacks.2", "hooks.compute_metrics", "hooks.loss",
        "hooks.preprocess", "hooks.preprocess_logits_for_metrics",
    }  # fmt: skip
    assert (
        "needs arguments, and a callback class is made with none; make one in the notebook (my_callback = "
        "NeedsArgs(...))" in out["hooks.callbacks.0"]
    )
    assert (
        "NotACallback is a class that does not subclass transformers.TrainerCallback"
        in out["hooks.callbacks.1"]
    )
    assert "def on_log_no_kwargs(args, state, control, logs=None, **kwargs)" in out["hooks.callbacks.2"]
    assert "Write it as def metrics_two(eval_pred)" in out["hooks.compute_metrics"]
    assert "Write it as def loss_no_items(outputs, labels, num_items_in_batch=None)" in out["hooks.loss"]
    assert "'locked' cannot be serialised for the training process" in out["hooks.preprocess"]
    assert "'ratio' in the notebook is a float, not a function" in out["hooks.preprocess_logits_for_metrics"]
    # each at its own line of the cell
    assert "(line 9: 'callbacks: [NeedsArgs, NotACallback, on_log_no_kwargs]')" in out["hooks.callbacks.0"]


def test_hooks_the_objective_data_or_launcher_cannot_take_are_refused(workdir: Path) -> None:
    write_dataset(workdir / "data" / "pref.jsonl", "preference", n=16)
    write_dataset(workdir / "data" / "prompt.jsonl", "prompt", n=16)
    ns = {"exact": exact, "argmax": lambda logits, labels: logits}
    out = problems_of(yaml_for("hooks: {loss: exact, compute_metrics: exact}\n", data="data/pref.jsonl",
                               objective="dpo"), ns)  # fmt: skip
    assert "hooks: loss applies to objective: sft (TRL's dpo trainer computes" in out["hooks.loss"]
    assert "this run has no eval data: add data: eval_split: 0.1" in out["hooks.compute_metrics"]
    grpo = yaml_for(
        "rewards: [length_reward]\nhooks: {compute_metrics: exact}\n", data="data/prompt.jsonl",
        objective="grpo", extra="  per_device_train_batch_size: 2\n  num_generations: 2\n",
    )  # fmt: skip
    assert "which TRL's GRPO trainer does not have" in problems_of(grpo, ns)["hooks.compute_metrics"]
    out = problems_of(yaml_for("hooks: {preprocess_logits_for_metrics: argmax}\n"), ns)
    assert (
        "prepares the logits for compute_metrics; add compute_metrics"
        in out["hooks.preprocess_logits_for_metrics"]
    )
    out = problems_of(yaml_for("hooks: {callbacks: exact}\ndistributed: {launcher: notebook}\n"), ns)
    assert "launcher: notebook runs a training function of yours instead" in out["hooks"]


def to_messages(row: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": row["q"]}, {"role": "assistant", "content": row["a"]}]}


def test_the_rows_are_looked_at_after_preprocess_and_a_failing_preprocess_stops_the_start(
    workdir: Path,
) -> None:
    rows = [{"q": "What is 1 + 1?", "a": "1 + 1 = 2"}] * 4 + [{"question": "no q here", "a": "?"}]
    (workdir / "data" / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    text = yaml_for("hooks: {preprocess: to_messages}\n", data="data/qa.jsonl")
    out = problems_of(text, {"to_messages": to_messages})
    assert out["data.train"].endswith(
        "hooks: preprocess (to_messages) raised KeyError: 'q' on row 5 of qa.jsonl (nbtrain tries it on the "
        "first rows before starting); fix the function and run its cell again"
    )
    (workdir / "data" / "qa.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows[:4]), encoding="utf-8"
    )
    prep = nbtrain.prepare(text, namespace={"to_messages": to_messages})
    assert prep.resolved.train_data.format == "messages"  # what the worker will train on
    assert prep.hooks is not None
    write_private(workdir / hooks.HOOKS_FILE, prep.hooks)
    loaded = hooks.load(workdir / hooks.HOOKS_FILE)
    assert loaded["preprocess"]["name"] == "to_messages" and loaded["preprocess"]["obj"](
        rows[0]
    ) == to_messages(rows[0])
    # without the notebook (a resume, the server's check) the rows' format is left to the worker
    later = nbtrain.prepare(text, capture_notebook=False)
    assert later.hooks is None and later.resolved.train_data.format == "auto"
    # the plain rows, without preprocess: not data nbtrain trains on, said before start
    plain = problems_of(yaml_for("", data="data/qa.jsonl"), {})
    assert "row 1 matches no known format (keys: ['a', 'q'])" in plain["data.train"]
