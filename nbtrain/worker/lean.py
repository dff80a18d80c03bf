"""Keep a training process from importing packages its run never uses.

Two installed packages are imported by the libraries at import time whatever the run does:

- bitsandbytes: peft imports it as soon as peft itself is imported (and bitsandbytes loads its kernels
  and much of ``torch._inductor``): ~1.2 s of every rank's start-up here, for runs that never quantise.
- scipy: transformers imports ``scipy.optimize`` to define the loss of its object-detection models
  (~0.35 s); a causal language model never calls it.

Before any library is imported, a run that does not use one of them hides it from the import system
(``sys.modules[name] = None``): ``importlib.util.find_spec`` then reports it absent, so peft and
transformers take their without-it paths, exactly as on a machine where it is not installed. Only this
training process is affected, never the kernel. ``NBTRAIN_LEAN_IMPORTS=0`` turns it off; a run with
``trust_remote_code: true`` keeps scipy (remote model code may import anything).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# TrainingArguments ``optim`` values implemented in torch itself (no bitsandbytes, no extra package).
TORCH_OPTIMIZERS = frozenset({"adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop", "adafactor"})

WHY_HIDDEN = {
    "bitsandbytes": "the run neither quantises (method: qlora) nor uses a bitsandbytes optimizer",
    "scipy": "transformers imports it only for object-detection losses",
}


def needs_bitsandbytes(resolved: dict[str, Any]) -> bool:
    """Whether the run quantises weights or uses an optimizer that may come from bitsandbytes (any
    ``optim`` not in TORCH_OPTIMIZERS counts: unknown names are given the benefit of the doubt)."""
    cfg = resolved.get("config") or {}
    if cfg.get("method") == "qlora" or cfg.get("quantization"):
        return True
    optim = (resolved.get("train_args") or {}).get("optim")
    return optim is not None and str(optim) not in TORCH_OPTIMIZERS


def unused_packages(resolved: dict[str, Any]) -> list[str]:
    """The packages of WHY_HIDDEN this run does not use."""
    cfg = resolved.get("config") or {}
    unused = [] if needs_bitsandbytes(resolved) else ["bitsandbytes"]
    if not cfg.get("trust_remote_code"):
        unused.append("scipy")
    return unused


def hide_unused_packages(resolved: dict[str, Any]) -> list[str]:
    """Hide what this run does not use (unless ``NBTRAIN_LEAN_IMPORTS=0``); returns what was hidden.
    Must run before torch, transformers or peft are imported: what is already imported stays."""
    return hide_packages(unused_packages(resolved))


def hide_packages(names: list[str]) -> list[str]:
    """Hide each of ``names`` not imported yet; returns the ones hidden (now or before: a process forked
    by the warm process, nbtrain.worker.warm, finds them hidden already)."""
    if os.environ.get("NBTRAIN_LEAN_IMPORTS", "1") == "0":
        return []
    hidden = [name for name in names if name not in sys.modules or sys.modules[name] is None]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # find_spec -> None, import -> ImportError
    return hidden


def unhide_packages(names: tuple[str, ...]) -> None:
    """Let ``names`` be imported again in a process that inherited them hidden (forked by the warm process):
    for packages nothing already imported decided on (scipy for lm-eval's metrics), unlike bitsandbytes,
    whose absence peft and transformers fix at their own import."""
    for name in names:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


def hidden_import_hint(error: BaseException, hidden: list[str]) -> str | None:
    """The fix, when ``error`` is the import of a package this process hid."""
    if not isinstance(error, ImportError):
        return None
    name = (error.name or "").split(".")[0]
    if name not in hidden:
        return None
    return (
        f"nbtrain did not load {name} in this training process ({WHY_HIDDEN[name]}), but something "
        f"in the run imported it. Set NBTRAIN_LEAN_IMPORTS=0 in the environment (the kernel's, before "
        f"starting the run) to load every installed package."
    )


def hide_for_run(run_dir: Path, *, keep: tuple[str, ...] = (), label: str = "nbtrain") -> list[str]:
    """hide_unused_packages for a process that works on a finished run (serve, export, eval): what the
    run's resolved.json says it does not use, less ``keep``; says on stdout what was left out."""
    from nbtrain.contract.rundir import RunPaths, read_json

    try:
        resolved = read_json(RunPaths(run_dir).resolved)
    except (OSError, ValueError):
        return []  # not a run directory: the caller reports that itself
    hidden = hide_packages([n for n in unused_packages(resolved) if n not in keep])
    if hidden:
        print(f"{label}: not loaded (this run does not use them): {', '.join(hidden)}", flush=True)
    return hidden
