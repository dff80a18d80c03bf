"""The settings of the engines a run can be placed by, beside this machine: ``distributed: slurm:`` (an
sbatch job) and ``distributed: ray:`` (a Ray job)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from nbtrain.control.config.schema.strict import Strict
from nbtrain.hardware.named import card


class SlurmSettings(Strict):
    """``distributed: slurm:``: the run is an sbatch job (any number of nodes, one too)."""

    partition: str | None = Field(None, description="The SLURM partition to submit to.", examples=["gpu"])
    account: str | None = Field(
        None, description="The SLURM account the job is charged to.", examples=["lab"]
    )
    qos: str | None = Field(None, description="The SLURM quality of service.", examples=["normal"])
    constraint: str | None = Field(
        None, description="Node features the job needs (sbatch --constraint).", examples=["a100"]
    )
    time: str = Field(
        "04:00:00",
        description="The job's time limit, as sbatch takes it (minutes, HH:MM:SS, D-HH:MM:SS).",
        examples=["06:00:00"],
    )
    mem: str | None = Field(None, description="Memory per node, as sbatch takes it.", examples=["32G"])
    gpus_per_node: int | None = Field(
        None,
        gt=0,
        description="GPUs per node (left out: every GPU the partition's nodes have; the plan says how many).",
        examples=[4],
    )
    gpu: str | None = Field(
        None,
        description=(
            "The card the partition's nodes have, when their GRES type does not say it (gpu:a100 is 40 or "
            "80 GB; an untyped gpu:4 names none): the plan's memory per GPU is this card's. "
            "NBTRAIN_SLURM_GPU sets a site default."
        ),
        examples=["A100-80GB", "H100-80GB"],
    )
    cpus_per_task: int | None = Field(None, gt=0, description="CPUs for each node's task.", examples=[16])
    exclusive: bool = Field(False, description="Take whole nodes (sbatch --exclusive).")
    # auto: a job that nears its time limit stops at a checkpoint signal_before s before it, is requeued and
    # goes on from that checkpoint, at most max_requeues times; a job SLURM preempts or whose node fails is
    # requeued by SLURM and goes on from the last complete checkpoint. never: it stops there (resume by hand)
    requeue: Literal["auto", "never"] = Field(
        "auto",
        description=(
            "auto: near its time limit the run stops at a checkpoint, the job requeues and goes on from there"
            " (and a preempted job or one whose node failed goes on from its last checkpoint); never: it "
            "stops (resume by hand)."
        ),
    )
    max_requeues: int = Field(
        10, ge=0, description="requeue: auto: at most this many requeues for the time limit."
    )
    # seconds before the job's time limit the run stops at a checkpoint; 0: not at all, SLURM ends the job at
    # its limit (TIMEOUT) and resume goes on from the last complete checkpoint
    signal_before: int = Field(
        120,
        ge=0,
        description=(
            "Seconds before the time limit the run stops at a checkpoint; 0: not at all (SLURM ends the job "
            "at its limit)."
        ),
        examples=[120],
    )
    extra: list[str] = Field(
        default_factory=list,
        description="More sbatch options, one per line, written as given.",
        examples=[["--mail-type=END"]],
    )

    @field_validator("gpu")
    @classmethod
    def _known_card(cls, v: str | None) -> str | None:
        if v is not None:
            card(v)  # ValueError naming the cards nbtrain knows (or the sizes "A100" leaves open)
        return v

    @field_validator("partition", "account", "qos", "constraint", "time", "mem")
    @classmethod
    def _one_word(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(c.isspace() for c in v) or v.startswith("-")):
            raise ValueError(f"{v!r} is not one sbatch value (no spaces, not an option)")
        return v

    @field_validator("extra")
    @classmethod
    def _one_line_each(cls, v: list[str]) -> list[str]:
        for line in v:
            if "\n" in line or "\r" in line or not line.strip().startswith("-"):
                raise ValueError(f"{line!r}: each extra line is one sbatch option, e.g. --gres=gpu:2")
        return v


_RAY_ADDRESS = re.compile(r"^(auto|(ray|https?)://[^\s/]+(:\d+)?/?|[A-Za-z0-9.\-\[\]:]+:\d+)\Z")


class RaySettings(Strict):
    """``distributed: ray:``: the run is a Ray job on a Ray cluster (its workers through Ray Train)."""

    address: str = Field(
        description=(
            "The Ray cluster: auto (this machine is in it: the head node, a KubeRay pod), its dashboard "
            "(http://HOST:8265), or a Ray Client address (ray://HOST:10001)."
        ),
        examples=["http://head:8265", "auto"],
    )
    num_workers: Literal["auto"] | int = Field(
        "auto",
        description=(
            "Training workers (one process each, data parallel): auto gives one per GPU of the cluster, "
            "or one per node without GPUs."
        ),
        examples=[2, "auto"],
    )
    resources_per_worker: dict[str, float] | None = Field(
        None,
        description=(
            "What each worker reserves, in Ray's resource names (left out: 1 GPU on a cluster with GPUs, "
            "else 1 CPU)."
        ),
        examples=[{"CPU": 8, "GPU": 1}],
    )
    runtime_env: dict[str, Any] | None = Field(
        None,
        description="Ray's runtime environment for the job (env_vars, pip, working_dir...), as Ray takes it.",
        examples=[{"env_vars": {"HF_HOME": "/shared/hf"}}],
    )
    max_failures: int = Field(
        3,
        ge=-1,
        description=(
            "Worker failures (a lost node, a killed worker) survived by restarting the workers from the "
            "last checkpoint; -1: no limit, 0: the first fails the run."
        ),
    )
    gpu: str | None = Field(
        None,
        description=(
            "The card the cluster's GPU nodes have, when their accelerator label does not say it (A100 is 40 "
            "or 80 GB): the plan's memory per GPU is this card's."
        ),
        examples=["A100-80GB"],
    )
    python: str | None = Field(
        None,
        description=(
            "The Python that runs the job on the cluster (left out: this kernel's own, for a cluster "
            "that shares this environment; 'python' for the cluster's default)."
        ),
        examples=["python", "/opt/venv/bin/python"],
    )

    @field_validator("gpu")
    @classmethod
    def _known_card(cls, v: str | None) -> str | None:
        if v is not None:
            card(v)
        return v

    @field_validator("address")
    @classmethod
    def _address_ok(cls, v: str) -> str:
        if not _RAY_ADDRESS.match(v.strip()):
            raise ValueError(
                f"{v!r} is not a Ray address: give auto, the dashboard's http://HOST:8265, or ray://HOST:10001"
            )
        return v.strip()

    @field_validator("num_workers")
    @classmethod
    def _some_workers(cls, v: Any) -> Any:
        if isinstance(v, int) and not 1 <= v <= 4096:
            raise ValueError("num_workers is 'auto' or a number of workers from 1 to 4096")
        return v

    @field_validator("resources_per_worker")
    @classmethod
    def _resources_ok(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for name, amount in (v or {}).items():
            if not name or any(c.isspace() for c in name):
                raise ValueError(f"{name!r} is not a Ray resource name (CPU, GPU, memory, or a custom one)")
            if not 0 <= amount < 1e15:
                raise ValueError(f"resources_per_worker: {name}: {amount} is not an amount (0 or more)")
        return v
