"""Sweeps as people see them: the sweep's figure (every trial's curve, the parameters against the metric,
the trials ranked), the CLI's table and verbs, and a %%finetune cell whose YAML has a sweep: section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nbtrain.control.sweep.sweep import Sweep as CoreSweep
from nbtrain.control.sweep.sweep import SweepStatus
from nbtrain.ui.sweeps import Sweep
from tests.conftest import sweep_yaml
from tests.ui.test_panel import shell  # noqa: F401 - the IPython shell fixture

pytestmark = pytest.mark.slow  # real sweeps: training processes


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbtrain.ui.cli", *args], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_the_sweeps_figure_draws_each_trial_the_parameters_and_the_ranking(
    pruned_sweep: tuple[CoreSweep, SweepStatus],
) -> None:
    core, st = pruned_sweep
    fig = Sweep(core.paths.root).plot()
    types = [t.type for t in fig.data]
    assert types == ["scatter", "scatter", "parcoords", "table"], types
    best, pruned = fig.data[0], fig.data[1]
    assert best.name.startswith("★ t0 learning_rate=0.003") and best.line.width > pruned.line.width
    assert pruned.line.dash == "dot" and list(pruned.meta) == [1, "pruned"]
    # the curves are the trials' own logged eval_loss
    assert list(best.y) == [st.trials[0]["evaluations"][str(int(x))] for x in best.x]
    # parameters against the metric: the finished trial's line, its learning rate on a log axis when it spans
    par = fig.data[2]
    assert [d.label for d in par.dimensions] == ["learning_rate", "eval_loss"]
    assert list(par.dimensions[1].values) == [st.trials[0]["value"]]
    # the table ranks the finished trial first, marked best; the pruned one says why
    cells = fig.data[3].cells.values
    assert list(cells[0]) == ["★", ""] and list(cells[2]) == ["completed", "pruned"]
    assert cells[-1][1].startswith("pruned at step")
    title = fig.layout.title.text
    assert "sweep lr" in title and "completed" in title and "best: trial 0, eval_loss" in title
    assert "1 at once as asked" in title


def test_the_cli_lists_ranks_and_acts_on_a_sweep(pruned_sweep: tuple[CoreSweep, SweepStatus]) -> None:
    core, st = pruned_sweep
    folder = str(core.paths.root)
    p = cli("sweep", "status", folder)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"sweep {core.id}: {st.describe()}"
    assert lines[2].startswith("* t0   completed learning_rate=0.003  eval_loss=")
    assert "pruned at step" in lines[3]
    best = cli("sweep", "best", folder)
    assert best.returncode == 0 and "learning_rate: 0.003" in best.stdout and "name: lr-best" in best.stdout
    no_n = cli("sweep", "extend", folder)
    assert no_n.returncode == 2 and "say how many more trials" in no_n.stderr
    bad = cli("sweep", "clone", folder, "--trial", "7")
    assert bad.returncode == 1 and "has no trial 7 to clone" in bad.stderr
    assert "no sweep 'nope'" in cli("sweep", "status", "nope").stderr


def test_a_finetune_cell_with_a_sweep_starts_it_and_best_inserts_the_winning_cell(
    workdir: Path,
    shell: Any,  # noqa: F811
) -> None:
    shell.run_cell("%load_ext nbtrain")
    r = shell.run_cell("%%finetune --wait\n" + sweep_yaml("[3.0e-3, 1.0e-3]", 6))
    assert r.error_in_exec is None, r.error_in_exec
    from nbtrain.ui.sweeps import get_sweep

    s = get_sweep("lr")
    st = s.status()
    assert st.state == "completed" and [t["state"] for t in st.trials] == ["completed", "completed"]
    r = shell.run_cell("%finetune sweep best")
    assert r.error_in_exec is None
    assert shell.rl_next_input.startswith(f"%%finetune\n# the best trial ({st.best}) of sweep {s.id}")
    # a run (not a sweep) refuses a config with a sweep: section rather than train its base alone
    import nbtrain

    with pytest.raises(nbtrain.NbtrainError, match=r"has a sweep: section.*nbtrain.sweep\(config\)"):
        nbtrain.finetune(sweep_yaml("[3.0e-3]", 6))


def test_the_views_routes_list_its_trials_and_refuse_a_clone_they_cannot_read(
    pruned_sweep: tuple[CoreSweep, SweepStatus], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.contract.errors import NbtrainError
    from nbtrain.ui.server.sweeps import set_pairs, sweep_act, sweep_figure

    core, st = pruned_sweep
    monkeypatch.setenv("NBTRAIN_RUNS_DIR", str(core.paths.root.parent.parent))  # the server's runs root
    reply = sweep_figure(core.id)
    assert [(t["number"], t["state"]) for t in reply["trials"]] == [(0, "completed"), (1, "pruned")]
    assert reply["trials"][0]["label"] == "0 · learning_rate=0.003 · completed"
    assert reply["trials"][1]["run_id"] == st.trials[1]["run_id"]
    assert set_pairs("train.learning_rate=2.0e-4; lora.r=16\ndata.eval_split=0.2") == {
        "train.learning_rate": 2.0e-4, "lora.r": 16, "data.eval_split": 0.2,
    }  # fmt: skip
    for body, why in [
        ({"set": "lora.r=16"}, "which trial"),
        ({"trial": True, "set": ""}, "which trial"),
        ({"trial": 0, "set": "lora.r"}, "give KEY=VALUE"),
        ({"trial": 0, "set": "x" * 10_001}, "which trial"),
        ({"trial": 7, "set": ""}, "no trial 7"),
        ({"trial": 0, "set": "train.learning_rate=-1"}, "learning_rate"),
    ]:
        with pytest.raises(NbtrainError, match=why):
            sweep_act(core.id, "clone", body)
    with pytest.raises(NbtrainError, match="not 'delete'"):
        sweep_act(core.id, "delete", {})
    assert core.status().budget == st.budget  # nothing was asked of the sweep
