"""Rendering of data previews: the trained-on / masked text of examples, and token-length statistics.

Used by ``%finetune preview`` / ``nbtrain.preview()`` (token-exact, from the worker's JSON) and by the
config panel's quick preview (the chat template rendered in the kernel). Masked text (no loss) is grey
and struck through, trained text is highlighted; plain text marks masked spans with ‹ ›. Plotly is
imported only when a histogram is drawn.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.control.jobs.preview import preview_data
from nbtrain.control.runs.run import Run

PRE = "white-space:pre-wrap;margin:0;font-family:monospace;font-size:12px"
MASKED_STYLE = "color:#9e9e9e;text-decoration:line-through"
MASK_OPEN, MASK_CLOSE = "‹", "›"  # plain-text markers around masked (not trained) text
CLIP = 4000  # characters per example, so one huge row cannot flood the notebook
IMAGE_RUN = re.compile(r"\[image: (\d+) tokens\]")  # the worker's run of image tokens (jobs/preview.py)
CHIP_STYLE = (
    "border:1px solid #9bb8c4;border-radius:3px;padding:0 4px;margin-right:4px;color:#2f5d6e;"
    "background:#eef5f8"
)
# an example's images beside its text (tiny pictures shown crisp, not blurred)
THUMB_STYLE = (
    "width:64px;height:64px;object-fit:contain;border:1px solid #ccc;border-radius:3px;margin:0 8px 4px 0;"
    "image-rendering:pixelated;display:block"
)


def segments_html(segments: Iterable[Sequence[Any]], mark: bool = True) -> str:
    """``[(text, trained), ...]`` as HTML: trained text in <mark>, masked text grey and struck through
    (with ``mark`` False, all of it plain: nothing says which tokens are trained)."""
    out = []
    for text, trained in segments:
        t = html.escape(str(text))
        image = IMAGE_RUN.fullmatch(str(text))
        if image:  # a vision-language model's image tokens: one chip, not struck-through text
            out.append(
                f"<span class='nbtrain-image-tokens' style='{CHIP_STYLE}'>image · {image[1]} tokens</span>"
            )
            continue
        if not mark:
            out.append(t)
        elif trained:
            out.append(f"<mark>{t}</mark>")
        else:
            out.append(f"<span class='nbtrain-masked' style='{MASKED_STYLE}'>{t}</span>")
    return "".join(out)


def segments_text(segments: Iterable[Sequence[Any]]) -> str:
    return "".join(str(t) if trained else f"{MASK_OPEN}{t}{MASK_CLOSE}" for t, trained in segments)


def _clip(s: str) -> str:
    return s if len(s) <= CLIP else s[: CLIP - 1] + "…"


def _loss_note(p: Mapping[str, Any]) -> str:
    if p.get("assistant_only_loss"):
        return "loss on assistant turns only (assistant_only_loss)"
    if p.get("completion_only_loss"):
        return "loss on completions only (completion_only_loss)"
    return "loss on every token (set train: assistant_only_loss: true to train on answers only)"


def _stats_line(p: Mapping[str, Any]) -> str:
    s = p["stats"]
    max_length = p.get("max_length")
    # What happens to a row longer than max_length (TRL: bfd truncates it, bfd_split and wrapped
    # carry the rest into other sequences).
    fate = {"bfd_split": "split across packed sequences", "wrapped": "wrapped into the next sequence"}
    what = fate.get(str(p.get("packing_strategy")), "truncated") if p.get("packing") else "truncated"
    over = (
        f"; {s['over_max_length']} of {s['rows']} exceed max_length {max_length} and are {what}"
        if max_length is not None
        else "; max_length: none (no truncation)"
    )
    sample = f"first {s['rows']} rows" if s["rows"] >= s["rows_limit"] else f"all {s['rows']} rows"
    trained = s["trained_tokens"] / s["tokens"] if s["tokens"] else 0.0
    return (
        f"tokens per example ({sample}): min {s['min']}, p50 {s['p50']}, p95 {s['p95']}, max {s['max']}, "
        f"mean {s['mean']:.1f}; {trained:.0%} of tokens trained{over}"
    )


def _setup_line(p: Mapping[str, Any]) -> str:
    bits = [f"format {p.get('format')}", _loss_note(p)]
    if p.get("chat_template"):
        bits.append(f"chat template: {p['chat_template']}")
    if p.get("packing"):
        bits.append(f"packing: {p.get('packing_strategy')} into sequences of {p.get('max_length')} tokens")
    if p.get("streaming"):
        bits.append("streaming")
    if len(p.get("sources") or []) > 1:
        bits.append("sources: " + ", ".join(p["sources"]))
    return "; ".join(bits)


def preview_text(p: Mapping[str, Any]) -> str:
    lines = [_setup_line(p), f"{MASK_OPEN}…{MASK_CLOSE} = masked (no loss)", ""]
    for ex in p["examples"]:
        cut = f", {ex['cut']} cut by max_length" if ex["cut"] else ""
        lines.append(
            f"--- example {ex['index']}: {ex['tokens']} tokens, {ex['trained']} trained{cut}{_images(ex)}"
        )
        lines.append(_clip(segments_text(ex["segments"])))
    lines += ["", _stats_line(p)]
    return "\n".join(lines)


def preview_html(p: Mapping[str, Any]) -> str:
    parts = [
        "<div class='nbtrain-token-preview'>",
        f"<div><small>{html.escape(_setup_line(p))}. <mark>highlighted</mark>: trained on; "
        f"<span style='{MASKED_STYLE}'>grey, struck</span>: masked (no loss)</small></div>",
    ]
    for ex in p["examples"]:
        cut = f", {ex['cut']} cut by max_length" if ex["cut"] else ""
        thumbs = "".join(
            f"<img src='{html.escape(uri)}' alt='image {j + 1} of example {ex['index']}' "
            f"style='{THUMB_STYLE}'>"
            for j, uri in enumerate(ex.get("images") or [])
            if str(uri).startswith("data:image/")
        )
        text = (
            f"<pre style='{PRE};background:#f6f6f6;padding:4px;flex:1'>"
            f"{segments_html([(_clip(str(t)), tr) for t, tr in ex['segments']])}</pre>"
        )
        body = (
            f"<div style='display:flex;align-items:flex-start'><div>{thumbs}</div>{text}</div>"
            if thumbs
            else text
        )
        parts.append(
            "<div style='border-left:3px solid #bbb;padding-left:8px;margin:6px 0'>"
            f"<div><b>example {ex['index']}</b> <small>{ex['tokens']} tokens, {ex['trained']} trained"
            f"{html.escape(cut + _images(ex))}</small></div>{body}</div>"
        )
    parts.append(f"<div><small>{html.escape(_stats_line(p))}</small></div></div>")
    return "".join(parts)


def _images(ex: Mapping[str, Any]) -> str:
    """ ", 1 image (64 image tokens)" for an example of a vision-language run; "" otherwise."""
    if "image_tokens" not in ex:
        return ""
    n = len(ex.get("images") or [])
    return f", {n} image{'s' if n != 1 else ''} ({ex['image_tokens']} image tokens)"


def _tallest(lengths: Sequence[int], size: int) -> int:
    counts: dict[int, int] = {}
    for v in lengths:
        counts[v // size] = counts.get(v // size, 0) + 1
    return max(counts.values(), default=1)


def length_histogram(p: Mapping[str, Any]) -> Any:
    """A Plotly histogram of tokens per example, with max_length marked.

    The bins follow the lengths measured (at least one token wide), so equal lengths make one visible bar;
    max_length far beyond every example is named at the chart's edge rather than stretching the axis to
    it (which would leave the bars a sliver at the left)."""
    import plotly.graph_objects as go

    from nbtrain.ui.figures import COLORS, MUTED, STATE_COLORS, THEME

    lengths = [int(v) for v in p["lengths"]]
    lo, hi = (min(lengths), max(lengths)) if lengths else (0, 1)
    size = max(1, math.ceil((hi - lo + 1) / 40))
    fig = go.Figure(
        go.Histogram(
            x=lengths,
            name="examples",
            marker={"color": COLORS["loss"], "line": {"color": "white", "width": 1}},
            xbins={"start": lo - 0.5, "end": hi + size + 0.5, "size": size},
            hovertemplate="%{x} tokens: <b>%{y}</b> examples<extra></extra>",
        )
    )
    # the bars, with room for a few bins either side
    pad = max(3 * size, (hi - lo) * 0.05)
    x_range = [max(0.0, lo - pad), hi + size + pad]
    max_length = p.get("max_length")
    red = STATE_COLORS["failed"]
    if max_length is not None and max_length <= x_range[1] + (x_range[1] - x_range[0]) * 0.5:
        x_range[1] = max(x_range[1], max_length + pad)
        fig.add_vline(
            x=max_length, line={"dash": "dash", "color": red, "width": 1.5},
            annotation={"text": f"max_length {max_length}", "font": {"color": red, "size": 11}},
        )  # fmt: skip
    elif max_length is not None:
        fig.add_annotation(
            text=f"max_length {max_length} →", xref="paper", yref="paper", x=1, y=1, xanchor="right",
            yanchor="bottom", showarrow=False, font={"color": MUTED, "size": 11},
        )  # fmt: skip
    fig.update_layout(
        template=THEME,
        title={"text": f"<b>tokens per example</b> ({p['stats']['rows']} rows)", "font": {"size": 14}},
        xaxis={"title": {"text": "tokens"}, "range": x_range},
        # whole examples: no 0.5 ticks
        yaxis={"title": {"text": "examples"}, "dtick": max(1, math.ceil(_tallest(lengths, size) / 5))},
        height=300,
        margin={"l": 56, "r": 24, "t": 48, "b": 44},
        bargap=0.08,
        showlegend=False,
    )
    return fig


@dataclass
class DataPreview:
    """What ``nbtrain.preview`` returns: ``data`` is the worker's JSON (examples as (text, trained)
    segments, ``stats``, ``lengths``); shown as HTML with a Plotly histogram of tokens per example."""

    data: dict[str, Any]
    source: str  # the run id, or "config"

    @property
    def examples(self) -> list[dict[str, Any]]:
        return list(self.data["examples"])

    @property
    def stats(self) -> dict[str, Any]:
        return dict(self.data["stats"])

    def text(self) -> str:
        return preview_text(self.data)

    def html(self) -> str:
        return preview_html(self.data)

    def figure(self) -> Any:
        return length_histogram(self.data)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return self.html()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        # HTML with the plain-text rendering as its fallback (a terminal, a plain-text export).
        display({"text/html": self.html(), "text/plain": self.text()}, raw=True)
        display(self.figure())


def preview(
    config: str | Path | Mapping[str, Any] | Run,
    n: int = 5,
    *,
    stats_rows: int = 2000,
    timeout: float = 600.0,
) -> DataPreview:
    """The first ``n`` training examples as the trainer tokenises them (trained tokens marked) and
    token-length statistics over the first ``stats_rows`` rows; see
    nbtrain.control.jobs.preview.preview_data."""
    data, source = preview_data(config, n, stats_rows=stats_rows, timeout=timeout)
    return DataPreview(data, source)
