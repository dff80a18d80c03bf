"""TRL's defaults are read from the one snapshot (``trainargs.default`` in the kernel, ``introspect.default``
in the worker), never re-typed in a consumer: ``args.get("learning_rate", 2e-5)`` was SFT's rate shown and
given to DeepSpeed for a DPO run, whose TRL default is 1e-6."""

from __future__ import annotations

import ast
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from nbtrain.contract.objectives import OBJECTIVES
from nbtrain.control.config import trainargs

ROOT = Path(__file__).resolve().parents[3]


def _snapshot(objective: str) -> dict[str, Any]:
    return json.loads((ROOT / "nbtrain" / "assets" / f"{objective}_fields.json").read_text("utf-8"))


# Every objective's TRL field names and defaults, as the shipped snapshots have them.
DEFAULTS: dict[str, dict[str, Any]] = {
    o: {k: v["default"] for k, v in _snapshot(o)["fields"].items()} for o in OBJECTIVES
}
FIELDS = set().union(*DEFAULTS.values())

# A TRL field name with a literal fallback that is not TRL's default re-typed: why each may stay.
NOT_TRL_DEFAULTS = {
    (
        "nbtrain/control/plan/estimates.py",
        "gradient_checkpointing",
    ): "'auto': nbtrain's own value, the plan decides",
    (
        "nbtrain/control/plan/planner.py",
        "gradient_checkpointing",
    ): "'auto': nbtrain's own value, the plan decides",
    ("nbtrain/worker/tuned.py", "trust_remote_code"): "the config's top-level key, not train:",
}


def _literal(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and node.value is not None


def retyped() -> list[tuple[str, int, str, Any]]:
    """(file, line, field, literal) of every ``X.get(FIELD, LITERAL)`` / ``setdefault`` / ``pop`` /
    ``getattr(X, FIELD, LITERAL)`` in nbtrain/ and bench/ where FIELD is a TRL config field."""
    hits = []
    for base in ("nbtrain", "bench"):
        for path in sorted((ROOT / base).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if (
                    isinstance(f, ast.Attribute)
                    and f.attr in ("get", "setdefault", "pop")
                    and len(node.args) == 2
                ):
                    key, fallback = node.args
                elif isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) == 3:
                    key, fallback = node.args[1:]
                else:
                    continue
                if isinstance(key, ast.Constant) and key.value in FIELDS and _literal(fallback):
                    rel = path.relative_to(ROOT).as_posix()
                    hits.append((rel, node.lineno, str(key.value), ast.literal_eval(fallback)))
    return hits


def test_no_consumer_retypes_a_trl_default() -> None:
    found = [h for h in retyped() if (h[0], h[2]) not in NOT_TRL_DEFAULTS]
    assert not found, (
        "TRL defaults re-typed (read them with trainargs.value(args, FIELD, objective), or "
        f"introspect.value in the worker): {found}"
    )


def test_default_is_the_snapshots_and_differs_by_objective() -> None:
    for objective, defaults in DEFAULTS.items():
        for field in ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "max_steps"):
            assert trainargs.default(objective, field) == defaults[field]
    assert trainargs.default("sft", "learning_rate") == 2e-5
    assert trainargs.default("dpo", "learning_rate") == 1e-6


def test_value_prefers_the_args() -> None:
    assert trainargs.value({"learning_rate": 3e-4}, "learning_rate", "dpo") == 3e-4
    assert trainargs.value({}, "learning_rate", "dpo") == 1e-6
    assert trainargs.value({"seed": None}, "seed") is None  # as dict.get: a value set to null stays null


def test_worker_reads_the_same_defaults_as_the_kernel() -> None:
    from nbtrain.worker import introspect

    installed = {p: metadata.version(p) for p in ("trl", "transformers")}
    if _snapshot("dpo")["versions"] != installed:
        pytest.skip(f"installed {installed} differ from the snapshot's versions")
    for field in ("learning_rate", "seed", "beta", "per_device_train_batch_size"):
        assert introspect.default("dpo", field) == trainargs.default("dpo", field)
