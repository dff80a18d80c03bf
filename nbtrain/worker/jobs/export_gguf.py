"""A run exported as GGUF files for llama.cpp, Ollama and LM Studio, checked by running them.

Called by ``nbtrain.worker.jobs.export`` (``--format gguf --quant f16,q8_0,q4_k_m``):

1. The merged model (export's own merge) is converted once by llama.cpp's converter
   (``gguf_convert``, a process of its own) into a float GGUF (the first float type asked for, else f16);
   every other type is quantised from that one file with llama.cpp's ``llama_model_quantize``.
2. Each file is made under a temporary name and renamed when whole, in the run's conversion cache
   (``RUN/gguf/<weights>-<version>/``): a second export of the same weights and type reuses it; the export
   folder gets hard links (copies across file systems).
3. Verified by running: llama.cpp (llama-cpp-python) loads each file and answers held-out prompts (the
   run's eval rows, else its training rows, rendered with the model's chat template) greedily; the merged
   model answers the same prompts in transformers. The report: size, answers equal to transformers',
   accuracy against the data's answers, llama.cpp's prompt tokens equal to the tokenizer's, tokens/s.
4. Beside the files: an Ollama ``Modelfile`` (FROM the file, TEMPLATE translated from the chat template
   for the families Ollama knows, PARAMETER stop for its end-of-turn tokens, SYSTEM when the data has one)
   and a README saying how to run it in llama.cpp, Ollama and LM Studio.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.contract import ggufcache
from nbtrain.contract.rundir import atomic_write_json

REPORT = "gguf_report.json"
MAX_PROMPTS = 32


def conversion_cache(run_dir: Path, weights: Path) -> Path:
    """Where the GGUF files of these weights are kept: by the weights folder and its newest file's
    time, so new weights (a resumed run) get new files."""
    newest = max((p.stat().st_mtime_ns for p in weights.iterdir() if p.is_file()), default=0)
    return run_dir / "gguf" / f"{weights.name}-{newest}"


def _partial(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial-{os.getpid()}")


def clear_partials(folder: Path) -> None:
    """Temporary files of conversions whose process is gone (killed midway)."""
    import psutil

    for p in folder.glob(".*.partial-*"):
        pid = p.name.rsplit("-", 1)[1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)) and not p.is_symlink():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def convert(src: Path, out: Path, outtype: str, *, lora_base: Path | None = None) -> None:
    """llama.cpp's converter, src -> out (a float type), in a process of its own; out appears whole.
    With ``lora_base`` (the base model's folder), src is a peft LoRA adapter and out a GGUF LoRA."""
    tmp = _partial(out)
    kind = "hf" if lora_base is None else "lora"
    argv = [sys.executable, "-m", "nbtrain.worker.jobs.gguf_convert", str(ggufcache.llama_cpp_dir()), kind,
            str(src), "--outfile", str(tmp), "--outtype", outtype]  # fmt: skip
    if lora_base is not None:
        argv += ["--base", str(lora_base)]
    what = "the LoRA adapter" if lora_base else "the model"
    print(f"nbtrain export: converting {what} to GGUF ({outtype}) with llama.cpp's converter", flush=True)
    code = subprocess.run(argv, stdout=sys.stdout, stderr=sys.stderr, check=False).returncode
    if code != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp's converter failed (exit code {code}); its output is above")
    os.replace(tmp, out)


def _threads() -> int:
    """llama.cpp's threads: torch's count, which the export job set from the cores other processes leave
    free (``worker/threads.settle``); its own spin-waiting threads slow down as much beside a busy core."""
    import torch

    return torch.get_num_threads()


def quantize(src: Path, out: Path, quant: str) -> None:
    """llama.cpp's quantiser: src (a float GGUF) -> out in ``quant``; out appears whole."""
    import llama_cpp

    tmp = _partial(out)
    print(f"nbtrain export: quantising to {quant} with llama.cpp", flush=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ggufcache.GGUF_QUANTS[quant]
    params.nthread = _threads()
    code = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if code != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        free = shutil.disk_usage(out.parent).free / 2**30
        raise RuntimeError(
            f"llama.cpp could not quantise {src.name} to {quant} (code {code}; its reason is in the log "
            f"above: a full disk is one, {free:.1f} GiB free in {out.parent})"
        )
    os.replace(tmp, out)


Row = tuple[list[Any], str | None]  # (the messages before the answer, the data's answer or None)


def held_out(
    resolved: dict[str, Any], tok: Any, prompts: list[str] | None = None, n: int = MAX_PROMPTS
) -> tuple[list[Row], str]:
    """What each file is checked on: the caller's ``prompts`` (no answers to score), else up to ``n``
    distinct (messages before the last answer, that answer) of the run's eval rows, else of its training
    rows; and where they came from."""
    from nbtrain.worker.recipes.common import load_run_data

    if prompts:
        return [([{"role": "user", "content": p}], None) for p in prompts[:n]], "the prompts given"
    if resolved["config"].get("objective", "sft") != "sft":
        return [], "none (not an SFT run; give prompts= to check it)"
    train, evald = load_run_data(resolved, tok, objective="sft")
    rows, source = (evald, "the run's eval rows") if evald is not None else (train, "the run's training rows")
    out: list[Row] = []
    seen = set()
    for row in rows:
        msgs = row.get("messages") if isinstance(row, dict) else None
        if isinstance(msgs, str):
            msgs = json.loads(msgs)
        if not msgs or msgs[-1].get("role") != "assistant" or not isinstance(msgs[-1].get("content"), str):
            continue
        key = json.dumps(msgs[:-1], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        out.append((msgs[:-1], msgs[-1]["content"]))
        if len(out) >= n:
            break
    return out, source


def prompt(tok: Any, messages: list[Any]) -> tuple[str, list[int]]:
    """The prompt as the chat template renders it: (text, the tokenizer's ids of it)."""
    text = str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return text, list(tok(text, add_special_tokens=False)["input_ids"])


def hf_answers(model: Any, tok: Any, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    import torch

    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                 do_sample=False)  # fmt: skip
            out.append(tok.decode(gen[0][len(ids) :], skip_special_tokens=True))
    return out


def llama_answers(
    path: Path, prompts: list[tuple[str, list[int]]], max_new_tokens: int, lora: Path | None = None
) -> dict[str, Any]:
    """llama.cpp's greedy answers from the prompts as text (it tokenises them itself), its tokens equal
    to the tokenizer's, and its generation speed (``lora``: a GGUF LoRA applied on top of ``path``)."""
    from llama_cpp import Llama

    ctx = max((len(ids) for _, ids in prompts), default=0) + max_new_tokens + 8
    llm = Llama(model_path=str(path), n_ctx=max(ctx, 64), n_threads=_threads(), verbose=False,
                lora_path=str(lora) if lora else None)  # fmt: skip
    answers, same_tokens, generated, secs = [], 0, 0, 0.0
    try:
        for text, ids in prompts:
            own = llm.tokenize(text.encode(), add_bos=False, special=True)
            same_tokens += own == ids
            t = time.perf_counter()
            r: Any = llm.create_completion(own, max_tokens=max_new_tokens, temperature=0.0, top_k=1)
            secs += time.perf_counter() - t
            generated += int(r["usage"]["completion_tokens"])
            answers.append(str(r["choices"][0]["text"]))
    finally:
        llm.close()
    return {"answers": answers, "same_tokens": same_tokens, "tokens_per_s": generated / secs if secs else 0.0}


# --- Ollama: its Go templates for the chat families it knows, found from the HF template's markers.
OLLAMA = {
    "chatml": (
        "<|im_start|>",
        "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
        "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
        "<|im_start|>assistant\n",
        ["<|im_end|>"],
    ),
    "llama3": (
        "<|start_header_id|>",
        "{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
        "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>"
        "{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n",
        ["<|eot_id|>"],
    ),
    "gemma": (
        "<start_of_turn>",
        "{{- range .Messages }}<start_of_turn>"
        '{{ if eq .Role "assistant" }}model{{ else }}{{ .Role }}{{ end }}'
        "\n{{ .Content }}<end_of_turn>\n{{ end }}<start_of_turn>model\n",
        ["<end_of_turn>"],
    ),
    "phi3": (
        "<|assistant|>",
        "{{- if .System }}<|system|>\n{{ .System }}<|end|>\n{{ end }}"
        "{{- range .Messages }}<|{{ .Role }}|>\n{{ .Content }}<|end|>\n{{ end }}<|assistant|>\n",
        ["<|end|>"],
    ),
    "mistral": (
        "[INST]",
        '{{- range .Messages }}{{ if eq .Role "user" }}[INST] {{ .Content }}[/INST]'
        "{{ else }}{{ .Content }}</s>{{ end }}{{ end }}",
        ["[INST]", "</s>"],
    ),
}


def chat_family(template: str | None) -> str | None:
    if not template:
        return None
    return next((name for name, (marker, _, _) in OLLAMA.items() if marker in template), None)


def modelfile(
    gguf_name: str, template: str | None, system: str | None, adapter: str | None = None
) -> tuple[str, str | None]:
    """(the Modelfile, the family whose template it uses or None); ``adapter``: a GGUF LoRA on FROM."""
    family = chat_family(template)
    lines = [f"FROM ./{gguf_name}"] + ([f"ADAPTER ./{adapter}"] if adapter else []) + [""]
    if family is None:
        lines += ["# The chat template is not one of the families this file translates (ChatML, Llama 3,",
                  "# Gemma, Phi-3, Mistral): Ollama reads the one stored in the GGUF file.", ""]  # fmt: skip
    else:
        _, go, stops = OLLAMA[family]
        lines += [f'TEMPLATE """{go}"""', ""] + [f'PARAMETER stop "{s}"' for s in stops] + [""]
    if system:
        lines += ['SYSTEM """' + system.replace('"""', '\\"\\"\\"') + '"""', ""]
    lines += ["PARAMETER temperature 0"]
    return "\n".join(lines) + "\n", family


def data_system(rows: list[Row]) -> str | None:
    """The system message every held-out row shares, if any."""
    systems = {m[0].get("content") if m and m[0].get("role") == "system" else None for m, _ in rows}
    one = systems.pop() if len(systems) == 1 else None
    return one if isinstance(one, str) and one else None


def readme(paths: dict[str, Path], ollama_name: str, family: str | None, base: Path | None = None) -> str:
    first = paths["q4_k_m" if "q4_k_m" in paths else next(iter(paths))].name
    listed = [*paths.values(), *([base] if base else [])]
    rows = "\n".join(f"| `{p.name}` | {p.stat().st_size / 2**20:,.1f} MiB |" for p in listed)
    template = f"the {family} chat template" if family else "the chat template stored in the GGUF file"
    if base is None:
        what = "the fine-tuned model merged into its base, converted by llama.cpp's converter and quantised"
        model, py = f"-m {first}", f'Llama(model_path="{first}")'
        server, uses = f"--model {first}", f"`{first}`"
    else:
        what = (
            "the LoRA adapter as a GGUF LoRA, and its base model in f16, converted by llama.cpp's converter"
        )
        model, py = f"-m {base.name} --lora {first}", f'Llama(model_path="{base.name}", lora_path="{first}")'
        server, uses = f"--model {base.name} --lora_path {first}", f"`{base.name}` with the adapter `{first}`"
    return f"""# {ollama_name} (GGUF)

Exported by nbtrain: {what} by llama.cpp. `gguf_report.json` holds what was checked by running each file.

| file | size |
|---|---|
{rows}

## llama.cpp

    llama-cli {model} -cnv
    llama-server {model} --port 8080        # OpenAI-compatible: http://localhost:8080/v1

In Python: `pip install llama-cpp-python`, then `{py}`, or `python -m llama_cpp.server {server}`.

## Ollama

    ollama create {ollama_name} -f Modelfile
    ollama run {ollama_name}

The Modelfile uses {uses} and {template}; edit its FROM line for another file.

## LM Studio

Copy the folder into LM Studio's models folder (My Models shows the path), or run `lms import {first}`;
LM Studio reads the chat template from the file.
"""


def ollama_name(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "-" for c in name.lower()).strip("-.")
    return keep or "nbtrain-model"


def plan_files(quants: list[str]) -> tuple[str, list[str]]:
    """(the float type converted first, the order to make the files in)."""
    base = next((q for q in quants if q in ggufcache.GGUF_FLOATS), "f16")
    return base, [base] + [q for q in quants if q != base]


@dataclass
class GGUFExport:
    """One GGUF export: the run, its weights and tokenizer, where the files go (``target``, an empty
    folder renamed to ``final`` at the end), ``merged()`` (the merged model, loaded only when a file
    must be converted or answers compared) and the prompts to check on (None: the run's rows)."""

    run_dir: Path
    target: Path
    final: Path
    merged: Callable[[], Any]
    tok: Any
    resolved: dict[str, Any]
    weights: Path
    name: str
    prompts: list[str] | None = None
    model: Any = None

    def merged_model(self) -> Any:
        if self.model is None:
            self.model = self.merged()
        return self.model

    def work(self) -> Path:
        """The conversion cache of these weights, emptied of what killed exports left."""
        work = conversion_cache(self.run_dir, self.weights)
        work.mkdir(parents=True, exist_ok=True)
        clear_partials(work)
        return work


def export_gguf(job: GGUFExport, quants: list[str], lora_base: Path | None = None) -> dict[str, Any]:
    """The GGUF files, the Modelfile, the README and the report in ``job.target``. With ``lora_base``
    (the base model's folder) the files are the run's LoRA adapter as GGUF LoRAs, one a type, and the
    base model in f16 for llama.cpp's ``--lora`` / Ollama's ADAPTER. Returns the report."""
    if lora_base is not None:
        return _export_lora(job, quants, lora_base)
    work = job.work()
    base, order = plan_files(quants)
    made: dict[str, Path] = {}
    reused: list[str] = []
    for q in order:
        path = work / f"model-{q}.gguf"
        if path.is_file():
            reused.append(q)
        elif q in ggufcache.GGUF_FLOATS:
            hf = work / f".hf.partial-{os.getpid()}"
            shutil.rmtree(hf, ignore_errors=True)
            try:
                job.merged_model().save_pretrained(str(hf))
                job.tok.save_pretrained(str(hf))
                convert(hf, path, q)
            finally:
                shutil.rmtree(hf, ignore_errors=True)
        else:
            quantize(made.get(base) or work / f"model-{base}.gguf", path, q)
        made[q] = path
    paths = {q: job.target / f"{job.name}-{q}.gguf" for q in quants}
    for q in quants:
        _link(made[q], paths[q])
    return _check_and_describe(job, paths, reused)


def _check_and_describe(
    job: GGUFExport, paths: dict[str, Path], reused: list[str], base: Path | None = None
) -> dict[str, Any]:
    """Each file run in llama.cpp against the merged model; the Modelfile, README and report written."""
    if reused:
        print(f"nbtrain export: reusing the conversion of these weights: {', '.join(reused)}", flush=True)
    quants, tok, target = list(paths), job.tok, job.target
    files = {q: p.stat().st_size for q, p in paths.items()}
    rows, source = held_out(job.resolved, tok, job.prompts)
    report: dict[str, Any] = {"files": {q: {"bytes": b} for q, b in files.items()}, "prompts": len(rows),
                              "prompts_from": source, "reused": reused}  # fmt: skip
    if base is not None:
        report["base"] = {"file": base.name, "bytes": base.stat().st_size}
    if rows:
        rendered = [prompt(tok, m) for m, _ in rows]
        wanted = [a for _, a in rows]
        longest = max((len(tok(a, add_special_tokens=False)["input_ids"]) for a in wanted if a), default=40)
        new_tokens = min(64, longest + 8)
        model = job.merged_model()
        print(f"nbtrain export: checking each file on {len(rows)} prompts ({source})", flush=True)
        reference = hf_answers(model, tok, [ids for _, ids in rendered], new_tokens)
        scored = [(a, w) for a, w in zip(reference, wanted, strict=True) if w is not None]
        report["transformers"] = {"accuracy": _accuracy(reference, wanted), "scored": len(scored),
                                  "right": sum(a.strip() == w.strip() for a, w in scored)}  # fmt: skip
        for q in quants:
            if base is None:
                got = llama_answers(paths[q], rendered, new_tokens)
            else:
                got = llama_answers(base, rendered, new_tokens, lora=paths[q])
            same = sum(a.strip() == b.strip() for a, b in zip(got["answers"], reference, strict=True))
            report["files"][q].update(
                same_as_transformers=same,
                accuracy=_accuracy(got["answers"], wanted),
                same_prompt_tokens=got["same_tokens"],
                tokens_per_s=round(got["tokens_per_s"], 1),
                examples=[{"prompt": p[0], "transformers": r, "llama.cpp": a}
                          for p, r, a in list(zip(rendered, reference, got["answers"], strict=True))[:3]],
            )  # fmt: skip
            print(f"nbtrain export: {q}: {same}/{len(rows)} answers as transformers', "
                  f"{got['tokens_per_s']:.0f} tokens/s", flush=True)  # fmt: skip
    pick = "q4_k_m" if "q4_k_m" in files else quants[0]
    template, system = getattr(tok, "chat_template", None), data_system(rows)
    if base is None:
        text, family = modelfile(paths[pick].name, template, system)
    else:
        text, family = modelfile(base.name, template, system, adapter=paths[pick].name)
    (target / "Modelfile").write_text(text, encoding="utf-8")
    oname = ollama_name(job.name)
    (target / "README.md").write_text(readme(paths, oname, family, base), encoding="utf-8")
    report.update(ollama={"family": family, "create": f"ollama create {oname} -f {job.final / 'Modelfile'}"})
    atomic_write_json(target / REPORT, report)
    return report


def _accuracy(answers: list[str], wanted: list[str | None]) -> float | None:
    """The share of answers equal to the data's (None: no answers to score against)."""
    scored = [(a, w) for a, w in zip(answers, wanted, strict=True) if w is not None]
    return sum(a.strip() == w.strip() for a, w in scored) / len(scored) if scored else None


def _export_lora(job: GGUFExport, quants: list[str], base: Path) -> dict[str, Any]:
    """The adapter as GGUF LoRAs (one a type) and the base model in f16, kept and linked like the merged
    files; checked with llama.cpp applying the LoRA on the base."""
    work = job.work()
    reused: list[str] = []
    base_file = work / "base-f16.gguf"
    if base_file.is_file():
        reused.append("base-f16")
    else:
        convert(base, base_file, "f16")
    paths = {q: job.target / f"{job.name}-lora-{q}.gguf" for q in quants}
    for q in quants:
        path = work / f"lora-{q}.gguf"
        if path.is_file():
            reused.append(f"lora-{q}")
        else:
            convert(job.weights, path, q, lora_base=base)
        _link(path, paths[q])
    base_out = job.target / f"{ollama_name(job.name)}-base-f16.gguf"
    _link(base_file, base_out)
    return _check_and_describe(job, paths, reused, base=base_out)


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)
