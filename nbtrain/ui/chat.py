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

from nbtrain.control.jobs.serve import ServeError, ServerGone, ServerHandle, find_server, serve
from nbtrain.control.runs.run import Run, get_run
from nbtrain.ui.chat_tools import Call, Tools, run_call

KINDS = ("tuned", "base")
MAX_TOOL_ROUNDS = 5  # calls then answers in one turn, at most: a model that keeps calling is stopped
# The conversations of this kernel, per (run directory, compare_base): Close keeps them for the next widget.
_KEPT: dict[tuple[Path, bool], list[Turn]] = {}

# The front end, as files beside this module (anywidget reads them; ESLint lints the script).
STATIC = Path(__file__).resolve().parent / "static"


class ChatView(anywidget.AnyWidget):
    """The transcript, the text box and its Send button: ``turns`` (answered), ``live`` (the one being
    answered), ``value`` (the text box). On Enter or Send the front end sends ``{"type": "submit",
    "text"}``; the kernel answers ``{"type": "sent", "text"}`` when it took the message, and the front
    end empties the box then (so a message the kernel refused stays there)."""

    _esm = STATIC / "chat.js"
    _css = STATIC / "chat.css"
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
    # With tools: a reply's text pieces ({"type": "text", "text"}; "malformed" with its "error" when the
    # server could not read the call the text tries to be) and calls, in order, and the assistant and
    # tool messages it made (what the model sees of this turn later).
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
        from nbtrain.control.jobs.serve import data_uri

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
            if into.get("nbtrain_tool_call_error"):  # shown as the call it tried to be, and what is wrong
                with self._lock:
                    part.update(type="malformed", error=str(into["nbtrain_tool_call_error"]))
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
