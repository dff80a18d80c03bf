"""What a multi-process run needs written and typed: the DeepSpeed JSON, the accelerate config, the
launcher command per node, a free rendezvous port, hostfiles and SLURM scripts.

Scaling itself is DeepSpeed's and torch.distributed's job; this module only produces their inputs, so
everything here is plain data and argv lists (kernel-safe: no torch import).
"""

from __future__ import annotations

import copy
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nbtrain.contract.errors import ConfigError, Problem
from nbtrain.control import memory
from nbtrain.control.config import trainargs
from nbtrain.control.config.choices import ZERO_STAGES
from nbtrain.control.config.schema import Resolved
from nbtrain.control.launch import sbatch
from nbtrain.control.plan.facts import model_config
from nbtrain.control.plan.planner import Plan, fsdp_settings

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", socket.gethostname()}


def deepspeed_config(res: Resolved, plan: Plan, args: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed JSON for a ZeRO plan, every "auto" replaced by the value the Trainer will use.

    A user-given config is the starting point; values it sets explicitly must agree with ``train:``
    (the Trainer would refuse a mismatch deep inside the first step, so it is checked here).
    """
    ds: dict[str, Any] = copy.deepcopy(res.user_deepspeed) if res.user_deepspeed else {}
    stage = ZERO_STAGES[plan.strategy]
    zero = ds.setdefault("zero_optimization", {})
    zero.setdefault("stage", stage)
    pin = plan.device == "cuda"
    if plan.offload in ("optimizer", "optimizer+params"):
        zero.setdefault("offload_optimizer", {"device": "cpu", "pin_memory": pin})
    if plan.offload == "optimizer+params":
        zero.setdefault("offload_param", {"device": "cpu", "pin_memory": pin})
    if plan.offload == "nvme":
        _zero_infinity(res, plan, ds, zero)
    if stage == 3:
        # Save a whole model (not shards) at the end, so output/ loads with from_pretrained.
        zero.setdefault("stage3_gather_16bit_weights_on_model_save", True)
    objective = res.config.objective
    micro = int(trainargs.value(args, "per_device_train_batch_size", objective))
    accum = int(trainargs.value(args, "gradient_accumulation_steps", objective))
    wanted = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * plan.world_size,
        "gradient_clipping": float(trainargs.value(args, "max_grad_norm", objective)),
    }
    problems = []
    for key, value in wanted.items():
        given = ds.get(key, "auto")
        if given == "auto":
            ds[key] = value
        elif given != value:
            problems.append(
                Problem(
                    "distributed.deepspeed_config",
                    f"{key} is {given} in the DeepSpeed config but the training arguments give {value}; "
                    f'set it to "auto" or make train: agree',
                )
            )
    if problems:
        raise ConfigError(problems)
    for key, on in (("bf16", plan.precision == "bf16"), ("fp16", plan.precision == "fp16")):
        section = ds.setdefault(key, {})
        if section.get("enabled", "auto") == "auto":
            section["enabled"] = on
    if plan.offload != "none" and "optimizer" not in ds:
        # ZeRO-Offload steps the optimizer on the CPU: DeepSpeed's CPU Adam does that (a compiled op).
        ds["optimizer"] = {
            "type": "AdamW",
            "params": {
                "lr": float(trainargs.value(args, "learning_rate", objective)),
                "betas": [
                    float(trainargs.value(args, "adam_beta1", objective)),
                    float(trainargs.value(args, "adam_beta2", objective)),
                ],
                "eps": float(trainargs.value(args, "adam_epsilon", objective)),
                "weight_decay": float(trainargs.value(args, "weight_decay", objective)),
            },
        }
    ds.setdefault("steps_per_print", 10**9)  # the run directory has the metrics; keep the logs quiet
    return ds


def _zero_infinity(res: Resolved, plan: Plan, ds: dict[str, Any], zero: dict[str, Any]) -> None:
    """offload: nvme: parameters and optimizer state swap to files under nvme_path through DeepSpeed's
    async I/O (libaio; the async_io op builds on first use). Its buffers are pinned RAM: the parameter
    buffer holds the largest parameter's partition (DeepSpeed's 1e8 elements x 5 otherwise, when the
    model's config.json is not here), an optimizer buffer one fp32 sub-group."""
    path, pin = str(res.config.distributed.nvme_path), plan.device == "cuda"
    where: dict[str, Any] = {"device": "nvme", "nvme_path": path, "pin_memory": pin}
    param: dict[str, Any] = {**where, "buffer_count": memory.NVME_PARAM_BUFFERS}
    mc = model_config(res)
    if mc is not None:
        param["buffer_size"] = memory.nvme_param_buffer(memory.count_parameters(mc), plan.world_size)
    zero.setdefault("offload_param", param)
    zero.setdefault("offload_optimizer", {**where, "buffer_count": memory.NVME_OPTIMIZER_BUFFERS})
    zero.setdefault("sub_group_size", memory.NVME_SUB_GROUP)
    # DeepSpeed's defaults, written out so the run directory shows them
    ds.setdefault(
        "aio",
        {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
         "overlap_events": True},
    )  # fmt: skip


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now. The OS hands out distinct ephemeral ports, so runs started at
    the same moment get different ones."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Host:
    name: str
    slots: int

    @property
    def local(self) -> bool:
        return self.name in LOCAL_HOSTS


def read_hostfile(path: str | Path) -> list[Host]:
    """DeepSpeed's hostfile format: one ``hostname slots=N`` per line; '#' starts a comment."""
    hosts = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for p in parts[1:]:
            if p.startswith("slots="):
                try:
                    slots = int(p.removeprefix("slots="))
                except ValueError:
                    raise ConfigError(
                        [
                            Problem(
                                "distributed.hostfile", f"line {lineno} of {path}: slots must be an integer"
                            )
                        ]
                    ) from None
        hosts.append(Host(parts[0], slots))
    return hosts


def worker_module_args(run_dir: Path) -> list[str]:
    return ["-m", "nbtrain.worker", str(run_dir)]


def node_argv(
    plan: Plan, run_dir: Path, *, port: int, master_addr: str = "127.0.0.1", node_rank: int = 0
) -> list[str]:
    """The command that starts this plan's processes on one node."""
    n, py = plan.num_processes, sys.executable
    if plan.launcher == "direct":
        return [py, *worker_module_args(run_dir)]
    if plan.launcher == "torchrun" and plan.nodes == 1:
        # torchrun's agent, its ranks forked from one process (nbtrain/worker/ranks.py), served warm
        return [py, "-m", "nbtrain.worker.ranks", f"--nproc-per-node={n}", f"--master-addr={master_addr}",
                f"--master-port={port}", str(run_dir)]  # fmt: skip
    if plan.launcher == "torchrun":
        return [
            py, "-m", "torch.distributed.run",
            f"--nproc-per-node={n}", f"--nnodes={plan.nodes}", f"--node-rank={node_rank}",
            f"--master-addr={master_addr}", f"--master-port={port}",
            *worker_module_args(run_dir),
        ]  # fmt: skip
    if plan.launcher == "deepspeed":
        # --num_gpus also on CPU: without it DeepSpeed's CPU accelerator starts a single rank.
        return [
            py, "-m", "deepspeed.launcher.runner",
            "--num_gpus", str(n), "--num_nodes", "1",
            "--master_addr", master_addr, "--master_port", str(port),
            "--no_local_rank", "--module", "nbtrain.worker", str(run_dir),
        ]  # fmt: skip
    if plan.launcher == "accelerate":
        return [
            py, "-m", "accelerate.commands.launch",
            "--config_file", str(run_dir / "accelerate.yaml"),
            "--main_process_port", str(port), "--machine_rank", str(node_rank),
            "--main_process_ip", master_addr,
            *worker_module_args(run_dir),
        ]  # fmt: skip
    raise ValueError(f"no command line for launcher {plan.launcher!r}")


def accelerate_config(plan: Plan, run_dir: Path) -> dict[str, Any]:
    """accelerate's config file for this plan (``accelerate launch --config_file``)."""
    if plan.strategy.startswith("zero"):
        kind = "DEEPSPEED"
    elif plan.strategy == "fsdp":
        kind = "FSDP"
    else:
        # accelerate's MULTI_CPU means MPI; its MULTI_GPU launcher is torchrun, which runs CPU ranks over
        # gloo just as well when use_cpu is set.
        kind = "MULTI_GPU"
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": kind,
        "num_machines": plan.nodes,
        "num_processes": plan.world_size,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": {"bf16": "bf16", "fp16": "fp16"}.get(plan.precision, "no"),
        "use_cpu": plan.device == "cpu",
        "rdzv_backend": "static",
        "same_network": True,
    }
    if kind == "DEEPSPEED":
        # The DeepSpeed JSON already says the precision; accelerate refuses to be told twice.
        del cfg["mixed_precision"]
        cfg["deepspeed_config"] = {
            "deepspeed_config_file": str(run_dir / "deepspeed.json"),
            "zero3_init_flag": plan.strategy == "zero3",
        }
    if kind == "FSDP":
        # accelerate's names for the settings the training args carry (planner.fsdp_settings)
        fsdp = fsdp_settings(plan)
        cfg["fsdp_config"] = {
            "fsdp_version": fsdp["version"],
            "fsdp_auto_wrap_policy": fsdp["auto_wrap_policy"],
            "fsdp_reshard_after_forward": fsdp["reshard_after_forward"],
            "fsdp_state_dict_type": fsdp["state_dict_type"],
            "fsdp_cpu_ram_efficient_loading": fsdp["cpu_ram_efficient_loading"],
            "fsdp_sync_module_states": fsdp["cpu_ram_efficient_loading"],  # accelerate wants both
            "fsdp_offload_params": False,  # offload: needs DeepSpeed ZeRO (the schema says so)
        }
    if plan.device == "cuda":
        cfg["gpu_ids"] = ",".join(str(g) for g in plan.gpus)
    return cfg


def write_launch_files(plan: Plan, run_dir: Path, *, into: Path | None = None) -> None:
    """Write deepspeed.json / accelerate.yaml for the run at ``run_dir``: visible, copyable, and what runs.
    ``into``: where to write them now (a run directory being built beside its final place)."""
    into = into or run_dir
    if plan.deepspeed is not None:
        import json

        (into / "deepspeed.json").write_text(json.dumps(plan.deepspeed, indent=2) + "\n", encoding="utf-8")
    if plan.launcher == "accelerate":
        text = yaml.safe_dump(accelerate_config(plan, run_dir), sort_keys=False)
        (into / "accelerate.yaml").write_text(text, encoding="utf-8")


def slurm_script(plan: Plan, run_dir: Path, slurm: dict[str, Any], *, allocation: bool = False) -> str:
    """An sbatch script that starts one torchrun per node, rendezvousing on the first node's address.

    ``signal_before`` seconds before the job's time limit (SLURM's EndTime, read by
    ``python -m nbtrain.control.slurmjob watch`` beside the training) the run is asked to stop at a
    checkpoint;
    with ``requeue: auto`` the job then requeues itself, and a requeued job first resumes the run from that
    checkpoint (``resume-in-job``), so a run longer than its time limit is one run with one curve.

    ``allocation``: the script runs with ``bash`` inside an allocation the notebook already has (salloc,
    batchspawner): srun uses its nodes, and the allocation is never requeued.

    Paths go into ``#SBATCH`` lines quoted as sbatch reads them (a space or ``#`` in the runs root splits
    nothing, a ``%`` stays a ``%``) and into the commands quoted for bash; a runs root no #SBATCH line can
    carry (a line break, or a backslash SLURM drops from an output path) raises ``sbatch.Unwritable``."""
    run = shlex.quote(str(run_dir))
    py = shlex.quote(sys.executable)
    requeue = slurm.get("requeue", "auto") == "auto" and not allocation
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={sbatch.value(f'nbtrain-{run_dir.name}')}",
        f"#SBATCH --nodes={plan.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --time={sbatch.value(str(slurm.get('time', '04:00:00')))}",
        f"#SBATCH --output={sbatch.output_path(str(run_dir / 'logs' / 'slurm-'), '%j.log')}",
        "#SBATCH --open-mode=append",  # a requeued job's output goes on in the same log
        "#SBATCH --requeue" if requeue else "#SBATCH --no-requeue",
    ]
    for key, opt in (("partition", "partition"), ("account", "account"), ("qos", "qos"),
                     ("constraint", "constraint"), ("mem", "mem"), ("gpus_per_node", "gpus-per-node"),
                     ("cpus_per_task", "cpus-per-task")):  # fmt: skip
        if slurm.get(key):
            lines.append(f"#SBATCH --{opt}={sbatch.value(str(slurm[key]))}")
    if plan.device == "cuda" and not slurm.get("gpus_per_node"):
        # left out: the GPUs the plan found on the partition's nodes, one per process (torchrun below)
        lines.append(f"#SBATCH --gpus-per-node={len(plan.gpus)}")
    if slurm.get("exclusive"):
        lines.append("#SBATCH --exclusive")
    lines += [f"#SBATCH {x}" for x in slurm.get("extra", [])]
    torchrun = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={plan.num_processes}", f"--nnodes={plan.nodes}",
        "--rdzv-backend=c10d", '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"', '--rdzv-id="$SLURM_JOB_ID"',
        *worker_module_args(run_dir),
    ]  # fmt: skip
    cmd = " ".join(a if a.startswith("--rdzv-") else shlex.quote(a) for a in torchrun)
    max_requeues = int(slurm.get("max_requeues", 10))
    job_verb = f"{py} -m nbtrain.control.slurmjob"
    lines += [
        "set -uo pipefail",
        # node 0's address as SLURM reaches it (NodeAddr), which resolves wherever SLURM runs
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "MASTER_ADDR=$(scontrol show node \"$first\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p' | head -n 1)",
        "MASTER_ADDR=${MASTER_ADDR:-$first}",
        "MASTER_PORT=${MASTER_PORT:-$((29500 + SLURM_JOB_ID % 1000))}",
        "export MASTER_ADDR MASTER_PORT",
        f"restarts={0 if allocation else '${SLURM_RESTART_COUNT:-0}'}",
        'if [ "$restarts" -gt 0 ]; then',
        f"  {job_verb} resume-in-job {run}; rc=$?",
        '  if [ "$rc" = 10 ]; then exit 0; elif [ "$rc" != 0 ]; then exit "$rc"; fi',
        "fi",
    ]
    before = int(slurm.get("signal_before", 120))
    srun = f"srun --kill-on-bad-exit=1 --nodes={plan.nodes} --ntasks-per-node=1 {cmd}"
    if before > 0:
        lines += [
            f"{job_verb} watch {run} {before} &",
            "watcher=$!",
            srun,
            "code=$?",
            'kill "$watcher" 2>/dev/null',
        ]
    else:  # signal_before: 0: SLURM ends the job at its limit
        lines += [srun, "code=$?"]
    if requeue:  # stopped for the time limit at a checkpoint: go on in the requeued job
        lines += [
            f'if [ "$code" = 0 ] && {job_verb} should-requeue {run} "$restarts" {max_requeues}; then',
            '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
            "fi",
        ]
    lines += ['exit "$code"', ""]
    return "\n".join(lines)
