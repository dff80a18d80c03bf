"""Export a run as a standalone model directory (kernel side; the work is ``nbtrain.worker.jobs.export``).

    nbtrain.export(run, to="merged-model", merge=True, dtype="bf16")      # or Run.export(...)
    %finetune export RUN --to merged-model [--no-merge] [--dtype bf16] [--push-to-hub user/repo]

Everything that can be checked without loading a model is checked here first (the run has trained
weights, the dtype is known, the target is new or empty, the repo id is well formed), so bad input starts
nothing. The worker runs in its own session with its log in ``<run>/logs/export.log``.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.control.process import run_job
from nbtrain.control.runs.run import Run, get_run, last_checkpoint

DTYPES = ("auto", "fp32", "bf16", "fp16", "float32", "bfloat16", "float16")
_REPO_ID = re.compile(r"^([A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


@dataclass
class ExportResult:
    dir: Path
    kind: str  # merged | full | adapter
    record: dict[str, Any]
    files: list[str] = field(default_factory=list)
    pushed: str | None = None

    def __repr__(self) -> str:
        pushed = f", pushed to {self.pushed}" if self.pushed else ""
        rec = self.record
        return f"<export {self.kind} of run {rec.get('run_id')} in {self.dir} ({rec.get('dtype')}){pushed}>"

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(repr(self))}\n{html.escape(json.dumps(self.record, indent=2))}</pre>"


def has_trained_weights(run: Run) -> bool:
    out = run.paths.output
    return (
        (out / "adapter_config.json").exists()
        or (out / "config.json").exists()
        or (last_checkpoint(run) is not None)
    )


def export(
    run: str | Path | Run,
    *,
    to: str | Path,
    merge: bool = True,
    dtype: str = "auto",
    overwrite: bool = False,
    push_to_hub: str | None = None,
    private: bool = True,
    timeout: float | None = None,
) -> ExportResult:
    """Write the run's model to ``to``: merged into the base (default; QLoRA into the de-quantised base)
    so ``AutoModelForCausalLM.from_pretrained(to)`` works, or its adapter only (``merge=False``).

    ``dtype``: auto (the base model's), fp32, bf16 or fp16. A non-empty ``to`` is refused unless
    ``overwrite``. ``push_to_hub="user/repo"`` uploads the result afterwards (a private repo unless
    ``private=False``); if that fails, the local export is kept and the error says so.
    """
    r = get_run(run)
    problems = []
    if not has_trained_weights(r):
        problems.append(
            f"run {r.id} has no trained weights yet (no output/ and no complete checkpoint); wait for it "
            f"to finish, or ask it for a checkpoint (%finetune checkpoint {r.id})"
        )
    if dtype not in DTYPES:
        problems.append(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    target = Path(to).expanduser().resolve()
    if target.exists() and not target.is_dir():
        problems.append(f"{target} is a file; give a directory path to export to")
    elif target.is_dir() and any(target.iterdir()) and not overwrite:
        problems.append(
            f"{target} is not empty; give a new directory, or overwrite=True (--overwrite) to replace it"
        )
    if push_to_hub is not None and not _REPO_ID.match(push_to_hub):
        problems.append(f"push_to_hub {push_to_hub!r} is not a hub repo id such as 'user/my-model'")
    if problems:
        raise NbtrainError("not exported: " + "; ".join(problems))
    args = [str(r.dir), "--to", str(target), "--dtype", dtype, "--merge" if merge else "--no-merge"]
    if overwrite:
        args.append("--overwrite")
    if push_to_hub:
        args += ["--push-to-hub", push_to_hub] + ([] if private else ["--public"])
    log = r.paths.logs / "export.log"
    result_file = r.paths.logs / "export.result.json"
    args += ["--result", str(result_file)]
    code, res = run_job("nbtrain.worker.jobs.export", args, log=log, result=result_file, cwd=r.dir,
                        what=f"export of run {r.id}", timeout=timeout)  # fmt: skip
    if not res.get("ok"):
        raise NbtrainError(f"export of run {r.id} failed: {res.get('error')}; see {log}")
    record = res["record"]
    out = ExportResult(target, record["kind"], record, list(res.get("files") or []), res.get("pushed"))
    if res.get("push_error"):
        raise NbtrainError(
            f"exported to {target}, but pushing it to the hub repo {push_to_hub!r} failed: "
            f"{res['push_error']}. Check the network and your login (`hf auth login` or HF_TOKEN), then "
            f"push {target} again (export(..., overwrite=True, push_to_hub=...) or "
            f"huggingface_hub.upload_folder)"
        )
    if code != 0:
        raise NbtrainError(f"export of run {r.id} ended with exit code {code}; see {log}")
    return out
