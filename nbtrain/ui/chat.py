"""A chat with a run's fine-tuned model, optionally beside its base model.

    run.chat(compare_base=True)          # or: %finetune chat RUN --compare-base

The widget talks HTTP to the run's server (``nbtrain.serve``): it reuses a server that is up, or starts
one, and Close stops the server it started (releasing its GPU memory). The model never loads in the
kernel. Starting the server and every request run in a background thread, so the cell returns at once
and the kernel stays free; errors from that thread show in the widget (and stay in ``error``).

Replies stream: the server answers with server-sent events and the transcript grows as the tokens come
(at most ``refresh_seconds`` apart). The transcript and the input box are one small anywidget
(``ChatView``), because ipywidgets' Textarea has no key events: in its text box Enter sends and
Shift+Enter starts a new line, and neither reaches JupyterLab's or Notebook 7's own shortcuts (the box
stops the key events there and carries Lumino's ``data-lm-suppress-shortcuts``), so Shift+Enter never runs
the cell. The conversation is kept in the kernel per run: Close keeps it, and Reopen (or ``run.chat()``
again) shows it. When the server is gone (stopped, exited, connection refused) the widget says so and
offers Restart, which starts the server again, keeps the conversation and asks an unanswered message again.
"""

from __future__ import annotations

import contextlib
import html
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as widgets
import traitlets

from nbtrain.control.runs.run import Run, get_run
from nbtrain.control.serve import ServeError, ServerGone, ServerHandle, find_server, serve
from nbtrain.ui.chat_tools import Call, Tools, run_call

KINDS = ("tuned", "base")
MAX_TOOL_ROUNDS = 5  # calls then answers in one turn, at most: a model that keeps calling is stopped
# The conversations of this kernel, per (run directory, compare_base): Close keeps them for the next widget.
_KEPT: dict[tuple[Path, bool], list[Turn]] = {}

_ESM = """
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "nbtrain-chat";
  const log = document.createElement("div");
  log.className = "nbtrain-chat-log";
  const input = document.createElement("div");
  input.className = "nbtrain-chat-input";
  const ta = document.createElement("textarea");
  ta.rows = 1;
  ta.setAttribute("data-lm-suppress-shortcuts", "true");  // JupyterLab / Notebook 7 keys stay out
  const send = document.createElement("button");
  send.className = "nbtrain-chat-send";
  send.textContent = "Send";
  send.title = "Send (Enter)";
  const row = document.createElement("div");
  row.className = "nbtrain-chat-row";
  // A vision-language model's chat: a picture goes with the next message (the kernel checks its size).
  const file = document.createElement("input");
  file.type = "file";
  file.accept = "image/*";
  file.style.display = "none";
  const attach = document.createElement("button");
  attach.className = "nbtrain-chat-attach";
  attach.textContent = "Image";
  attach.title = "Attach a picture to the next message";
  const chip = document.createElement("span");
  chip.className = "nbtrain-chat-chip";
  const thumb = document.createElement("img");
  const drop = document.createElement("button");
  drop.className = "nbtrain-chat-drop";
  drop.textContent = "\u00d7";
  drop.title = "Remove the picture";
  chip.append(thumb, drop);
  attach.addEventListener("click", () => file.click());
  file.addEventListener("change", () => {
    const f = file.files && file.files[0];
    if (!f) return;
    const reader = new FileReader();
    reader.onload = () => { model.set("attached", String(reader.result)); model.save_changes(); };
    reader.readAsDataURL(f);
    file.value = "";
  });
  drop.addEventListener("click", () => { model.set("attached", ""); model.save_changes(); });
  row.append(attach, chip, file, ta, send);
  const hint = document.createElement("div");
  hint.className = "nbtrain-chat-hint";
  hint.textContent = "Enter sends \\u00b7 Shift+Enter adds a line";
  input.append(row, hint);
  root.append(log, input);
  el.append(root);

  const grow = () => {
    ta.style.height = "auto";
    ta.style.height = Math.min(ta.scrollHeight + 2, 180) + "px";
  };
  const sync = () => {
    if (ta.value !== model.get("value")) { ta.value = model.get("value"); grow(); }
    ta.placeholder = model.get("placeholder");
    root.classList.toggle("nbtrain-chat-busy", model.get("busy"));
    send.disabled = !model.get("can_send");
    attach.style.display = model.get("images") ? "" : "none";
    const pic = model.get("attached");
    chip.style.display = pic ? "" : "none";
    if (pic && thumb.src !== pic) thumb.src = pic;
  };
  // The text goes with the message (the box's value may still be on its way to the kernel); the kernel
  // answers "sent" when it took the message, and only then is the box emptied.
  const submit = () => {
    if (ta.value.trim()) model.send({ type: "submit", text: ta.value, image: model.get("attached") });
    ta.focus();
  };
  model.on("msg:custom", (msg) => {
    if (msg && msg.type === "sent" && ta.value === msg.text) { ta.value = ""; typed(); }
  });
  send.addEventListener("click", submit);
  const typed = () => { model.set("value", ta.value); model.save_changes(); grow(); };
  ta.addEventListener("input", typed);
  ta.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || e.isComposing) return;
    e.stopPropagation();  // not the notebook's: Shift+Enter must not run the cell
    e.preventDefault();
    if (e.shiftKey) {  // a new line, put in here: JupyterLab cancels the browser's own (insertLineBreak)
      ta.setRangeText("\\n", ta.selectionStart, ta.selectionEnd, "end");
      typed();
    } else {
      submit();
    }
  });

  const div = (cls, text) => {
    const d = document.createElement("div");
    d.className = cls;
    if (text !== undefined) d.textContent = text;
    return d;
  };
  // A tool call in a reply: the call as a block, Run / Skip while it waits for the user, then its result.
  const CALL_STATES = { asking: "run it?", running: "running\u2026", done: "returned", error: "failed",
    skipped: "skipped" };
  const callBlock = (c) => {
    const box = div(`nbtrain-chat-call nbtrain-chat-call-${c.state}`);
    const head = div("nbtrain-chat-call-head");
    head.append(div("nbtrain-chat-call-tag", "tool"), div("nbtrain-chat-call-sig", c.shown),
      div("nbtrain-chat-call-state", CALL_STATES[c.state] || c.state));
    box.append(head);
    if (c.state === "asking") {
      const ask = div("nbtrain-chat-call-ask", "Run this function in your kernel?");
      const answer = (run, label, cls) => {
        const b = document.createElement("button");
        b.className = cls;
        b.textContent = label;
        b.addEventListener("click", () => {
          model.send({ type: "tool", id: c.id, run });
          for (const x of ask.querySelectorAll("button")) x.disabled = true;
        });
        return b;
      };
      ask.append(answer(true, "Run", "nbtrain-chat-call-run"),
        answer(false, "Skip", "nbtrain-chat-call-skip"));
      box.append(ask);
    }
    if (c.result) {
      const pre = document.createElement("pre");
      pre.className = "nbtrain-chat-call-result";
      pre.textContent = c.result;
      box.append(pre);
    }
    return box;
  };
  const draw = () => {
    const stick = log.scrollHeight - log.scrollTop - log.clientHeight < 48;
    const turns = model.get("turns").slice();
    const live = model.get("live");
    if (live) turns.push(live);
    const kinds = model.get("kinds");
    const parts = [];
    if (!turns.length) parts.push(div("nbtrain-chat-empty", model.get("empty_text")));
    for (const t of turns) {
      const you = div("nbtrain-chat-msg nbtrain-chat-user");
      you.append(div("nbtrain-chat-who", "you"));
      for (const src of t.images || []) {
        const img = document.createElement("img");
        img.className = "nbtrain-chat-image";
        img.src = src;
        img.alt = "your picture";
        you.append(img);
      }
      you.append(div("nbtrain-chat-text", t.user));
      parts.push(you);
      const row = div("nbtrain-chat-replies");
      row.style.gridTemplateColumns = `repeat(${kinds.length}, minmax(0, 1fr))`;
      for (const [kind, label, title] of kinds) {
        const text = (t.replies || {})[kind];
        const waiting = (t.pending || []).includes(kind);
        if (text === undefined && !waiting) continue;
        const msg = div(`nbtrain-chat-msg nbtrain-chat-${kind}`);
        const who = div("nbtrain-chat-who", label);
        who.title = title;
        msg.append(who);
        const steps = (t.steps || {})[kind];
        if (steps && steps.length) {  // a chat with tools: text and calls in the order they came
          for (const st of steps) {
            if (st.type === "call") msg.append(callBlock(st));
            else if (st.text.trim()) msg.append(div("nbtrain-chat-text", st.text.replace(/^\\s+/, "")));
          }
        } else {
          msg.append(div("nbtrain-chat-text", (text || "").replace(/^\\s+/, "")));
        }
        if (waiting) msg.append(div("nbtrain-chat-typing", "\\u25cf\\u25cf\\u25cf"));
        row.append(msg);
      }
      if (row.children.length) parts.push(row);
      if (t.note) parts.push(div("nbtrain-chat-note", t.note));
    }
    log.replaceChildren(...parts);
    if (stick) log.scrollTop = log.scrollHeight;
  };
  model.on("change:turns", draw);
  model.on("change:live", draw);
  model.on("change:kinds", draw);
  model.on("change:value", sync);
  model.on("change:placeholder", sync);
  model.on("change:busy", sync);
  model.on("change:can_send", sync);
  model.on("change:images", sync);
  model.on("change:attached", sync);
  sync();
  draw();
  requestAnimationFrame(() => { log.scrollTop = log.scrollHeight; });
}
export default { render };
"""

_CSS = """
.nbtrain-chat { font-family: var(--jp-ui-font-family, sans-serif); font-size: var(--jp-ui-font-size1, 13px);
  color: var(--jp-ui-font-color1, #1f2328); max-width: 880px; }
.nbtrain-chat-log { max-height: 420px; min-height: 72px; overflow-y: auto; padding: 8px;
  border: 1px solid var(--jp-border-color2, #e0e0e0); border-radius: 8px 8px 0 0;
  background: var(--jp-layout-color1, #fff); display: flex; flex-direction: column; gap: 6px; }
.nbtrain-chat-empty { color: var(--jp-ui-font-color2, #6e7781); padding: 18px 4px; text-align: center; }
.nbtrain-chat-msg { padding: 6px 10px; border-radius: 10px; line-height: 1.45; min-width: 0; }
.nbtrain-chat-who { font-size: 11px; font-weight: 600; color: var(--jp-ui-font-color2, #57606a);
  margin-bottom: 2px; }
.nbtrain-chat-text { white-space: pre-wrap; overflow-wrap: anywhere; }
.nbtrain-chat-user { align-self: flex-end; max-width: 75%; background: var(--jp-brand-color3, #dbeafe); }
.nbtrain-chat-replies { display: grid; gap: 6px; }
.nbtrain-chat-tuned { background: var(--jp-success-color3, #e6f4ea); }
.nbtrain-chat-base { background: var(--jp-layout-color2, #f1f3f5); }
.nbtrain-chat-typing { letter-spacing: 2px; font-size: 9px; line-height: 12px;
  color: var(--jp-ui-font-color2, #6e7781); animation: nbtrain-chat-pulse 1s ease-in-out infinite; }
@keyframes nbtrain-chat-pulse { 50% { opacity: 0.3; } }
.nbtrain-chat-call { margin: 4px 0; border: 1px solid var(--jp-border-color2, #d0d7de); border-radius: 6px;
  background: var(--jp-layout-color1, #fff); overflow: hidden; }
.nbtrain-chat-call-head { display: flex; gap: 8px; align-items: baseline; padding: 4px 8px; }
.nbtrain-chat-call-tag { font-size: 10px; font-weight: 700; text-transform: uppercase; letter-spacing: 0.5px;
  color: var(--jp-brand-color1, #1976d2); }
.nbtrain-chat-call-sig { font-family: var(--jp-code-font-family, monospace); font-size: 12px; flex: 1;
  min-width: 0; overflow-wrap: anywhere; }
.nbtrain-chat-call-state { font-size: 11px; color: var(--jp-ui-font-color2, #57606a); white-space: nowrap; }
.nbtrain-chat-call-error .nbtrain-chat-call-state { color: var(--jp-error-color1, #b3261e);
  font-weight: 600; }
.nbtrain-chat-call-ask { display: flex; gap: 8px; align-items: center; padding: 4px 8px 6px;
  font-size: 12px; }
.nbtrain-chat-call-ask button { height: 24px; padding: 0 12px; border-radius: 5px; font: inherit;
  cursor: pointer; border: 1px solid var(--jp-border-color1, #c4c4c4);
  background: var(--jp-layout-color1, #fff); color: inherit; }
.nbtrain-chat-call-ask .nbtrain-chat-call-run { background: var(--jp-brand-color1, #1976d2); color: #fff;
  border-color: transparent; font-weight: 600; }
.nbtrain-chat-call-ask button:disabled { opacity: 0.45; cursor: default; }
.nbtrain-chat-call-result { margin: 0; padding: 4px 8px; font-size: 12px; max-height: 160px; overflow: auto;
  white-space: pre-wrap; overflow-wrap: anywhere; border-top: 1px solid var(--jp-border-color2, #d0d7de);
  background: var(--jp-layout-color2, #f6f8fa); }
.nbtrain-chat-call-error .nbtrain-chat-call-result { color: var(--jp-error-color1, #b3261e); }
.nbtrain-chat-note { font-size: 12px; color: var(--jp-error-color1, #b3261e); padding: 0 4px; }
.nbtrain-chat-input { border: 1px solid var(--jp-border-color2, #e0e0e0); border-top: none;
  border-radius: 0 0 8px 8px; padding: 6px 8px 4px; background: var(--jp-layout-color1, #fff); }
.nbtrain-chat-row { display: flex; gap: 6px; align-items: flex-end; }
.nbtrain-chat-send { flex: none; height: 34px; padding: 0 16px; border: none; border-radius: 6px;
  background: var(--jp-brand-color1, #1976d2); color: #fff; font: inherit; font-weight: 600;
  cursor: pointer; }
.nbtrain-chat-send:disabled { opacity: 0.45; cursor: default; }
.nbtrain-chat-input textarea { flex: 1; min-width: 0; box-sizing: border-box; resize: none;
  min-height: 34px;
  border: 1px solid var(--jp-border-color1, #c4c4c4); border-radius: 6px; padding: 6px 8px;
  font: inherit; color: inherit; background: var(--jp-layout-color0, #fff); outline: none; }
.nbtrain-chat-input textarea:focus { border-color: var(--jp-brand-color1, #1976d2);
  box-shadow: 0 0 0 1px var(--jp-brand-color1, #1976d2); }
.nbtrain-chat-hint { font-size: 11px; color: var(--jp-ui-font-color3, #8c959f); padding: 2px 2px 0; }
.nbtrain-chat-busy .nbtrain-chat-hint::after { content: " · answering…"; }
.nbtrain-chat-attach { flex: none; height: 34px; padding: 0 10px; border-radius: 6px; font: inherit;
  border: 1px solid var(--jp-border-color1, #c4c4c4); background: var(--jp-layout-color1, #fff);
  color: inherit; cursor: pointer; }
.nbtrain-chat-chip { flex: none; position: relative; height: 34px; }
.nbtrain-chat-chip img { height: 34px; width: 34px; object-fit: cover; border-radius: 6px;
  border: 1px solid var(--jp-border-color1, #c4c4c4); image-rendering: pixelated; }
.nbtrain-chat-drop { position: absolute; top: -6px; right: -6px; width: 16px; height: 16px; padding: 0;
  border: none; border-radius: 8px; background: var(--jp-ui-font-color2, #57606a); color: #fff;
  font-size: 11px; line-height: 16px; cursor: pointer; }
.nbtrain-chat-image { display: block; max-width: 160px; max-height: 160px; min-width: 64px; min-height: 64px;
  object-fit: contain; border-radius: 6px; margin: 2px 0 4px; image-rendering: pixelated; }
"""


class ChatView(anywidget.AnyWidget):
    """The transcript, the text box and its Send button: ``turns`` (answered), ``live`` (the one being
    answered), ``value`` (the text box). On Enter or Send the front end sends ``{"type": "submit",
    "text"}``; the kernel answers ``{"type": "sent", "text"}`` when it took the message, and the front
    end empties the box then (so a message the kernel refused stays there)."""

    _esm = _ESM
    _css = _CSS
    value = traitlets.Unicode("").tag(sync=True)
    placeholder = traitlets.Unicode("").tag(sync=True)
    busy = traitlets.Bool(False).tag(sync=True)  # a reply is coming (or the server starting)
    can_send = traitlets.Bool(False).tag(sync=True)
    kinds: traitlets.List[list[str]] = traitlets.List().tag(sync=True)  # [kind, label, tooltip] a column
    turns: traitlets.List[dict[str, Any]] = traitlets.List().tag(sync=True)
    live = traitlets.Any(None).tag(sync=True)  # a Turn's state, or None
    empty_text = traitlets.Unicode("").tag(sync=True)
    images = traitlets.Bool(False).tag(sync=True)  # a vision-language model's: the Image button shows
    attached = traitlets.Unicode("").tag(sync=True)  # the picture for the next message (a data: URI)


@dataclass
class Turn:
    """One exchange: the user's message, each model's reply (as far as it came), the kinds still
    answering, and why a reply is missing (``note``)."""

    user: str
    replies: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    note: str | None = None
    images: list[str] = field(default_factory=list)  # data: URIs sent with the message
    # With tools: a reply's text pieces ({"type": "text", "text"}) and calls, in order, and the assistant
    # and tool messages it made (what the model sees of this turn later).
    steps: dict[str, list[dict[str, Any] | Call]] = field(default_factory=dict)
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def answered(self, kind: str) -> bool:
        return kind in self.replies and kind not in self.pending and self.note is None

    def state(self) -> dict[str, Any]:
        steps = {
            k: [p.state_dict() if isinstance(p, Call) else dict(p) for p in v] for k, v in self.steps.items()
        }
        return {"user": self.user, "replies": dict(self.replies), "pending": list(self.pending),
                "note": self.note, "images": list(self.images), "steps": steps}  # fmt: skip


class ChatWidget:
    """The chat: ``view`` (transcript, text box and Send), ``clear_button``, ``close_button``,
    ``restart_button``, ``reopen_button``, the sliders and ``status``; ``turns`` holds the exchanges
    (``Turn``), kept when the widget closes."""

    refresh_seconds = 0.05  # the transcript shows a streaming reply at most this often (and at its end)
    watch_seconds = 1.0  # how often the widget checks that its server still runs

    def __init__(
        self,
        run: Run | str | Path,
        *,
        compare_base: bool = False,
        temperature: float = 0.0,
        max_tokens: int = 128,
        top_p: float = 1.0,
        start_timeout: float = 300.0,
        tools: Iterable[Callable[..., Any]] | None = None,
        confirm_tools: bool = True,
        stop: str | list[str] | None = None,
    ) -> None:
        self.run = get_run(run)
        self.tools = Tools.of(tools) if tools else Tools()  # refused here, before any server starts
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])  # strings that end a reply
        self._decisions: dict[str, tuple[threading.Event, list[bool]]] = {}  # a call's Run / Skip
        self.compare_base = compare_base
        self.start_timeout = start_timeout
        key = (self.run.dir.resolve(), compare_base)
        self.turns: list[Turn] = _KEPT.setdefault(key, [])
        for t in self.turns:  # a widget closed while answering left these waiting
            if t.pending:
                t.pending, t.note = [], t.note or "no answer: the chat was closed while it answered"
        self.error: str | None = None
        self.server: ServerHandle | None = None
        self.started_server = False  # True when this widget started the server (Close stops it)
        self.gone = False  # the server stopped under the widget; Restart starts it again
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = False
        self._stopped = False  # Close stopped the server this widget started
        self._ready = ""
        self._shown = 0.0

        self.status = widgets.HTML()
        self.view = ChatView(
            placeholder=f"Message {self.run.name or self.run.id}…",
            empty_text="Ask the tuned model something"
            + (" — its base model answers beside it." if compare_base else ".")
            + (f" It may call your functions: {', '.join(self.tools.names)}." if self.tools else ""),
        )
        self.view.on_msg(self._on_view_msg)
        self.view.images = bool(self.run.config.get("vision"))

        def button(description: str, icon: str, tooltip: str, **kw: Any) -> widgets.Button:
            return widgets.Button(
                description=description, icon=icon, tooltip=tooltip,
                layout=widgets.Layout(width="auto", padding="0 12px", **kw.pop("layout", {})), **kw,
            )  # fmt: skip

        self.clear_button = button("Clear", "eraser", "forget the conversation")
        self.close_button = button(
            "Close", "times", "stop the server this chat started; the conversation is kept"
        )
        self.restart_button = button(
            "Restart server", "refresh", "start the run's server again; the conversation is kept",
            button_style="warning", layout={"display": "none"},
        )  # fmt: skip
        self.reopen_button = button("Reopen", "comments", "open the chat again", button_style="primary")

        def slider(kind: type[widgets.FloatSlider | widgets.IntSlider], **kw: Any) -> Any:
            return kind(
                continuous_update=False, style={"description_width": "initial"},
                layout=widgets.Layout(flex="1 1 200px", min_width="200px", max_width="290px"), **kw,
            )  # fmt: skip

        self.temperature = slider(
            widgets.FloatSlider, value=temperature, min=0.0, max=2.0, step=0.05, description="temperature",
            tooltip="0 answers greedily (the same every time)",
        )  # fmt: skip
        self.max_tokens = slider(
            widgets.IntSlider, value=max_tokens, min=1, max=1024, step=1, description="max tokens",
            tooltip="the longest reply, in tokens",
        )  # fmt: skip
        self.top_p = slider(
            widgets.FloatSlider, value=top_p, min=0.05, max=1.0, step=0.05, description="top p",
            tooltip="sample from the smallest set of tokens this likely (1: all)",
        )  # fmt: skip
        self.clear_button.on_click(lambda _: self.clear())
        self.close_button.on_click(lambda _: self.close())
        self.restart_button.on_click(lambda _: self.restart())
        self.reopen_button.on_click(lambda _: self.reopen())
        self.confirm_tools = widgets.Checkbox(
            value=confirm_tools, description="ask before running a tool", indent=False,
            layout=widgets.Layout(width="auto", display=None if self.tools else "none"),
        )  # fmt: skip
        self.closed_note = widgets.HTML()
        settings = widgets.HBox(
            [self.temperature, self.max_tokens, self.top_p, self.confirm_tools],
            layout=widgets.Layout(flex_flow="row wrap", max_width="880px"),
        )
        self._open_children = [
            self.status,
            self.view,
            widgets.HBox([self.clear_button, self.close_button, self.restart_button]),
            settings,
        ]
        self.widget = widgets.VBox(self._open_children)
        self._set_kinds(None)
        self._publish(force=True)
        self._open()

    # ------------------------------------------------------------------------------ threading
    def _start_thread(self, target: Any, *args: Any) -> None:
        def body() -> None:
            try:
                target(*args)
            except Exception as e:  # noqa: BLE001 - shown in the widget: a thread's error is otherwise lost
                self.error = f"{type(e).__name__}: {e}"
                self._set_status(f"<span style='color:#b3261e'>{html.escape(self.error)}</span>")
            finally:
                self._set_busy(False)

        self._set_busy(True)
        self._thread = threading.Thread(target=body, name="nbtrain-chat", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the current background work (connecting, or answering) is done."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.view.busy = busy
        self._update_can_send()

    def _update_can_send(self) -> None:
        self.view.can_send = not (self._busy or self.server is None or self._closed or self.gone)

    def _open(self) -> None:
        self._closed = False
        self.gone = False
        self.restart_button.layout.display = "none"
        self.widget.children = self._open_children
        self._set_status(f"starting the server of <code>{html.escape(self.run.id)}</code>…")
        self._start_thread(self._connect)

    def _connect(self) -> None:
        server = find_server(self.run)
        if (
            server is None
            or "tuned" not in server.models
            or (self.compare_base and "base" not in server.models)
        ):
            server = serve(self.run, timeout=self.start_timeout)
            self.started_server = not server.reused
        self._use(server)

    def _use(self, server: ServerHandle) -> None:
        self.server = server
        self.gone = False
        if self._closed:  # closed while the server was starting
            self._stop_server()
            return
        self._set_kinds(server)
        self._ready = (
            f"<span style='color:#2e7d32'>\u25cf</span> <b>{html.escape(server.models['tuned'])}</b>"
            + (" beside its base model" if self.compare_base else "")
            + f" · served at <code>{html.escape(server.url)}</code> ({html.escape(server.device)})"
        )
        self._set_status(self._ready)
        threading.Thread(target=self._watch, args=(server,), name="nbtrain-chat-watch", daemon=True).start()

    def _watch(self, server: ServerHandle) -> None:
        """Say so as soon as the server stops (an export or ``serve --stop`` elsewhere, a crash)."""
        while not self._closed and self.server is server and not self.gone:
            if not server.alive():
                if not self._closed and self.server is server:
                    self._server_gone("its process is no longer running")
                return
            time.sleep(self.watch_seconds)

    # ------------------------------------------------------------------------------- actions
    def _on_view_msg(self, _view: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "tool":
            self.decide(str(content.get("id")), bool(content.get("run")))
        if isinstance(content, dict) and content.get("type") == "submit":
            text = str(content.get("text", ""))
            image = str(content.get("image") or "")
            if self._take(text, [image] if image else []):
                self.view.attached = ""
                self.view.send({"type": "sent", "text": text})  # the front end empties the box

    def send(self, text: str | None = None, images: list[Any] | None = None) -> bool:
        """Send ``text`` (default: the text box, emptied then) to the tuned model, and to the base model
        when comparing; the replies stream into the transcript. ``images`` (a vision-language model's
        chat; paths, PIL images or data: URIs; default: the picture attached in the box) go with it.
        Nothing is sent while a reply is coming or when there is no server (False)."""
        from nbtrain.control.serve import data_uri

        pictures = [data_uri(i) for i in images] if images is not None else None
        if pictures is None:
            pictures = [self.view.attached] if self.view.attached else []
        if text is None:
            if not self._take(self.view.value, pictures):
                return False
            self.view.value = ""
            self.view.attached = ""
            return True
        return self._take(text, pictures)

    def _take(self, text: str, images: list[str] | None = None) -> bool:
        message = text.strip()
        if not message or self._closed or self._busy:
            return False
        if self.gone or self.server is None:
            return False
        too_big = [i for i in images or [] if len(i) > MAX_IMAGE_CHARS]
        if (images and not self.view.images) or too_big:
            why = (
                "this model takes text only"
                if not too_big
                else f"a picture is over {MAX_IMAGE_CHARS // 2**20} MiB"
            )
            self.error = f"not sent: {why}"
            self._set_status(f"<span style='color:#b3261e'>{html.escape(self.error)}</span>")
            return False
        if self.error is not None:  # a new message: the last one's error no longer applies
            self.error = None
            self._set_status(self._ready)
        with self._lock:
            self.turns.append(Turn(message, pending=list(self._kinds()), images=list(images or [])))
        self._publish(force=True)
        self._start_thread(self._answer, self.turns[-1])
        return True

    def _kinds(self) -> list[str]:
        return ["tuned", "base"] if self.compare_base else ["tuned"]

    def _params(self) -> dict[str, Any]:
        return {
            "temperature": float(self.temperature.value),
            "max_tokens": int(self.max_tokens.value),
            "top_p": float(self.top_p.value),
            **({"stop": self.stop} if self.stop else {}),
        }

    def _history(self, kind: str, turn: Turn) -> list[dict[str, Any]]:
        """The conversation so far as ``kind`` saw it: the answered turns before ``turn``, then it (a turn
        with pictures as image_url parts before its text)."""
        msgs: list[dict[str, Any]] = []
        with self._lock:
            for t in self.turns:
                if t is turn:
                    break
                if t.answered(kind):
                    msgs.append({"role": "user", "content": _content(t)})
                    msgs += t.messages.get(kind) or [{"role": "assistant", "content": t.replies[kind]}]
        return [*msgs, {"role": "user", "content": _content(turn)}]

    def _answer(self, turn: Turn) -> None:
        server = self.server
        assert server is not None
        params = self._params()
        for kind in list(turn.pending):
            with self._lock:
                turn.replies[kind] = ""
            try:
                self._reply(server, kind, turn, params)
            except ServerGone:
                if self._closed:  # Close stopped the server this widget started
                    self._give_up(turn, None)
                    return
                self._give_up(turn, "no answer: the model server stopped (Restart asks again)")
                self._server_gone("the connection was refused or broke")
                return
            except ServeError as e:
                self._give_up(turn, f"no answer: {e}")
                self.error = str(e)
                self._set_status(f"<span style='color:#b3261e'>{html.escape(self.error)}</span>")
                return
            if self._closed:  # closed while answering: what came is kept
                self._give_up(turn, None)
                return
            with self._lock:
                if kind in turn.pending:
                    turn.pending.remove(kind)
            self._publish(force=True)

    def _reply(self, server: ServerHandle, kind: str, turn: Turn, params: dict[str, Any]) -> None:
        """``kind``'s reply to ``turn``, streamed into it. With tools, each call the model makes is run
        (after the user's yes when ``confirm_tools``) and its result sent back, until it answers."""
        history = self._history(kind, turn)
        made: list[dict[str, Any]] = []
        extra: dict[str, Any] = {"tools": self.tools.schemas} if self.tools else {}
        for _ in range(MAX_TOOL_ROUNDS if self.tools else 1):
            into: dict[str, Any] = {}
            part: dict[str, Any] = {"type": "text", "text": ""}
            with self._lock:
                turn.steps.setdefault(kind, []).append(part)
            stream = server.stream_chat(history + made, base=kind == "base", into=into, **params, **extra)
            with contextlib.closing(stream):  # leaving early closes the connection: the server stops
                for piece in stream:
                    if self._closed:
                        return
                    with self._lock:
                        turn.replies[kind] += piece
                        part["text"] += piece
                    self._publish()
            calls = [Call(str(c.get("id") or f"call_{i}"), c["function"]["name"], c["function"]["arguments"])
                     for i, c in enumerate(into.get("tool_calls") or [])]  # fmt: skip
            if not calls:
                break
            made.append({"role": "assistant", "content": part["text"],
                         "tool_calls": into["tool_calls"]})  # fmt: skip
            for call in calls:
                with self._lock:
                    turn.steps[kind].append(call)
                self._publish(force=True)
                if not self._call(call):
                    return  # closed while asking
                self._publish(force=True)
                made.append(call.message())
        else:
            if self.tools:
                with self._lock:
                    turn.note = f"stopped: the model was still calling tools after {MAX_TOOL_ROUNDS} rounds"
        if self.tools:
            with self._lock:
                turn.messages[kind] = [*made, {"role": "assistant", "content": part["text"]}]

    def _call(self, call: Call) -> bool:
        """Run ``call`` once the user said yes (or at once without ``confirm_tools``); False when the chat
        closed while it asked."""
        if self.confirm_tools.value:
            event, answer = threading.Event(), list[bool]()
            self._decisions[call.id] = (event, answer)
            try:
                while not event.wait(0.1):
                    if self._closed:
                        return False
            finally:
                self._decisions.pop(call.id, None)
            if not answer[0]:
                call.state, call.result = "skipped", "the user did not let this call run"
                return True
        run_call(self.tools, call)
        return True

    def decide(self, call_id: str, run: bool = True) -> bool:
        """Answer the chat's "run this call?" (Run: ``run=True``, Skip: False); False if no call with that
        id is waiting."""
        waiting = self._decisions.get(call_id)
        if waiting is None:
            return False
        waiting[1].append(run)
        waiting[0].set()
        return True

    @property
    def asking(self) -> list[str]:
        """The ids of the calls waiting for the user's Run or Skip."""
        return list(self._decisions)

    def _give_up(self, turn: Turn, note: str | None) -> None:
        with self._lock:
            if turn.pending:
                turn.pending = []
                turn.note = note or "no answer: the chat was closed while it answered"
        self._publish(force=True)

    def clear(self) -> None:
        """Forget the conversation (the server keeps running)."""
        with self._lock:
            self.turns.clear()
        self.error = None
        if self.server is not None and not self.gone:
            self._set_status(self._ready)
        self._publish(force=True)

    def close(self) -> None:
        """Stop the server if this widget started it (its memory, GPU included, is released) and fold the
        widget to one line; the conversation is kept (Reopen, or ``run.chat()`` again, shows it)."""
        self._closed = True
        self._update_can_send()
        self._stop_server()
        n = len(self.turns)
        self.closed_note.value = (
            f"<span style='color:var(--jp-ui-font-color2,#57606a)'>Chat with "
            f"<b>{html.escape(self.run.name or self.run.id)}</b> closed"
            + (" and its server stopped" if self._stopped else "")
            + (f"; the conversation ({n} message{'s' * (n != 1)}) is kept." if n else ".")
            + "</span>"
        )
        self.widget.children = [widgets.HBox([self.closed_note, self.reopen_button])]
        self._set_status("closed")

    def reopen(self) -> None:
        """Open the chat again after Close: its conversation as it was, its server started again."""
        if self._closed:
            self.wait(30)
            self._open()

    def restart(self) -> None:
        """Start the run's server again after it went away; the conversation is kept, and a message the
        old server did not answer is asked again."""
        if self._closed or self._busy:
            return
        self.restart_button.layout.display = "none"
        self._set_status(f"starting the server of <code>{html.escape(self.run.id)}</code> again…")
        self._start_thread(self._restart)

    def _restart(self) -> None:
        self.server = None
        server = serve(self.run, timeout=self.start_timeout)
        self.started_server = self.started_server or not server.reused
        self._use(server)
        with self._lock:
            last = self.turns[-1] if self.turns else None
            again = last is not None and last.note is not None and "server stopped" in last.note
            if again and last is not None:
                last.replies, last.note, last.pending = {}, None, list(self._kinds())
        if again and last is not None and not self._closed:
            self._publish(force=True)
            self._answer(last)

    def _stop_server(self) -> None:
        self._stopped = False
        if self.server is not None and self.started_server:
            self.server.stop()
            self.started_server = False
            self._stopped = True

    def _server_gone(self, why: str) -> None:
        self.gone = True
        self._update_can_send()
        server = self.server
        log = server.run_dir / "logs" / "serve.log" if server is not None else None
        where = f" at <code>{html.escape(server.url)}</code>" if server is not None else ""
        shown_log = ""
        if log is not None:
            short = html.escape(f"{self.run.id}/logs/serve.log")
            shown_log = f"; its log: <code title='{html.escape(str(log))}'>{short}</code>"
        self._set_status(
            "<div style='color:#b3261e'><b>The model server has stopped, so the chat cannot answer.</b>"
            "</div><div>It was stopped (for example by <code>%finetune serve --stop</code>) or it exited"
            f"{shown_log}. <b>Restart server</b> starts it again; the conversation is kept.</div>"
            f"<div style='color:var(--jp-ui-font-color2,#6e7781)'>{html.escape(why)}{where}</div>"
        )
        self.restart_button.layout.display = None

    # ------------------------------------------------------------------------------- display
    def _set_status(self, markup: str) -> None:
        self.status.value = f"<div style='font-size:90%;line-height:1.5'>{markup}</div>"

    def _set_kinds(self, server: ServerHandle | None) -> None:
        names = server.models if server is not None else {}
        labels = {"tuned": names.get("tuned", "tuned"), "base": "base model"}
        titles = {
            "tuned": f"the fine-tuned model ({names.get('tuned', 'tuned')})",
            "base": f"the base model without the fine-tuning ({names.get('base', 'base')})",
        }
        self.view.kinds = [[k, labels[k], titles[k]] for k in self._kinds()]

    def _publish(self, force: bool = False) -> None:
        """Show the transcript: the answered turns, and the one being answered as ``live`` (a streaming
        reply sends only it, at most every ``refresh_seconds``)."""
        now = time.monotonic()
        if not force and now - self._shown < self.refresh_seconds:
            return
        self._shown = now
        with self._lock:
            states = [t.state() for t in self.turns]
            live = bool(self.turns) and bool(self.turns[-1].pending)
        with self.view.hold_sync():
            self.view.turns = states[:-1] if live else states
            self.view.live = states[-1] if live else None

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


MAX_IMAGE_CHARS = 32 * 2**20  # a picture's data: URI; the server takes images up to 32 MiB


def _content(turn: Turn) -> Any:
    if not turn.images:
        return turn.user
    return [
        *({"type": "image_url", "image_url": {"url": i}} for i in turn.images),
        {"type": "text", "text": turn.user},
    ]


def chat(run: Run | str | Path, *, compare_base: bool = False, **settings: Any) -> ChatWidget:
    """A chat widget for ``run`` (see ChatWidget); ``settings``: temperature, max_tokens, top_p, tools
    (notebook functions the model may call), confirm_tools, stop (strings that end a reply)."""
    return ChatWidget(run, compare_base=compare_base, **settings)
