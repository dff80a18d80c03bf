"""The config's rules are functions of the config and its facts: every look at the world (files, folders,
packages, subprocess probes) goes through ``config/facts.py``, read once per load."""

from __future__ import annotations

import ast
from pathlib import Path

from nbtrain.control.config import facts as facts_module
from nbtrain.control.config.facts import Facts
from nbtrain.control.config.problems import Problems
from nbtrain.control.config.rules.model import check_model

RULES = Path(facts_module.__file__).parent / "rules"
WORLD_MODULES = {"os", "subprocess", "tempfile", "importlib", "shutil", "socket", "struct", "glob", "io"}
WORLD_CALLS = {
    "open", "read_text", "read_bytes", "write_text", "exists", "is_file", "is_dir", "iterdir", "glob",
    "rglob", "stat", "resolve", "mkdir", "unlink", "run", "Popen", "find_spec", "version",
}  # fmt: skip


def test_no_rule_touches_the_world_itself() -> None:
    found = []
    for path in sorted(RULES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                )
                found += [f"{path.name}: import {n}" for n in names if n.split(".")[0] in WORLD_MODULES]
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
                if name in WORLD_CALLS and owner != "facts":
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(f)}()")
    assert found == []


class Counting(Facts):
    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.stats = 0

    def kind(self, path: Path):  # type: ignore[no-untyped-def]
        before = len(self._kinds)
        out = super().kind(path)
        self.stats += len(self._kinds) - before
        return out


def test_a_rule_runs_alone_on_its_facts_and_each_path_is_looked_at_once(tmp_path: Path) -> None:
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    facts, probs = Counting(tmp_path), Problems("")
    assert check_model("./models/tiny", facts, probs) == "local"
    assert [p.message for p in probs.items] == [
        f"{tmp_path / 'models' / 'tiny'} is not a model directory (no config.json); point model: at a "
        "directory saved with save_pretrained() or a .gguf file, or give a hub id"
    ]
    assert check_model("./models/tiny", facts, Problems("")) == "local"
    assert facts.stats == 1  # the folder was looked at once for both
    probs = Problems("")
    check_model("./models/tinny", facts, probs)
    assert "did you mean" in probs.items[0].message and "models/tiny'" in probs.items[0].message
