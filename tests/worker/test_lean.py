"""A training process does not import the packages its run never uses (peft pulls bitsandbytes in at
import, transformers scipy), and says how to get them back when something does need one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nbtrain.worker.lean import hidden_import_hint, needs_bitsandbytes, unused_packages


def resolved(method: str, optim: str | None = None, *, remote: bool = False) -> dict[str, Any]:
    args = {} if optim is None else {"optim": optim}
    quant = {"bits": 4} if method == "qlora" else None
    cfg = {"method": method, "quantization": quant, "trust_remote_code": remote}
    return {"config": cfg, "train_args": args}


@pytest.mark.parametrize("method", ["lora", "full"])
@pytest.mark.parametrize("optim", [None, "adamw_torch", "adamw_torch_fused", "sgd", "adafactor"])
def test_runs_without_quantisation_or_bnb_optimizer_do_not_need_bitsandbytes(method: str, optim: str) -> None:
    assert not needs_bitsandbytes(resolved(method, optim))
    assert unused_packages(resolved(method, optim)) == ["bitsandbytes", "scipy"]


@pytest.mark.parametrize("optim", ["paged_adamw_8bit", "adamw_bnb_8bit", "lion_32bit", "some_new_optimizer"])
def test_bitsandbytes_or_unknown_optimizers_keep_bitsandbytes_importable(optim: str) -> None:
    assert needs_bitsandbytes(resolved("lora", optim))
    assert "bitsandbytes" not in unused_packages(resolved("lora", optim))


def test_qlora_needs_bitsandbytes() -> None:
    assert needs_bitsandbytes(resolved("qlora"))
    assert unused_packages(resolved("qlora")) == ["scipy"]


def test_remote_model_code_keeps_scipy() -> None:
    assert unused_packages(resolved("lora", remote=True)) == ["bitsandbytes"]


def test_the_hint_names_a_hidden_package_and_the_switch_only_for_that_import() -> None:
    hint = hidden_import_hint(ModuleNotFoundError("import of scipy halted", name="scipy"), ["scipy"])
    assert hint is not None and "scipy" in hint and "NBTRAIN_LEAN_IMPORTS=0" in hint
    assert hidden_import_hint(ModuleNotFoundError("no", name="scipy"), ["bitsandbytes"]) is None
    assert hidden_import_hint(ModuleNotFoundError("no", name="foo"), ["scipy"]) is None
    assert hidden_import_hint(ValueError("scipy"), ["scipy"]) is None


PROBE = """
import json, sys
from nbtrain.worker.lean import hide_unused_packages
hidden = hide_unused_packages(json.loads(sys.argv[1]))
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
from transformers.utils import is_bitsandbytes_available, is_scipy_available
base = AutoModelForCausalLM.from_pretrained(sys.argv[2])
model = get_peft_model(base, LoraConfig(r=4, task_type="CAUSAL_LM"))
loaded = [m for m in ("bitsandbytes", "scipy") if sys.modules.get(m) is not None]
print(json.dumps({"hidden": hidden, "loaded": loaded, "bnb": is_bitsandbytes_available(),
                  "scipy": is_scipy_available(), "trainable": model.get_nb_trainable_parameters()[0]}))
"""


def probe(res: dict[str, Any], model: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(res), str(model)], capture_output=True,
                         text=True, timeout=300, check=True, env={**os.environ, **(env or {})})  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_lora_process_builds_its_adapter_without_bitsandbytes_or_scipy(tiny_model: Path) -> None:
    got = probe(resolved("lora"), tiny_model)
    assert got["hidden"] == ["bitsandbytes", "scipy"] and got["loaded"] == []
    assert got["bnb"] is False and got["scipy"] is False
    assert got["trainable"] > 0


def test_lean_imports_switched_off_loads_what_is_installed(tiny_model: Path) -> None:
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("scipy")
    got = probe(resolved("lora"), tiny_model, {"NBTRAIN_LEAN_IMPORTS": "0"})
    assert got["hidden"] == [] and got["bnb"] is True and got["scipy"] is True


def test_a_qlora_process_keeps_bitsandbytes(tiny_model: Path) -> None:
    pytest.importorskip("bitsandbytes")
    got = probe(resolved("qlora"), tiny_model)
    assert got["hidden"] == ["scipy"] and got["bnb"] is True


def test_a_run_that_imports_a_hidden_package_fails_with_the_fix(tmp_path: Path) -> None:
    """The real worker entry point, with a recipe that imports scipy (as remote model code might):
    status.json says the run failed, names scipy and the switch that keeps it."""
    from nbtrain.contract.rundir import RunPaths, atomic_write_json, read_json

    paths = RunPaths(tmp_path / "run")
    paths.make()
    atomic_write_json(paths.resolved, resolved("lora"))
    script = (
        "import sys\n"
        "from nbtrain.worker import __main__ as worker\n"
        "def recipe_for(resolved):\n"
        "    import scipy.optimize\n"
        "worker.recipe_for = recipe_for\n"
        f"sys.exit(worker.main([{str(paths.root)!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    status = read_json(paths.status)
    assert status["state"] == "failed" and status["error"]["type"] == "ModuleNotFoundError"
    assert "did not load scipy" in status["error"]["message"]
    assert "NBTRAIN_LEAN_IMPORTS=0" in status["error"]["message"]


def test_a_directory_that_is_not_a_run_hides_nothing(tmp_path: Path) -> None:
    from nbtrain.worker.lean import hide_for_run

    assert hide_for_run(tmp_path) == []
    assert sys.modules.get("scipy", "absent") is not None  # this process was left as it was
