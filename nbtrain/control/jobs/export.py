"""Export a run as a standalone model directory (kernel side; the work is ``nbtrain.worker.jobs.export``).

    nbtrain.export(run, to="merged-model", merge=True, dtype="bf16")      # or Run.export(...)
    nbtrain.export(run, to="gguf-model", format="gguf", quant=["f16", "q8_0", "q4_k_m"])
    %finetune export RUN --to merged-model [--no-merge] [--dtype bf16] [--push-to-hub user/repo]
    %finetune export RUN --to gguf-model --format gguf --quant f16,q8_0,q4_k_m

GGUF (llama.cpp, Ollama, LM Studio): ``nbtrain.worker.jobs.export_gguf``; llama.cpp set up once per
machine (``nbtrain.control.jobs.llamacpp``). Its model family is checked against the converter's own list
here.

Everything that can be checked without loading a model is checked here first (the run has trained
weights, the dtype is known, the target is new or empty, the repo id is well formed), so bad input starts
nothing. The worker runs in its own session with its log in ``<run>/logs/export.log``.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.exports import protected_dirs, target_problem
from nbtrain.contract.paths import home_dir
from nbtrain.control.launch.process import run_job
from nbtrain.control.runs.run import Run, get_run, has_trained_weights

FORMATS = ("hf", "gguf")
DTYPES = ("auto", "fp32", "bf16", "fp16", "float32", "bfloat16", "float16")
_REPO_ID = re.compile(r"^([A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*\Z")


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
        what = _gguf_types(rec) if self.kind.startswith("gguf") else rec.get("dtype")
        head = f"<export {self.kind} of run {rec.get('run_id')} in {self.dir} ({what}){pushed}>"
        return head + "\n" + gguf_table(rec.get("gguf") or {}) if self.kind.startswith("gguf") else head

    def summary(self) -> list[tuple[str, str]]:
        """What a person wants to know of the export, as (label, value) rows."""
        rec = self.record
        name = rec.get("run_name") or rec.get("run_id")
        rows = [
            ("run", f"{name} ({rec.get('run_id')}), step {rec.get('step')}"),
            ("what", f"{self.kind}: {rec.get('method')} {rec.get('objective')} of {rec.get('base_model')}"),
            ("where", str(self.dir)),
        ]
        if self.kind.startswith("gguf"):  # each file's own type; the merge's float is only a step there
            rows.append(("GGUF types", _gguf_types(rec)))
        elif rec.get("dtype"):
            rows.append(("precision", str(rec["dtype"])))
        if self.files:
            size = sum(p.stat().st_size for f in self.files if (p := self.dir / f).is_file())
            rows.append(("files", f"{len(self.files)}, {size / 2**20:,.1f} MiB"))
        if self.pushed:
            rows.append(("on the Hub", self.pushed))
        if not self.kind.startswith("gguf"):
            how = "PeftModel.from_pretrained(base, DIR)" if self.kind == "adapter" else "from_pretrained(DIR)"
            rows.append(("load it", f"{how}, or serve / chat on the run"))
        return rows

    def _repr_html_(self) -> str:
        th = "<th style='text-align:left;padding-right:1em'>"
        rows = self.summary()
        cells = "".join(f"<tr>{th}{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
        gguf = self.record.get("gguf")
        checks = ""
        if self.kind.startswith("gguf") and gguf:
            checks = f"<pre>{html.escape(gguf_table(gguf))}</pre>"
        record = html.escape(json.dumps(self.record, indent=2))
        return (
            f"<b>nbtrain export</b><table>{cells}</table>{checks}<details><summary>the export's record "
            f"(nbtrain_export.json)</summary><pre>{record}</pre></details>"
        )


def _gguf_types(record: dict[str, Any]) -> str:
    """The types of a GGUF export's files ("f16, q4_k_m"), never the float the merge went through."""
    return ", ".join((record.get("gguf") or {}).get("files") or record.get("quants") or [])


# A GGUF file "matches" the full model when at least this share of its answers are the full model's; a
# model that answers under TRAINED_ENOUGH of its own held-out prompts right is not worth exporting yet.
MATCHES = 0.9
TRAINED_ENOUGH = 0.5


def _right(ref: dict[str, Any], n: int) -> tuple[int, int] | None:
    """(answers right, answers scored) of the full model; reports before the counts: from its accuracy."""
    if ref.get("scored"):
        return int(ref["right"]), int(ref["scored"])
    acc = ref.get("accuracy")
    return (round(acc * n), n) if acc is not None and n else None


def gguf_verdict(report: dict[str, Any]) -> str | None:
    """One sentence on the check: how often each file answers as the full model (merged, in transformers)
    does, how often that model itself answers right, and what to do about it. None when nothing was
    checked."""
    n = report.get("prompts", 0)
    files = {q: int(f["same_as_transformers"]) for q, f in (report.get("files") or {}).items()
             if "same_as_transformers" in f}  # fmt: skip
    if not n or not files:
        return None
    said = [f"{q} on {same}/{n}" for q, same in files.items()]
    text = f"{said[0].replace(' on ', ' matches the full model on ', 1)}{''.join(', ' + x for x in said[1:])}"
    text += " prompts"
    right = _right(report.get("transformers") or {}, n)
    if right is not None:
        text += f"; the model itself answers {right[0]}/{right[1]} right"
    worst = min(files, key=lambda q: files[q])
    if right is not None and right[0] < TRAINED_ENOUGH * right[1]:
        return f"{text}: train longer before exporting"
    if files[worst] < MATCHES * n:
        better = [q for q in files if files[q] >= MATCHES * n]
        use = f"use {better[0]}" if better else "a larger type (q8_0, f16) keeps more of them"
        return f"{text}: {worst} changes {n - files[worst]} of the answers; {use} where they must hold"
    return f"{text}: ready to use"


def gguf_table(report: dict[str, Any]) -> str:
    """The GGUF export's check: its verdict, one line a file, and the Ollama command."""
    n = report.get("prompts", 0)
    verdict = gguf_verdict(report)
    lines = [verdict] if verdict else []
    lines.append(
        f"checked on {n} prompts ({report.get('prompts_from')})" if n else "not checked: no SFT prompts"
    )
    ref = (report.get("transformers") or {}).get("accuracy")
    if ref is not None:
        lines.append(f"  transformers (merged model): accuracy {ref:.2f}")
    for q, f in (report.get("files") or {}).items():
        size = f"{f['bytes'] / 2**20:,.1f} MiB"
        if "same_as_transformers" in f:
            acc = "" if f.get("accuracy") is None else f", accuracy {f['accuracy']:.2f}"
            lines.append(f"  {q:<7} {size:>11}  answers as transformers' {f['same_as_transformers']}/{n}"
                         f"{acc}, {f['tokens_per_s']:.0f} tokens/s in llama.cpp")  # fmt: skip
        else:
            lines.append(f"  {q:<7} {size:>11}")
    create = (report.get("ollama") or {}).get("create")
    if create:
        lines.append(f"Ollama: {create}")
    return "\n".join(lines)


def _quants(quant: str | list[str] | None) -> list[str]:
    if quant is None:
        return ["f16"]
    items = quant.split(",") if isinstance(quant, str) else list(quant)
    return list(dict.fromkeys(str(q).strip().lower() for q in items if str(q).strip()))


def gguf_problems(run: Run, quants: list[str], merge: bool) -> list[str]:
    """What stops a GGUF export of ``run`` before anything starts: llama.cpp not set up, an unknown type,
    a model family llama.cpp's converter does not convert, a vision model, no merge."""
    from nbtrain.contract.ggufcache import GGUF_LORA_TYPES, GGUF_QUANTS
    from nbtrain.control.jobs import llamacpp

    problems = []
    unknown = [q for q in quants if q not in GGUF_QUANTS]
    if unknown or not quants:
        problems.append(f"quant {', '.join(unknown) or '(none)'}: give some of {', '.join(GGUF_QUANTS)}")
    method = run_method(run)
    if not merge and method != "lora":
        problems.append(
            f"--no-merge (the adapter as a GGUF LoRA) is for LoRA runs; this is a {method} run: leave "
            "merge on"
        )
    elif not merge and (odd := [q for q in quants if q not in GGUF_LORA_TYPES]):
        problems.append(f"a GGUF LoRA is written as {', '.join(GGUF_LORA_TYPES)}, not {', '.join(odd)}")
    why = llamacpp.missing()
    if why:
        return [*problems, why]
    config = _base_config(run)
    why = family_problem(config or {}, llamacpp.architectures()[0])
    return [*problems, why] if why else problems


def family_problem(config: dict[str, Any], convertible: set[str]) -> str | None:
    """Why llama.cpp's converter (which converts the model classes ``convertible``) cannot take a model
    of this config.json, if it cannot."""
    archs = set(config.get("architectures") or [])
    if config.get("vision_config") is not None:
        return (
            "GGUF export of a vision-language model is not supported yet: its vision projector (mmproj) "
            "would need a second file llama.cpp loads beside it; export it in safetensors (format='hf')"
        )
    if archs and not archs & convertible:
        near = sorted(a for a in convertible if a.endswith("ForCausalLM"))
        return (
            f"llama.cpp's converter does not convert {', '.join(sorted(archs))}; it converts "
            f"{len(convertible)} model classes, such as {', '.join(near[:12])}, ...; export in "
            "safetensors (format='hf')"
        )
    return None


def _registered_runs() -> list[Path]:
    """Every registered run's directory that is one (a row pointing elsewhere protects nothing)."""
    from nbtrain.contract.rundir import RunPaths
    from nbtrain.control.runs import registry

    return [p for row in registry.rows() if RunPaths(p := Path(row.run_dir)).resolved.is_file()]


def run_method(run: Run) -> str:
    from nbtrain.contract.rundir import read_json

    try:
        return str(read_json(run.paths.resolved)["config"]["method"])
    except (OSError, ValueError, KeyError):
        return "unknown"


def _base_config(run: Run) -> dict[str, Any] | None:
    """config.json of the model the run trained: its output's (a full run) or its base model's."""
    from nbtrain.contract.rundir import read_json
    from nbtrain.control.memory import load_model_config

    out = run.paths.output / "config.json"
    if out.is_file():
        return dict(read_json(out))
    try:
        cfg = read_json(run.paths.resolved)["config"]
        return load_model_config(cfg["model"], cfg.get("revision"), cfg.get("gguf_file"))
    except (OSError, ValueError, KeyError):
        return None


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
    format: str = "hf",
    quant: str | list[str] | None = None,
    prompts: list[str] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> ExportResult:
    """Write the run's model to ``to``: merged into the base (default; QLoRA into the de-quantised base)
    so ``AutoModelForCausalLM.from_pretrained(to)`` works, or its adapter only (``merge=False``).

    ``format="gguf"``: GGUF files for llama.cpp / Ollama / LM Studio, one per ``quant`` (default f16;
    e.g. ``["f16", "q8_0", "q4_k_m"]``), converted once and quantised from that conversion, each checked
    by running it in llama.cpp against the merged model (on ``prompts``, else the run's held-out rows);
    an Ollama Modelfile and a README beside them.

    With ``merge=False`` a LoRA run's adapter is written as GGUF LoRAs (f16, f32, bf16, q8_0) beside its
    base model in f16, for llama.cpp's ``--lora`` and Ollama's ADAPTER.

    ``dtype``: auto (the base model's), fp32, bf16 or fp16. A non-empty ``to`` is refused unless
    ``overwrite``. ``push_to_hub="user/repo"`` uploads the result afterwards (a private repo unless
    ``private=False``); if that fails, the local export is kept and the error says so.

    ``on_progress``: what the job says it is doing (GGUF: converting, quantising, checking), one line at a
    time; printed when not given. The report (its verdict, a line a file) is the result's, shown once
    when the result is (its repr, its HTML in a notebook).
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
    if why := target_problem(target, overwrite, protected_dirs(r.dir, home_dir(), _registered_runs())):
        problems.append(why)
    if push_to_hub is not None and not _REPO_ID.match(push_to_hub):
        problems.append(f"push_to_hub {push_to_hub!r} is not a hub repo id such as 'user/my-model'")
    quants = _quants(quant)
    if format not in FORMATS:
        problems.append(f"format {format!r} is not one of {', '.join(FORMATS)}")
    elif format == "gguf":
        problems += gguf_problems(r, quants, merge)
    elif quant is not None:
        problems.append("quant is for format='gguf' (--format gguf)")
    if problems:
        text = "not exported: " + "; ".join(problems)
        if format == "gguf":
            from nbtrain.control.jobs import llamacpp

            if llamacpp.missing() is not None:  # one paragraph, shown without a traceback
                raise llamacpp.NotSetUp(text)
        raise NbtrainError(text)
    args = [str(r.dir), "--to", str(target), "--dtype", dtype, "--merge" if merge else "--no-merge"]
    if overwrite:
        args.append("--overwrite")
    if format == "gguf":
        args += ["--format", "gguf", "--quant", ",".join(quants)]
        if prompts:
            args += ["--prompts", json.dumps([str(p) for p in prompts][:64])]
    if push_to_hub:
        args += ["--push-to-hub", push_to_hub] + ([] if private else ["--public"])
    log = r.paths.logs / "export.log"
    result_file = r.paths.logs / "export.result.json"
    code, res = run_job("export", args, log=log, result=result_file, cwd=r.dir,
                        what=f"export of run {r.id}", timeout=timeout,
                        progress="nbtrain export:" if format == "gguf" else None,
                        say=on_progress)  # fmt: skip
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
