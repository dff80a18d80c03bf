"""Export a run from a widget: safetensors for transformers, or GGUF files for llama.cpp / Ollama / LM Studio.

    %finetune export RUN              # in a notebook, without --to: this box
    ExportBox(run).show()

The config panel shows one under a run it launched once that run has trained weights, and under a run it
loaded. The box is a face on ``nbtrain.control.jobs.export.export`` (the cell, the CLI and the API call the
same
function): what that refuses before starting anything (a non-empty folder, llama.cpp not set up, a family
its converter does not take) shows here in words, nothing written. The export itself runs on a thread of
its own, as a job process (nothing here imports torch or llama_cpp), its progress lines in the status line
as they come and the check's report (sizes, answers as transformers', tokens/s, the Ollama command) below.
"""

from __future__ import annotations

import html
import threading
import traceback
from pathlib import Path
from typing import Any, Final

import ipywidgets as widgets

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.ggufcache import GGUF_LORA_TYPES
from nbtrain.control.jobs.export import ExportResult, export, gguf_verdict, run_method
from nbtrain.control.runs.run import Run, get_run, has_trained_weights

FORMATS: Final = (("safetensors (transformers)", "hf"), ("GGUF (llama.cpp, Ollama)", "gguf"))
DEFAULT_QUANTS: Final = ("f16", "q8_0", "q4_k_m")
# The types offered as buttons, the usual ones first, with what each is for; the API takes every
# GGUF_QUANTS name.
QUANT_WORDS: Final = {
    "f16": "16-bit floats, as trained: the reference the others are checked against",
    "bf16": "bfloat16, as trained",
    "q8_0": "8-bit: about half of f16, answers almost always the same",
    "q6_k": "6-bit K-quant",
    "q5_k_m": "5-bit K-quant",
    "q4_k_m": "4-bit K-quant: about a quarter of f16, the usual choice for a laptop",
    "q4_0": "4-bit, the simplest (fast on some CPUs)",
    "q3_k_m": "3-bit K-quant: small, answers drift",
    "q2_k": "2-bit K-quant: smallest, answers drift most",
}
_CSS: Final = """<style>
.nbtrain-export {border:1px solid var(--jp-border-color2, #e0e0e0); border-radius:6px;
  padding:4px 10px 8px 10px; margin:8px 0 10px 0; max-width:760px}
.nbtrain-export-title {font-size:14px; font-weight:600; margin:2px 0 6px 0;
  color:var(--jp-ui-font-color0, #212121)}
.nbtrain-export-title small {font-weight:normal; font-size:12px; color:var(--jp-ui-font-color2, #757575);
  margin-left:8px}
.nbtrain-export-status {font-size:12px; line-height:1.4; color:var(--jp-ui-font-color1, #424242);
  white-space:pre-wrap}
.nbtrain-export-error {color:#c62828}
.nbtrain-export-report {font-size:12px; line-height:1.5; margin-top:6px}
.nbtrain-export-report pre {font-size:12px; margin:4px 0; white-space:pre-wrap}
.nbtrain-export-report code {word-break:break-all}
.nbtrain-export-table {border-collapse:collapse; margin:4px 0}
.nbtrain-export-table th, .nbtrain-export-table td {padding:2px 10px 2px 0; text-align:right}
.nbtrain-export-table th:first-child, .nbtrain-export-table td:first-child {text-align:left}
.nbtrain-export-table th {font-weight:600; border-bottom:1px solid var(--jp-border-color2, #e0e0e0)}
</style>"""
_LABEL: Final = widgets.Layout(width="110px")


def _row(label: str, widget: Any) -> Any:
    return widgets.HBox(
        [widgets.HTML(f"<span>{html.escape(label)}</span>", layout=_LABEL), widget],
        layout=widgets.Layout(align_items="flex-start", margin="2px 0"),
    )


def default_target(run: Run, fmt: str, base: Path | None = None) -> str:
    """exports/<run name>[-gguf] under the working folder, with -2, -3... if that is taken and not empty."""
    base = base or Path.cwd()
    stem = f"exports/{run.name}" + ("-gguf" if fmt == "gguf" else "")
    path, n = stem, 1
    while (base / path).is_dir() and any((base / path).iterdir()):
        n += 1
        path = f"{stem}-{n}"
    return path


class ExportBox:
    """The export form of one run. Display it (last expression of a cell, or ``.show()``); from code:
    ``format.value``, ``quant.value``, ``to.value``, ``export_button.click()``, ``wait()``, ``result``."""

    def __init__(self, run: str | Path | Run) -> None:
        self.run = get_run(run)
        self.result: ExportResult | None = None
        self.error: str | None = None
        self.lines: list[str] = []  # what the export job said, in order
        self._thread: threading.Thread | None = None
        lora = run_method(self.run) in ("lora", "qlora")
        self.format = widgets.ToggleButtons(options=FORMATS, value="hf", style={"button_width": "210px"})
        self.quant_buttons = {
            q: widgets.ToggleButton(
                value=q in DEFAULT_QUANTS, description=q, tooltip=words, layout=widgets.Layout(width="76px")
            )
            for q, words in QUANT_WORDS.items()
        }
        for b in self.quant_buttons.values():  # a picked type is blue, not just a shade darker
            b.button_style = "info" if b.value else ""
            b.observe(_mark_picked, names="value")
        types = widgets.HBox(list(self.quant_buttons.values()), layout=widgets.Layout(flex_flow="row wrap"))
        self.merge = widgets.Checkbox(
            value=True,
            description="merge the adapter into the base (off: the adapter alone)",
            indent=False,
            disabled=not lora,
            layout=widgets.Layout(width="auto"),
        )
        self.to = widgets.Text(
            value=default_target(self.run, "hf"),
            placeholder="a new or empty folder",
            layout=widgets.Layout(width="330px"),
        )
        self.export_button = widgets.Button(
            description="Export", icon="download", button_style="primary", tooltip="write the files"
        )
        self.status = widgets.HTML("")
        self.report = widgets.HTML("")
        self.quant_row = _row("types", types)
        self.merge_row = _row("adapter", self.merge)
        self.merge_row.layout.display = None if lora else "none"
        self.quant_row.layout.display = "none"
        self.format.observe(self._format_changed, names="value")
        self.export_button.on_click(self._clicked)
        title = widgets.HTML(
            "<div class='nbtrain-export-title'>Export "
            f"<small>run {html.escape(self.run.name)} ({html.escape(self.run.id)}): its model as files to "
            "load anywhere</small></div>"
        )
        self.box = widgets.VBox(
            [
                widgets.HTML(_CSS),
                title,
                _row("format", self.format),
                self.quant_row,
                self.merge_row,
                _row("to folder", self.to),
                _row("", self.export_button),
                self.status,
                self.report,
            ]
        )
        self.box.add_class("nbtrain-export")
        if not has_trained_weights(self.run):
            self._say(
                f"run {self.run.id} has no trained weights yet: Export works once it has finished (or "
                "saved a checkpoint)",
                error=True,
            )

    # --------------------------------------------------------------------------------- display
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.box._repr_mimebundle_(**kwargs)

    def show(self) -> None:
        from IPython.display import display

        display(self.box)

    def close(self) -> None:
        todo = [self.box]
        while todo:
            w = todo.pop()
            todo.extend(getattr(w, "children", ()))
            w.close()

    # ------------------------------------------------------------------------------------ form
    def _format_changed(self, change: dict[str, Any]) -> None:
        gguf = change["new"] == "gguf"
        self.quant_row.layout.display = None if gguf else "none"
        old = default_target(self.run, change["old"])
        if self.to.value.strip() in ("", old):  # still the suggestion: suggest the other format's folder
            self.to.value = default_target(self.run, change["new"])

    def request(self) -> dict[str, Any]:
        """The keyword arguments of ``nbtrain.export`` the form stands for."""
        to = self.to.value.strip()
        if not to:
            raise NbtrainError("give a folder to export to (a new or empty one)")
        kwargs: dict[str, Any] = {"to": to, "merge": bool(self.merge.value), "format": self.format.value}
        if self.format.value == "gguf":
            quants = self.quants
            if not quants:
                raise NbtrainError(
                    "pick at least one GGUF type (f16 is the one checked against transformers)"
                )
            if not self.merge.value:  # an adapter is written in the types llama.cpp's LoRA converter knows
                quants = [q for q in quants if q in GGUF_LORA_TYPES] or ["f16"]
            kwargs["quant"] = quants
        return kwargs

    @property
    def quants(self) -> list[str]:
        """The GGUF types picked, in the buttons' order."""
        return [q for q, b in self.quant_buttons.items() if b.value]

    @quants.setter
    def quants(self, picked: list[str] | tuple[str, ...]) -> None:
        unknown = set(picked) - set(self.quant_buttons)
        if unknown:
            raise ValueError(
                f"no button for {sorted(unknown)}; the form offers {', '.join(self.quant_buttons)}"
            )
        for q, b in self.quant_buttons.items():
            b.value = q in picked

    # ---------------------------------------------------------------------------------- export
    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the export started by the button; False if it is still going after ``timeout``."""
        t = self._thread
        if t is not None:
            t.join(timeout)
        return not self.busy

    def _clicked(self, _button: Any) -> None:
        if self.busy:
            return
        self.error, self.result, self.lines = None, None, []
        self.report.value = ""
        try:
            kwargs = self.request()
        except NbtrainError as e:
            self._say(str(e), error=True)
            return
        self.export_button.disabled = True
        what = "GGUF files" if kwargs["format"] == "gguf" else "safetensors"
        self._say(f"exporting run {self.run.id} as {what} to {kwargs['to']}…")
        self._thread = threading.Thread(
            target=self._export, args=(kwargs,), name=f"nbtrain-export-{self.run.id}", daemon=True
        )
        self._thread.start()

    def _export(self, kwargs: dict[str, Any]) -> None:
        try:
            self.result = export(self.run, on_progress=self._progress, **kwargs)
        except NbtrainError as e:
            self._say(str(e), error=True)
        except Exception:  # noqa: BLE001 - a background thread has no cell: show it in the box
            self._say(f"export of run {self.run.id} failed:\n{traceback.format_exc()}", error=True)
        else:
            self._done(self.result)
        finally:
            self.export_button.disabled = False

    def _progress(self, line: str) -> None:
        self.lines.append(line)
        if "\n" not in line:  # the job's lines; the report is the result's and shows below
            self._say(line.removeprefix("nbtrain export:").strip() + "…")

    def _done(self, result: ExportResult) -> None:
        files = ", ".join(result.files[:8]) + (", …" if len(result.files) > 8 else "")
        self._say(f"exported ({result.kind}) to {result.dir}: {files}")
        gguf = result.record.get("gguf")
        body = report_html(gguf) if gguf else f"<pre>{html.escape(_hf_usage(result.dir, result.kind))}</pre>"
        self.report.value = f"<div class='nbtrain-export-report'>{body}</div>"

    def _say(self, text: str, *, error: bool = False) -> None:
        if error:
            self.error = text
        cls = "nbtrain-export-status nbtrain-export-error" if error else "nbtrain-export-status"
        self.status.value = f"<div class='{cls}'>{html.escape(text)}</div>"


def _mark_picked(change: dict[str, Any]) -> None:
    change["owner"].button_style = "info" if change["new"] else ""


def report_html(report: dict[str, Any]) -> str:
    """The GGUF export's check as a table: a row a file (size, answers as transformers', accuracy,
    tokens/s in llama.cpp), what it was checked on, and the Ollama command (``gguf_table`` in words)."""
    n = report.get("prompts", 0)
    ref = (report.get("transformers") or {}).get("accuracy")
    verdict = gguf_verdict(report)
    said = f"<div class='nbtrain-export-verdict'><b>{html.escape(verdict)}</b></div>" if verdict else ""
    head = (
        f"checked on {n} prompts ({html.escape(str(report.get('prompts_from')))})"
        + ("" if ref is None else f"; the merged model in transformers: accuracy {ref:.2f}")
        if n
        else "not checked: the run has no SFT prompts to ask"
    )
    rows = []
    for q, f in (report.get("files") or {}).items():
        same = f"{f['same_as_transformers']}/{n}" if "same_as_transformers" in f else "-"
        acc = "-" if f.get("accuracy") is None else f"{f['accuracy']:.2f}"
        speed = f"{f['tokens_per_s']:,.0f}" if f.get("tokens_per_s") is not None else "-"
        rows.append(
            f"<tr><td><b>{html.escape(q)}</b></td><td>{f['bytes'] / 2**20:,.1f} MiB</td><td>{same}</td>"
            f"<td>{acc}</td><td>{speed}</td></tr>"
        )
    table = (
        "<table class='nbtrain-export-table'><tr><th>type</th><th>size</th><th>answers as transformers'</th>"
        f"<th>accuracy</th><th>tokens/s in llama.cpp</th></tr>{''.join(rows)}</table>"
    )
    create = (report.get("ollama") or {}).get("create")
    ollama = f"<div>Ollama: <code>{html.escape(create)}</code></div>" if create else ""
    return f"{said}<div>{head}</div>{table}{ollama}"


def _hf_usage(to: Path, kind: str) -> str:
    cls = "AutoPeftModelForCausalLM" if kind == "adapter" else "AutoModelForCausalLM"
    package = "peft" if kind == "adapter" else "transformers"
    return f'from {package} import {cls}\nmodel = {cls}.from_pretrained("{to}")'
