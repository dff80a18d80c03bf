"""A course preset's SLURM limits cannot be escaped (issue 57, N2): ``slurm: extra:`` is read as sbatch reads
it, in every spelling sbatch takes, and may not set another partition, account, QOS or cluster, a longer
time, more GPUs or nodes than the preset allows; max_time holds over a run's requeued jobs; and the paths of
the sbatch script survive a runs root with a space, ``#`` or ``%`` in it. Fast: nothing here trains."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.preset import PRESET_FILE
from nbtrain.control.launch import sbatch
from nbtrain.control.plan.distributed import slurm_script
from tests.conftest import lora_yaml
from tests.slurmcluster import fake_scontrol

COURSE = (
    "course: Fine-tuning 101\n"
    "slurm: {partition: class, account: fin101, qos: students, time: '00:30:00'}\n"
    "max_gpus: 1\nmax_time: '01:00:00'\n"
)


def on_slurm(slurm: str) -> str:
    return lora_yaml(5) + f"distributed:\n  slurm: {slurm}\n"


def with_extra(extra: list[str]) -> str:
    return on_slurm("{extra: " + json.dumps(extra) + "}")


def refused(config: str) -> str:
    with pytest.raises(ConfigError) as e:
        nbtrain.prepare(config)
    return str(e.value)


@pytest.fixture(autouse=True)
def cluster_nodes(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The course partition's nodes, as scontrol shows them (one GPU each): a run is planned for them."""
    monkeypatch.setenv("PATH", f"{fake_scontrol(workdir / 'bin', 'gpu:h100:1')}:{os.environ['PATH']}")


@pytest.fixture
def course(workdir: Path) -> Path:
    (workdir / PRESET_FILE).write_text(COURSE, encoding="utf-8")
    return workdir / PRESET_FILE


ESCAPES = [
    # another partition: long, separated in one item, short attached / separated, "=", abbreviated,
    # several options on one line, clustered short flags, after a quoted value holding '#'
    (["--partition=big"], "rule 'slurm'"),
    (["--partition big"], "rule 'slurm'"),
    (["-pbig"], "rule 'slurm'"),
    (["-p big"], "rule 'slurm'"),
    (["-p=big"], "rule 'slurm'"),
    (["--part=big"], "rule 'slurm'"),
    (["--partit", "--mail-type=END"], "rule 'slurm'"),  # (the next item is --partit's value)
    (["--mail-type=END --partition=big"], "rule 'slurm'"),
    (["-Qpbig"], "rule 'slurm'"),
    (['--comment "a # b" -p big'], "rule 'slurm'"),
    # QOS, account, another cluster
    (["--qos=high"], "rule 'slurm'"),
    (["-q high"], "rule 'slurm'"),
    (["--account=other"], "rule 'slurm'"),
    (["-Aother"], "rule 'slurm'"),
    (["--acc=other"], "abbreviates several sbatch options"),
    (["-M other"], "rule 'slurm'"),
    (["--clusters=other"], "rule 'slurm'"),
    # a longer time, or none at all
    (["--time=7-00:00:00"], "rule 'max_time'"),
    (["-t 7-00:00:00"], "rule 'max_time'"),
    (["-t7-0"], "rule 'max_time'"),
    (["--ti=02:00:00"], "rule 'max_time'"),
    (["--time=UNLIMITED"], "rule 'max_time'"),
    (["--time=0"], "rule 'max_time'"),
    # more GPUs, nodes, tasks, whole nodes, many jobs
    (["--gres=gpu:8"], "rule 'max_gpus'"),
    (["--gres gpu:a100:8"], "rule 'max_gpus'"),
    (["-G8"], "rule 'max_gpus'"),
    (["-G 8"], "rule 'max_gpus'"),
    (["--gpus=8"], "rule 'max_gpus'"),
    (["--gpus-per-node=8"], "rule 'max_gpus'"),
    (["--gpus-per-task=8 --ntasks=8"], "rule 'max_gpus'"),
    (["--gpu=8"], "abbreviates several sbatch options"),
    (["--nodes=4"], "rule 'max_gpus'"),
    (["-N4"], "rule 'max_gpus'"),
    (["--nodelist=n[1-4]"], "rule 'max_gpus'"),
    (["--exclusive"], "rule 'max_gpus'"),
    (["--array=0-99"], "rule '"),
    (["--tres-per-task=gres/gpu:8"], "rule 'max_gpus'"),
    (["--made-up-option=1"], "is no sbatch option nbtrain knows"),
]


@pytest.mark.parametrize(("extra", "why"), ESCAPES, ids=[" ".join(e) for e, _ in ESCAPES])
def test_slurm_extra_cannot_set_what_a_course_preset_fixes_or_caps_in_any_spelling_sbatch_takes(
    course: Path, extra: list[str], why: str
) -> None:
    msg = refused(with_extra(extra))
    assert "distributed.slurm.extra.0" in msg and repr(extra[0]) in msg, msg
    assert why in msg and str(course) in msg, msg


def test_an_extra_item_that_is_no_option_is_refused_so_separated_values_cannot_slip_through(
    course: Path,
) -> None:
    assert "distributed.slurm.extra" in refused(with_extra(["-p", "big"]))


@pytest.mark.parametrize(
    "extra", [["--mail-type=END"], ["--partition=class", "-q students"], ["--time=00:20:00"], ["-J mine"]]
)
def test_slurm_extra_that_keeps_within_the_course_rules_passes_and_the_script_says_what_it_says(
    course: Path, workdir: Path, extra: list[str]
) -> None:
    prep = nbtrain.prepare(with_extra(extra))
    slurm = prep.resolved.config.distributed.slurm
    assert slurm is not None and slurm.extra == extra
    script = slurm_script(prep.plan, workdir / "run", slurm.model_dump())
    seen = {
        d.name: d.value
        for d in sbatch.directives(
            [ln[len("#SBATCH") :] for ln in script.splitlines() if ln.startswith("#SBATCH")]
        )
    }
    assert (seen["partition"], seen["account"], seen["qos"]) == ("class", "fin101", "students")
    assert seen["time"] in ("00:30:00", "00:20:00")


def test_a_preset_may_allow_an_option_in_extra_by_name(course: Path) -> None:
    course.write_text(COURSE + "sbatch_allowed: [gres]\n", encoding="utf-8")
    nbtrain.prepare(with_extra(["--gres=gpu:1"]))
    assert "rule 'max_gpus'" in refused(with_extra(["--gpus=2"]))
    course.write_text(COURSE + "sbatch_allowed: [--gres]\n", encoding="utf-8")
    assert "sbatch_allowed lists sbatch options by their long name" in refused(lora_yaml(5))


def test_the_preset_s_own_extra_lines_are_not_refused(workdir: Path) -> None:
    (workdir / PRESET_FILE).write_text(
        "slurm: {partition: class, extra: ['--gres=gpu:1']}\nmax_gpus: 1\n", encoding="utf-8"
    )
    slurm = nbtrain.prepare(lora_yaml(5)).resolved.config.distributed.slurm
    assert slurm is not None and slurm.extra == ["--gres=gpu:1"]


@pytest.mark.parametrize(("time", "why"), [("'0'", "no time limit at all"), ("UNLIMITED", "no time limit"),
                                           ("soon", "not a time nbtrain can read")])  # fmt: skip
def test_a_named_time_without_a_limit_is_refused_under_max_time(course: Path, time: str, why: str) -> None:
    msg = refused(on_slurm("{time: " + time + "}"))
    assert "distributed.slurm.time" in msg and why in msg and "allowed: up to 01:00:00" in msg, msg


def test_exclusive_is_refused_under_max_gpus_since_slurm_gives_it_every_gpu_of_its_nodes(
    course: Path,
) -> None:
    msg = refused(on_slurm("{exclusive: true}"))
    assert "distributed.slurm.exclusive" in msg and "sbatch_allowed: [exclusive]" in msg, msg


def test_max_time_holds_over_a_runs_requeued_jobs(course: Path) -> None:
    msg = refused(on_slurm("{time: '00:30:00', max_requeues: 1000}"))
    assert "distributed.slurm.max_requeues" in msg, msg
    assert "time 00:30:00 x (1 + max_requeues 1000) = 20-20:30:00" in msg, msg
    assert "max_requeues: 1 or fewer with time 00:30:00" in msg and "requeue: never" in msg, msg
    # left out: as many requeues as fit the cap; none when one job already takes it
    for time, fits in (("'00:30:00'", 1), ("'00:20:00'", 2), ("'00:45:00'", 0), ("'5'", 10)):
        slurm = nbtrain.prepare(on_slurm("{time: " + time + "}")).resolved.config.distributed.slurm
        assert slurm is not None and slurm.max_requeues == fits
    slurm = nbtrain.prepare(on_slurm("{requeue: never, max_requeues: 50}")).resolved.config.distributed.slurm
    assert slurm is not None and slurm.requeue == "never"
    # a --time in extra is the one sbatch takes, so it is the one counted
    msg = refused(with_extra(["--time=00:40:00"]).replace("extra:", "max_requeues: 3, extra:"))
    assert "time 00:40:00 x (1 + max_requeues 3)" in msg, msg


def test_the_sbatch_script_survives_a_runs_root_with_a_space_hash_quote_and_percent(
    course: Path, workdir: Path
) -> None:
    prep = nbtrain.prepare(lora_yaml(5))
    slurm = prep.resolved.config.distributed.slurm
    assert slurm is not None
    run_dir = workdir / "my runs #1 'x' 100%" / "r-1"
    script = slurm_script(prep.plan, run_dir, slurm.model_dump())
    lines = [ln[len("#SBATCH") :] for ln in script.splitlines() if ln.startswith("#SBATCH")]
    output = [d.value for d in sbatch.directives(lines) if d.name == "output"]
    assert output == [str(run_dir / "logs" / "slurm-").replace("%", "%%") + "%j.log"]
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    body = next(ln for ln in script.splitlines() if "resume-in-job" in ln)
    words = body.split("resume-in-job", 1)[1].split(";")[0]
    said = subprocess.run(["bash", "-c", f'set -- {words}; printf %s "$1"'], capture_output=True, text=True)
    assert said.stdout == str(run_dir)  # the script's commands get the run directory as one word
    with pytest.raises(sbatch.Unwritable, match="line break"):
        slurm_script(prep.plan, workdir / "a\nb" / "r-1", slurm.model_dump())
