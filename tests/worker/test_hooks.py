"""hooks: in real runs of the tiny model: the notebook's callbacks, compute_metrics, loss and preprocess
captured in the kernel, loaded by the (warm-forked) worker and used by the trainer; a hook that raises
fails the run naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain.contract.errors import RunFailed
from nbtrain.examples import addition_items
from tests.conftest import runs_in

pytestmark = pytest.mark.slow

# A notebook cell, run as the notebook runs it (in __main__), so its objects travel by value as a
# notebook's do. The data file has q/a columns: only preprocess makes them rows nbtrain trains on.
NOTEBOOK = """
import json, os
from transformers import TrainerCallback


class CountSteps(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1

    def on_train_end(self, args, state, control, **kwargs):
        with open(os.path.join(os.path.dirname(args.output_dir), "seen-by-callback.json"), "w") as f:
            json.dump({"steps": self.steps, "global_step": state.global_step}, f)


def doubled_loss(args, state, control, logs=None, **kwargs):
    if logs and "loss" in logs:
        logs["loss_x2"] = 2 * logs["loss"]


def to_messages(row):
    return {"messages": [{"role": "user", "content": row["q"]}, {"role": "assistant", "content": row["a"]}]}


def argmax(logits, labels):
    return logits.argmax(-1)


def token_match(eval_pred):
    preds, labels = eval_pred.predictions[:, :-1], eval_pred.label_ids[:, 1:]
    mask = labels != -100
    return {"token_match": float((preds[mask] == labels[mask]).mean())}


def summed_ce(outputs, labels, num_items_in_batch=None, _calls=[0]):
    import torch.nn.functional as F

    _calls[0] += 1
    if _calls[0] == 1:
        print("notebook loss: first call", flush=True)
    logits, target = outputs.logits[:, :-1].float(), labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=-100,
                           reduction="sum")
    return loss / (num_items_in_batch if num_items_in_batch is not None else (target != -100).sum())


def broken_metrics(eval_pred):
    raise ValueError("no answers to compare")
"""

HOOKS = """\
hooks:
  callbacks: [CountSteps, doubled_loss]
  compute_metrics: token_match
  loss: summed_ce
  preprocess: to_messages
  preprocess_logits_for_metrics: argmax
"""


def notebook() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(NOTEBOOK, "<notebook cell>", "exec"), ns)
    return ns


def config(hooks: str, max_steps: int = 4) -> str:
    return f"""\
model: ./tiny-llama
method: lora
data:
  train: data/qa.jsonl
  eval_split: 8
train:
  max_steps: {max_steps}
  learning_rate: 3.0e-3
  per_device_train_batch_size: 4
  logging_steps: 1
  eval_steps: 2
{hooks}"""


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[tuple[Path, nbtrain.Run]]:
    """One run with every hook (its folder and handle), shared by the tests of this module."""
    work = tmp_path_factory.mktemp("hooks")
    (work / "tiny-llama").symlink_to(tiny_model)
    (work / "data").mkdir()
    rows = [{"q": q, "a": a} for q, a in addition_items(40)]
    (work / "data" / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with runs_in(work):
        run = nbtrain.finetune(config(HOOKS), name="hooked", namespace=notebook())
        run.wait(timeout=600)
        yield work, run


def test_every_hook_is_used_by_the_trainer(hooked: tuple[Path, nbtrain.Run]) -> None:
    _, run = hooked
    st = run.status()
    assert st.state == "completed" and st.step == 4
    log = run.logs(400)
    # captured beside the run, loaded by the worker
    assert (run.dir / "hooks.pkl").is_file() and (run.dir / "hooks.pkl").stat().st_mode & 0o777 == 0o600
    assert (
        "nbtrain: hooks: callbacks CountSteps, doubled_loss; compute_metrics token_match; loss summed_ce"
        in log
    )
    # preprocess made the q/a rows conversations (the kernel looked at them after it, and so did the worker)
    assert run.resolved["data"]["train"]["format"] == "messages"
    assert "32 training rows (messages), 8 eval rows" in log
    # the loss the trainer trained on was the notebook's
    assert "notebook loss: first call" in log
    # the callback class was made and called at every step; the function's addition to the logs was written
    assert json.loads((run.dir / "seen-by-callback.json").read_text()) == {"steps": 4, "global_step": 4}
    m = run.metrics()
    steps = m.dropna(subset=["loss"])
    assert (steps["loss_x2"] == 2 * steps["loss"]).all() and len(steps) == 4


def test_compute_metrics_lands_in_metrics_jsonl_marked_as_the_notebooks(
    hooked: tuple[Path, nbtrain.Run],
) -> None:
    _, run = hooked
    records = [json.loads(line) for line in run.paths.metrics.read_text().splitlines()[1:]]
    evals = [r for r in records if "eval_token_match" in r]
    assert [r["step"] for r in evals] == [2, 4]  # eval_steps: 2 of 4
    for r in evals:
        assert 0.0 <= r["eval_token_match"] <= 1.0 and "eval_loss" in r
        assert r["notebook_metrics"] == ["eval_token_match"]
    assert all("notebook_metrics" not in r for r in records if "eval_token_match" not in r)


def test_evaluation_and_the_preview_read_the_rows_through_preprocess(
    hooked: tuple[Path, nbtrain.Run],
) -> None:
    """The q/a rows are data only after hooks: preprocess: the evaluation job measures the 8 rows training
    held out (the trainer's last eval loss), and the preview tokenises conversations."""
    from nbtrain.contract.rundir import read_jsonl
    from nbtrain.control.jobs.preview import preview_data

    work, run = hooked
    with runs_in(work):
        report = nbtrain.evaluate(run, timeout=600)
        data, source = preview_data(run, n=1, stats_rows=40)
    assert report.data["data"]["rows"] == 8 and "eval_split" in report.data["data"]["source"]
    last_eval = [r["eval_loss"] for r in read_jsonl(run.paths.metrics) if "eval_loss" in r][-1]
    assert report.models["tuned"]["loss"] == pytest.approx(last_eval, rel=1e-3)
    text = "".join(seg[0] for seg in data["examples"][0]["segments"])
    assert source == run.id and data["stats"]["rows"] == 40
    assert text.startswith("<|user|>\nWhat is ") and "<|assistant|>\n" in text


def test_a_hook_that_raises_fails_the_run_naming_it(hooked: tuple[Path, nbtrain.Run]) -> None:
    work, _ = hooked
    hooks = "hooks:\n  compute_metrics: broken_metrics\n  preprocess: to_messages\n"
    with runs_in(work):
        run = nbtrain.finetune(config(hooks, max_steps=2), name="broken", namespace=notebook())
        with pytest.raises(RunFailed):
            run.wait(timeout=600)
    err = run.status().error or {}
    assert err["type"] == "HookError"
    assert (
        err["message"] == "hooks: compute_metrics (broken_metrics) raised ValueError: no answers to compare"
    )
    # the hook's own traceback, below nbtrain's
    tb = err["traceback"]
    assert ", in broken_metrics\n" in tb and "ValueError: no answers to compare\n" in tb
    assert tb.index(", in broken_metrics") < tb.index("The above exception was the direct cause")
    assert not run.output_dir.exists()
