"""Run notebook cells in a real Jupyter kernel (nbclient), as a user's notebook would.

nbformat and nbclient are imported where used: modules that only read cells (text_of) import this on a
GPU machine that has neither (bench/gpu.py's device run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def make_notebook(cells: list[str]) -> Any:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    return nb


def execute(cells: list[str], cwd: Path, *, allow_errors: bool = False, timeout: int = 300) -> Any:
    from nbclient import NotebookClient

    nb = make_notebook(cells)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return nb


def text_of(cell: Any) -> str:
    """Everything a cell showed: streams, results (text/plain) and errors."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(str(out["data"].get("text/plain", "")))
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
    return "".join(parts)


def error_of(cell: Any) -> tuple[str, str] | None:
    """The cell's error. IPython shows a UsageError as stderr text (no traceback), not an error output."""
    for out in cell.get("outputs", []):
        if out["output_type"] == "error":
            return out["ename"], out["evalue"]
        if (
            out["output_type"] == "stream"
            and out["name"] == "stderr"
            and out["text"].startswith("UsageError: ")
        ):
            return "UsageError", out["text"].removeprefix("UsageError: ")
    return None
