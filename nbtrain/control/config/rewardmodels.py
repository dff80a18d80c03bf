"""The reward models of ``rewards:`` (objective: grpo / rloo), checked before anything starts.

    rewards: [{model: rm-20261202-1530-ab12}, format_reward]    # an objective: reward run, by id or name
    rewards: [{model: ./nbtrain_runs/rm-.../}]                  # its directory
    rewards: [{model: ./my-reward-model}]                       # a folder saved with save_pretrained()
    rewards: [{model: OpenAssistant/reward-model-deberta-v3-large-v2}]   # a Hub id

``resolve`` turns each reference into what the worker loads (``nbtrain.contract.rewards.RewardModel``):
the absolute directory of a run or folder, or the Hub id. A run must be an ``objective: reward`` run
with trained weights (``output/`` or a complete checkpoint); a folder must hold a model that is not
merely a language model (its score head would be untrained); a Hub id must exist. Each refusal says
why and what to give instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from nbtrain.contract.rundir import read_json


class RunLookup(Protocol):
    """What checking a reward model needs to know of the runs: given by prepare (nbtrain.control.prepare
    .RegisteredRuns), so the config package looks no run up itself and sits below the runs."""

    def run_dir(self, ref: str) -> Path | None:
        """The directory of the run ``ref`` names (id, id prefix or name), or None."""
        ...

    def weights_problem(self, run_dir: Path, name: str) -> str | None:
        """Why the run in ``run_dir`` (called ``name``) has no trained weights to load yet, or None."""
        ...


FIX = (
    "give an objective: reward run (its id, name or directory; %finetune list shows the runs), a folder "
    "with a reward model saved with save_pretrained(), or a Hub id (org/name)"
)
# Heads that generate text, not scores: loaded as a sequence classifier their score head is random.
_GENERATIVE = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "ForImageTextToText")


def resolve(ref: str, base: Path, runs: RunLookup | None) -> tuple[str | None, str | None]:
    """(source, None) for a usable reward model ``ref``, else (None, the problem and its fix). ``base`` is
    the folder relative paths start from (the notebook's, as for data files); ``runs`` finds a run by its
    id or name (None: only directories, folders and Hub ids are looked at)."""
    from nbtrain.control.models import hub

    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = (base / path).resolve()
    if path.is_dir():
        if (path / "resolved.json").is_file():
            return _run(path, runs)
        return _folder(path)
    looks_like_path = ref.startswith((".", "/", "~")) or "\\" in ref or ref.count("/") > 1
    if looks_like_path:
        return None, f"reward model not found: {path} is no folder; {FIX}"
    run_dir = runs.run_dir(ref) if runs is not None else None
    if run_dir is not None:
        return _run(run_dir, runs)
    if hub.is_hub_id(ref):
        try:
            config, _note = hub.model_config(ref)  # None when the Hub cannot be asked: the worker will tell
        except hub.HubProblem as e:
            return None, f"reward model {ref}: {e}"
        problem = _generative(config or {}, ref)
        return (None, problem) if problem else (ref, None)
    return None, f"no run, run directory or model folder is called {ref!r} (nor is it a Hub id); {FIX}"


def _run(run_dir: Path, runs: RunLookup | None) -> tuple[str | None, str | None]:
    """An nbtrain run as a reward model: objective: reward, with trained weights."""
    try:
        resolved: dict[str, Any] = read_json(run_dir / "resolved.json")
    except (OSError, ValueError) as e:
        return None, f"run {run_dir.name} cannot be read ({e}); {FIX}"
    cfg = resolved.get("config") or {}
    name = resolved.get("name") or run_dir.name
    objective = cfg.get("objective", "sft")
    if objective != "reward":
        return None, (
            f"run {name} was trained with objective: {objective}, so it generates text rather than scoring "
            f"it; a reward model is a run of objective: reward on chosen/rejected pairs: train one, then "
            f"name it here"
        )
    problem = runs.weights_problem(run_dir, name) if runs is not None else None
    if problem is not None:
        return None, problem
    base = str(cfg.get("model") or "")
    adapter = cfg.get("method") in ("lora", "qlora")
    if adapter and base.startswith("/") and not (Path(base) / "config.json").is_file():
        return None, (
            f"run {name} is a LoRA adapter on {base}, which is no longer a model folder (no "
            f"config.json); put the base model back there, or train the reward model again"
        )
    return str(run_dir), None


def _folder(path: Path) -> tuple[str | None, str | None]:
    """A model folder as a reward model: a config.json whose model is not only a text generator."""
    config = path / "config.json"
    if not config.is_file():
        if (path / "adapter_config.json").is_file():
            return None, (
                f"{path} holds a LoRA adapter without its base model: name the nbtrain run it came from, or "
                f"merge it into a whole model first (nbtrain.export(run, to=DIR))"
            )
        return (
            None,
            f"{path} is neither an nbtrain run (no resolved.json) nor a model folder (no config.json)",
        )
    try:
        problem = _generative(json.loads(config.read_text(encoding="utf-8")), str(path))
    except (OSError, ValueError) as e:
        return None, f"{config} cannot be read ({e})"
    return (None, problem) if problem else (str(path), None)


def _generative(config: dict[str, Any], where: str) -> str | None:
    """Why a model whose config.json is ``config`` is no reward model (it only generates text), or None."""
    archs = config.get("architectures") or [] if isinstance(config, dict) else []
    if archs and all(str(a).endswith(_GENERATIVE) for a in archs):
        return (
            f"{where} holds a language model ({', '.join(map(str, archs))}), not a reward model: loaded as a "
            f"scorer its score head would be untrained. Train one with objective: reward on chosen/rejected "
            f"pairs and name that run"
        )
    return None
