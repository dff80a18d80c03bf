"""Objects the notebook defines, captured for a training process: GRPO's reward functions (``rewards:``,
``nbtrain.contract.rewards``) and a run's hooks (``hooks:``, ``nbtrain.contract.hooks``).

A worker is a separate process that outlives the kernel, so the notebook's functions and classes are
serialised with cloudpickle when the run is prepared (kernel side: stdlib + cloudpickle, never torch), and
``start`` writes them into the run directory (``rewards.pkl``, ``hooks.pkl``; mode 0600), where the worker
loads them back, only when the user loading them owns them and nobody else can write them
(``nbtrain.contract.pickles``). A name that is missing, or an object that cannot be serialised, is a
problem found here, before anything starts.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nbtrain.contract.pickles import read_trusted


def notebook_namespace() -> Mapping[str, Any]:
    """The namespace the names are looked up in: the IPython user namespace when running in a kernel (the
    magic, the panel, ``nbtrain.finetune`` from a cell), else the ``__main__`` module."""
    if "IPython" in sys.modules:  # only ask IPython when it is already there; never import it
        from IPython import get_ipython

        ip = get_ipython()
        if ip is not None:
            ns: Mapping[str, Any] = ip.user_ns
            return ns
    main = sys.modules.get("__main__")
    return vars(main) if main is not None else {}


def close_name(name: str, namespace: Mapping[str, Any], also: Sequence[str] = ()) -> str | None:
    """The callable name of ``namespace`` (or of ``also``) closest to ``name``, for a 'did you mean'."""
    known = [k for k, v in namespace.items() if callable(v) and not k.startswith("_")] + list(also)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return close[0] if close else None


def missing(name: str, namespace: Mapping[str, Any], noun: str = "function", also: Sequence[str] = ()) -> str:
    """The start of the problem for a name the notebook does not define: what is missing and the fix."""
    close = close_name(name, namespace, also)
    hint = f"did you mean '{close}'? Otherwise define" if close else "define"
    return f"no {noun} named {name!r} in the notebook; {hint} it in a cell run before this one"


def by_value(obj: Any) -> list[Any]:
    """Modules of ``obj`` (a function, a class or an instance) that the worker cannot import (a .py file
    next to the notebook): cloudpickle pickles objects of importable modules by reference, which would fail
    in the worker's directory."""
    import cloudpickle

    mod = sys.modules.get(getattr(obj, "__module__", "") or "")
    path = getattr(mod, "__file__", None)
    if mod is None or mod.__name__ == "__main__" or not path:
        return []
    if mod.__name__ in cloudpickle.list_registry_pickle_by_value():
        return []  # the user registered it already; leave their registration alone
    try:
        Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return []
    return [mod]


def pickle_problem(obj: Any, what: str) -> str | None:
    """Why ``obj`` cannot be serialised for the training process (``what`` names it), or None."""
    import cloudpickle

    modules = by_value(obj)
    try:
        for m in modules:
            cloudpickle.register_pickle_by_value(m)
        cloudpickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - any pickling failure gets the same advice
        return (
            f"{what} cannot be serialised for the training process ({type(e).__name__}: {e}); make it "
            f"self-contained: import inside it, and do not capture open files, locks, generators or live "
            f"connections"
        )
    finally:
        for m in modules:
            cloudpickle.unregister_pickle_by_value(m)
    return None


def dumps(payload: Any, objects: Sequence[Any]) -> bytes:
    """``payload`` cloudpickled, the local modules of ``objects`` (each checked by ``pickle_problem``)
    pickled by value. Several objects may come from one module: it is registered once (unregistering twice
    fails)."""
    import cloudpickle

    modules = list({m.__name__: m for obj in objects for m in by_value(obj)}.values())
    try:
        for m in modules:
            cloudpickle.register_pickle_by_value(m)
        data: bytes = cloudpickle.dumps(payload)
    finally:
        for m in modules:
            cloudpickle.unregister_pickle_by_value(m)
    return data


def load(path: str | Path) -> Any:
    """What ``dumps`` wrote to ``path``. The file is loaded only when it is yours and nobody else can write
    it (nbtrain.contract.pickles); else ``UntrustedPickle`` says why."""
    import cloudpickle

    return cloudpickle.loads(read_trusted(path))


__all__ = ["by_value", "close_name", "dumps", "load", "missing", "notebook_namespace", "pickle_problem"]
