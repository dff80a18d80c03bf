"""%%finetune and %finetune verbs in a real kernel (nbclient): the user's own path through nbtrain."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from nbclient.exceptions import CellExecutionError, DeadKernelError

import nbtrain
from nbtrain.control.launch import process
from tests.conftest import lora_yaml
from tests.notebook import error_of, execute, text_of

_HEAVY_MODULES = "('torch', 'bitsandbytes', 'transformers', 'trl')"
HEAVY = f"import sys; print(sorted(m for m in {_HEAVY_MODULES} if m in sys.modules))"


def test_load_ext_imports_no_torch_or_bitsandbytes(workdir: Path) -> None:
    # Nor the charts' library, the config schema's (pydantic, YAML) or the metrics reader's (numpy): they
    # load with the first chart or verb, which keeps the extension's load under 0.3 s (19 ms measured).
    later = "('plotly', 'pydantic', 'yaml', 'numpy', 'ray', 'gguf', 'llama_cpp')"  # ray: for a Ray run only
    nb = execute(
        ["%load_ext nbtrain", HEAVY, f"import sys; print(sorted(m for m in {later} if m in sys.modules))"],
        workdir,
    )
    assert text_of(nb.cells[1]).strip() == "[]"
    assert text_of(nb.cells[2]).strip() == "[]"


def test_bad_input_fails_the_cell_with_one_usage_error_and_starts_nothing(workdir: Path) -> None:
    bad_key = "%%finetune\n" + lora_yaml().replace("learning_rate", "lerning_rate")
    bad_type = "%%finetune\n" + lora_yaml().replace("max_steps: 30", "max_steps: lots")
    cells = [
        "%load_ext nbtrain",
        bad_key,
        bad_type,
        "%finetune bogus",
        "%finetune status no-such-run",
        "%%finetune --dry-run --name dry\n" + lora_yaml(),
        "%finetune list",
        HEAVY,
        "%finetune stauts dry",
        "%finetune status --help",
        "%finetune run c.yaml --dry-run --name fromfile",
        "%finetune help lora.r",
        "%finetune help lora.rank",
    ]
    (workdir / "c.yaml").write_text(lora_yaml())
    nb = execute(cells, workdir, allow_errors=True)
    err = error_of(nb.cells[1])
    assert err is not None and err[0] == "UsageError"
    assert "did you mean 'learning_rate'" in err[1] and "Nothing was started" in err[1]
    err = error_of(nb.cells[2])
    assert err is not None and err[0] == "UsageError" and "train.max_steps" in err[1]
    err = error_of(nb.cells[3])
    assert err is not None and "unknown verb 'bogus'" in err[1] and "attach" in err[1]
    err = error_of(nb.cells[4])
    assert err is not None and "no run matches 'no-such-run'" in err[1]
    dry = text_of(nb.cells[5])
    assert "nbtrain dry run: dry (nothing started)" in dry and "1 process(es) per node on CPU" in dry
    assert error_of(nb.cells[6]) is None
    assert text_of(nb.cells[7]).strip() == "[]"
    err = error_of(nb.cells[8])
    assert err is not None and "unknown verb 'stauts'. Did you mean 'status'?" in err[1]
    help_ = text_of(nb.cells[9])
    assert error_of(nb.cells[9]) is None
    assert help_.startswith("usage: %finetune status") and "A run's state" in help_
    assert "nbtrain dry run: fromfile (nothing started)" in text_of(nb.cells[10])
    assert text_of(nb.cells[11]).startswith("lora.r: The rank of the adapter matrices")  # the field's words
    err = error_of(nb.cells[12])
    assert err is not None and "'lora.rank' is not an nbtrain config key; did you mean lora.r" in err[1]
    assert nbtrain.runs() == []
    assert not (workdir / "runs").exists()


def test_a_bad_cell_stops_run_all(workdir: Path) -> None:
    """The UsageError marks the cell as failed, so Run All / papermill stop instead of carrying on."""
    with pytest.raises(CellExecutionError, match="unknown key 'foo'"):
        execute(["%load_ext nbtrain", "%%finetune\n" + lora_yaml() + "foo: 1\n", "print('after')"], workdir)


def test_problems_in_a_cell_give_the_cells_own_line_numbers(workdir: Path) -> None:
    """The %%finetune line is line 1 of the cell: a problem on the cell's 6th line says line 6, for a YAML
    syntax error (with its column), a bad value and a duplicate key alike."""
    indent = "%%finetune --dry-run\n" + lora_yaml().replace("  format: auto", "    format: auto")
    value = "%%finetune --dry-run --name x\n" + lora_yaml(extra="  lr_scheduler_type: cosin\n")
    twice = "%%finetune --dry-run\n" + lora_yaml() + "method: qlora\n"
    (workdir / "c.yaml").write_text(lora_yaml())
    cells = ["%load_ext nbtrain", indent, value, twice, "%%finetune --dry-run --name fromfile\nc.yaml"]
    nb = execute(cells, workdir, allow_errors=True)

    def line_of(cell: str, text: str) -> int:
        return cell.splitlines().index(text) + 1  # 1-based, counting the %%finetune line

    err = error_of(nb.cells[1])
    assert err is not None and line_of(indent, "    format: auto") == 6
    assert "(line 6, column 5: 'format: auto'): YAML syntax error: this line is indented more" in err[1]
    err = error_of(nb.cells[2])
    assert err is not None and line_of(value, "  lr_scheduler_type: cosin") == 12
    assert "train.lr_scheduler_type (line 12: " in err[1] and "did you mean cosine?" in err[1]
    err = error_of(nb.cells[3])
    assert err is not None and (line_of(twice, "method: lora"), line_of(twice, "method: qlora")) == (3, 12)
    assert "method (line 12, column 1: " in err[1] and "on line 3 and again on line 12" in err[1]
    assert "nbtrain dry run: fromfile (nothing started)" in text_of(nb.cells[4])  # a file's name: read


@pytest.mark.slow
def test_finetune_cells_train_lora_and_qlora_in_a_real_kernel(workdir: Path) -> None:
    cells = [
        "%load_ext nbtrain",
        "%%finetune --name nb-lora\n" + lora_yaml(40),
        "%%finetune --name nb-qlora\n" + lora_yaml(40, method="qlora"),
        "%finetune wait nb-lora",
        "%finetune wait nb-qlora",
        "%finetune status nb-qlora",
        "%finetune logs nb-lora -n 5",
        HEAVY,
    ]
    nb = execute(cells, workdir)
    assert "Run" in text_of(nb.cells[1])  # the cell returns the run handle at once
    assert "completed" in text_of(nb.cells[5])
    assert "nbtrain worker: completed" in text_of(nb.cells[6])
    # The live views and waits ran in the kernel without pulling in the training stack.
    assert text_of(nb.cells[7]).strip() == "[]"

    from peft import AutoPeftModelForCausalLM

    for name in ("nb-lora", "nb-qlora"):
        run = nbtrain.get_run(name)
        assert run.status().state == "completed"
        losses = run.metrics()["loss"].dropna().tolist()
        assert sum(losses[-3:]) < sum(losses[:3]), (name, losses)
        model = AutoPeftModelForCausalLM.from_pretrained(run.output_dir)
        gen = model.generate(
            input_ids=__import__("torch").tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False
        )
        assert gen.shape[1] == 6
    assert "base weights loaded in 4-bit" in nbtrain.get_run("nb-qlora").logs(400)


@pytest.mark.slow
def test_run_survives_its_kernel_and_a_new_kernel_attaches(workdir: Path) -> None:
    steps = 2000  # ~6 ms a step: longer than the kernel takes to die and be seen dead
    first = [
        "%load_ext nbtrain",
        "%%finetune --name survivor\n" + lora_yaml(steps),
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    ]
    with pytest.raises(DeadKernelError):
        execute(first, workdir)
    run = nbtrain.get_run("survivor")
    assert not run.status().done, "the kernel should die while the run is still going"
    second = [
        "%load_ext nbtrain",
        "%finetune attach survivor",
        "%finetune wait survivor",
        "import nbtrain; r = nbtrain.get_run('survivor'); print(r.status().state, r.metrics()['step'].max())",
    ]
    nb = execute(second, workdir)
    assert "survivor" in text_of(nb.cells[1])
    assert text_of(nb.cells[3]).split() == ["completed", str(steps)]
    m = run.metrics()
    assert sorted(m["step"].dropna().astype(int).unique().tolist()) == list(range(1, steps + 1))


@pytest.mark.slow
def test_stop_verb_ends_the_process_group(workdir: Path) -> None:
    cells = [
        "%load_ext nbtrain",
        "%%finetune --name tostop --no-view\n" + lora_yaml(100_000),
        "import time, nbtrain\nr = nbtrain.get_run('tostop')\n"
        "deadline = time.time() + 120\nwhile r.status().step < 2 and time.time() < deadline: time.sleep(0.2)",
        "%finetune stop tostop",
    ]
    nb = execute(cells, workdir)
    assert "stopped" in text_of(nb.cells[3])
    run = nbtrain.get_run("tostop")
    assert run.status().state == "stopped"
    info = process.read_launch(run.paths)
    assert info is not None
    time.sleep(0.5)
    assert process.group_members(int(info["pgid"])) == []


@pytest.mark.slow
def test_dry_run_draws_the_estimate_and_probe_measures_real_steps(workdir: Path) -> None:
    (workdir / "c.yaml").write_text(lora_yaml(5))
    cells = [
        "%load_ext nbtrain",
        "%%finetune --dry-run --name est\n" + lora_yaml(),
        "%finetune estimate c.yaml",
        "%%finetune --probe --name pr\n" + lora_yaml(50),
    ]
    nb = execute(cells, workdir)
    mimes = [set(o.get("data", {})) for o in nb.cells[1].outputs]
    assert any("application/vnd.plotly.v1+json" in m for m in mimes)  # the stacked memory bar
    dry = text_of(nb.cells[1])
    assert "memory:    ~" in dry and "GiB of RAM" in dry
    assert "method x strategy on this machine" in text_of(nb.cells[2])
    probe = text_of(nb.cells[3])
    assert "probe run" in probe and "5 steps at" in probe and "measured peak (worker RSS)" in probe
    assert "projected time for 50 steps" in probe
    assert nbtrain.get_run("pr-probe").status().state == "completed"


def test_eval_export_and_tensorboard_verbs_refuse_bad_input_in_the_kernel(
    tuned_run: Path, workdir: Path
) -> None:
    import shutil

    run = workdir / "elsewhere" / "copied-run"  # in a runs root of its own: ./taken is outside it
    shutil.copytree(tuned_run, run, ignore=shutil.ignore_patterns("checkpoints"))
    (workdir / "taken").mkdir()
    (workdir / "taken" / "f.txt").write_text("mine")
    cells = [
        "%load_ext nbtrain",
        f"%finetune export {run} --to taken --dtype bf16",
        f"%finetune eval {run} --tasks nowhere/task.yaml",
        f"%finetune tensorboard {run}",
        "%finetune export",
        HEAVY,
        f"%finetune export {run}",  # no --to in a notebook: the export form
    ]
    nb = execute(cells, workdir, allow_errors=True)
    err = error_of(nb.cells[1])
    assert err is not None and err[0] == "UsageError" and "is not empty" in err[1] and "--overwrite" in err[1]
    err = error_of(nb.cells[2])
    assert err is not None and "task file or directory not found" in err[1]
    err = error_of(nb.cells[3])
    assert err is not None and "report_to: [tensorboard]" in err[1]
    err = error_of(nb.cells[4])
    assert err is not None and "%finetune export needs run (run id, unique id prefix, name" in err[1], err
    assert text_of(nb.cells[5]).strip() == "[]"
    view = "application/vnd.jupyter.widget-view+json"
    widget = [o for o in nb.cells[6].outputs if view in o.get("data", {})]
    assert len(widget) == 1 and error_of(nb.cells[6]) is None
    assert [p.name for p in (workdir / "taken").iterdir()] == ["f.txt"]


def test_a_verb_without_its_argument_says_what_the_argument_is_not_argparses_words() -> None:
    from IPython.core.error import UsageError

    from nbtrain.ui.magics import verb_parser
    from nbtrain.ui.verbs import VERBS

    with pytest.raises(UsageError) as ei:
        verb_parser(VERBS["preview"]).parse_args([])
    assert str(ei.value).startswith("%finetune preview needs config (a .yaml config file, or a run")
    assert "usage: %finetune preview" in str(ei.value) and "arguments are required" not in str(ei.value)
    with pytest.raises(UsageError) as ei:
        verb_parser(VERBS["estimate"]).parse_args([])
    assert "(a .yaml config file (or use %%finetune --estimate with a YAML cell))" in str(ei.value)
