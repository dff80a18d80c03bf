"""A small chat with a run's fine-tuned model, optionally beside its base model.

    run.chat(compare_base=True)          # or: %finetune chat RUN --compare-base

The widget talks HTTP to the run's server (``nbtrain.serve``): it reuses a server that is up, or starts
one, and Close stops the server it started (releasing its GPU memory). The model never loads in the
kernel. Starting the server and every request run in a background thread, so the cell returns at once
and the kernel stays free; errors from that thread show in the widget (and stay in ``error``).
"""

from __future__ import annotations

import html
import threading
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from nbtrain.runs import Run, get_run
from nbtrain.serve.control import ServerHandle, find_server, serve

_STYLE = "white-space:pre-wrap;padding:4px 8px;margin:2px 0;border-radius:4px"


class ChatWidget:
    """The chat: ``text``, ``send_button``, ``clear_button``, ``close_button``, the sliders and the
    ``transcript``; ``turns`` holds (user, tuned reply, base reply or None) for each exchange."""

    def __init__(
        self,
        run: Run | str | Path,
        *,
        compare_base: bool = False,
        temperature: float = 0.0,
        max_tokens: int = 128,
        top_p: float = 1.0,
        start_timeout: float = 300.0,
    ) -> None:
        self.run = get_run(run)
        self.compare_base = compare_base
        self.turns: list[tuple[str, str | None, str | None]] = []
        self.error: str | None = None
        self.server: ServerHandle | None = None
        self.started_server = False  # True when this widget started the server (Close stops it)
        self._history: dict[str, list[dict[str, str]]] = {"tuned": [], "base": []}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._ready = ""

        self.status = widgets.HTML()
        self.transcript = widgets.HTML(layout=widgets.Layout(max_height="420px", overflow_y="auto"))
        self.text = widgets.Textarea(
            placeholder="Your message, then Send",
            layout=widgets.Layout(width="100%", height="60px"),
        )
        self.send_button = widgets.Button(description="Send", button_style="primary", disabled=True)
        self.clear_button = widgets.Button(description="Clear")
        self.close_button = widgets.Button(description="Close", button_style="warning")
        self.temperature = widgets.FloatSlider(
            value=temperature, min=0.0, max=2.0, step=0.05, description="temperature"
        )
        self.max_tokens = widgets.IntSlider(
            value=max_tokens, min=1, max=1024, step=1, description="max tokens"
        )
        self.top_p = widgets.FloatSlider(value=top_p, min=0.05, max=1.0, step=0.05, description="top_p")
        self.send_button.on_click(lambda _: self.send())
        self.clear_button.on_click(lambda _: self.clear())
        self.close_button.on_click(lambda _: self.close())
        self.widget = widgets.VBox(
            [
                self.status,
                self.transcript,
                self.text,
                widgets.HBox([self.send_button, self.clear_button, self.close_button]),
                widgets.HBox([self.temperature, self.max_tokens, self.top_p]),
            ]
        )
        self._set_status(f"starting the server of <code>{html.escape(self.run.id)}</code>…")
        self._render()
        self._start_thread(self._connect, start_timeout)

    # ------------------------------------------------------------------------------ threading
    def _start_thread(self, target: Any, *args: Any) -> None:
        def body() -> None:
            try:
                target(*args)
            except Exception as e:  # noqa: BLE001 - shown in the widget: a thread's error is otherwise lost
                self.error = f"{type(e).__name__}: {e}"
                self._set_status(f"<span style='color:#b00020'>{html.escape(self.error)}</span>")
            finally:
                if self.server is not None and not self._closed:
                    self.send_button.disabled = False

        self.send_button.disabled = True
        self._thread = threading.Thread(target=body, name="nbtrain-chat", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the current background work (connecting, or answering) is done."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _connect(self, timeout: float) -> None:
        server = find_server(self.run)
        if (
            server is None
            or "tuned" not in server.models
            or (self.compare_base and "base" not in server.models)
        ):
            server = serve(self.run, timeout=timeout)
            self.started_server = not server.reused
        self.server = server
        if self._closed:  # closed while the server was starting
            self._stop_server()
            return
        self._ready = (
            f"<b>{html.escape(server.models['tuned'])}</b>"
            + (" beside its base model" if self.compare_base else "")
            + f" — served at <code>{html.escape(server.url)}</code> ({html.escape(server.device)})"
        )
        self._set_status(self._ready)

    # ------------------------------------------------------------------------------- actions
    def send(self, text: str | None = None) -> None:
        """Send ``text`` (default: the text box) to the tuned model, and to the base model when
        comparing; the replies appear in the transcript when they arrive."""
        message = (self.text.value if text is None else text).strip()
        if not message or self.server is None or self._closed:
            return
        self.text.value = ""
        if self.error is not None:  # a new message: the last one's error no longer applies
            self.error = None
            self._set_status(self._ready)
        with self._lock:
            self.turns.append((message, None, None))
            index = len(self.turns) - 1
        self._render()
        self._start_thread(self._answer, index, message)

    def _params(self) -> dict[str, Any]:
        return {
            "temperature": float(self.temperature.value),
            "max_tokens": int(self.max_tokens.value),
            "top_p": float(self.top_p.value),
        }

    def _answer(self, index: int, message: str) -> None:
        assert self.server is not None
        params = self._params()
        kinds = ["tuned", "base"] if self.compare_base else ["tuned"]
        replies: dict[str, str] = {}
        for kind in kinds:
            history = [*self._history[kind], {"role": "user", "content": message}]
            reply = self.server.chat(history, base=kind == "base", **params)
            self._history[kind] = [*history, {"role": "assistant", "content": reply}]
            replies[kind] = reply
            with self._lock:
                self.turns[index] = (message, replies.get("tuned"), replies.get("base"))
            self._render()

    def clear(self) -> None:
        """Forget the conversation (the server keeps running)."""
        with self._lock:
            self.turns.clear()
            self._history = {"tuned": [], "base": []}
        self.error = None
        self._render()

    def close(self) -> None:
        """Stop the server if this widget started it (its memory, GPU included, is released) and
        close the widget."""
        self._closed = True
        self.send_button.disabled = True
        self._stop_server()
        self._set_status("closed")
        self.widget.close()

    def _stop_server(self) -> None:
        if self.server is not None and self.started_server:
            self.server.stop()
            self.started_server = False

    # ------------------------------------------------------------------------------- display
    def _set_status(self, markup: str) -> None:
        self.status.value = f"<div style='font-size:90%'>{markup}</div>"

    def _render(self) -> None:
        with self._lock:
            turns = list(self.turns)
        rows = []
        pending = "<i style='color:#888'>…</i>"
        for user, tuned, base in turns:
            rows.append(f"<div style='{_STYLE};background:#eef3fb'><b>you</b>\n{html.escape(user)}</div>")
            t = pending if tuned is None else html.escape(tuned)
            tuned_box = f"<div style='{_STYLE};background:#f3f9ee;flex:1'><b>tuned</b>\n{t}</div>"
            if self.compare_base:
                b = pending if base is None else html.escape(base)
                base_box = f"<div style='{_STYLE};background:#f6f6f6;flex:1'><b>base</b>\n{b}</div>"
                rows.append(f"<div style='display:flex;gap:6px'>{tuned_box}{base_box}</div>")
            else:
                rows.append(tuned_box)
        self.transcript.value = "".join(rows)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def chat(run: Run | str | Path, *, compare_base: bool = False, **settings: Any) -> ChatWidget:
    """A chat widget for ``run`` (see ChatWidget); ``settings``: temperature, max_tokens, top_p."""
    return ChatWidget(run, compare_base=compare_base, **settings)
