"""distributed: strategies, launchers, hostfiles, DeepSpeed files and NVMe offload."""

from __future__ import annotations

from typing import Any

from nbtrain.control.config.choices import ZERO_STAGES
from nbtrain.control.config.facts import Facts
from nbtrain.control.config.problems import Problems
from nbtrain.control.config.schema.run import RunConfig


def check_distributed(cfg: RunConfig, facts: Facts, probs: Problems) -> dict[str, Any] | None:
    """Combinations that cannot work, rejected before launch. Returns a user DeepSpeed config, if any."""
    d = cfg.distributed
    where = ("distributed",)
    zero = d.strategy in ZERO_STAGES
    if d.offload != "none" and not (zero or d.strategy == "auto"):
        probs.add(
            (*where, "offload"),
            f"offload needs a DeepSpeed ZeRO strategy (zero1, zero2 or zero3), not strategy: {d.strategy}",
        )
    if d.offload == "optimizer+params" and d.strategy not in ("zero3", "auto"):
        probs.add(
            (*where, "offload"),
            "offloading parameters needs strategy: zero3 (ZeRO-1/2 keep every "
            "parameter on each device); use offload: optimizer, or zero3",
        )
    check_nvme(cfg, facts, probs)
    if cfg.method == "qlora" and d.strategy == "zero3":
        probs.add(
            (*where, "strategy"),
            "method: qlora cannot combine with zero3 here: ZeRO-3 partitions "
            "parameters, and bitsandbytes 4-bit weights cannot be partitioned. "
            "Use strategy: ddp or zero2, or method: lora with zero3",
        )
    if cfg.method == "qlora" and d.strategy == "fsdp":
        # FSDP2 can shard 4-bit weights only when bitsandbytes stores them in the compute dtype
        # (bnb_4bit_quant_storage), and bitsandbytes needs a GPU: nothing here could show that it works.
        probs.add(
            (*where, "strategy"),
            "method: qlora with strategy: fsdp is not offered: sharding 4-bit weights needs "
            "bitsandbytes on a GPU, and nbtrain could not test it. Use method: qlora with strategy: "
            "ddp, or method: lora with strategy: fsdp",
        )
    if d.strategy == "none" and isinstance(d.num_processes, int) and d.num_processes > 1:
        probs.add(
            (*where, "num_processes"),
            f"{d.num_processes} processes need a strategy that uses them: ddp, zero1, zero2, zero3 or fsdp",
        )
    if d.launcher == "notebook" and d.nodes > 1:
        probs.add(
            (*where, "launcher"),
            "launcher: notebook runs on this machine only; use torchrun or deepspeed for nodes > 1",
        )
    if d.launcher == "deepspeed" and d.strategy in ("fsdp",):
        probs.add((*where, "launcher"), "fsdp runs under accelerate or torchrun, not the deepspeed launcher")
    if d.nodes > 1 and d.hostfile is None and d.slurm is None and d.ray is None:
        probs.add(
            (*where, "nodes"),
            f"nodes: {d.nodes} needs hostfile: PATH (one 'host slots=N' line per "
            f"node) or slurm: {{partition: ...}}",
        )
    check_ray(cfg, probs)
    if d.hostfile is not None:
        hf = facts.resolved(d.hostfile)
        if not facts.is_file(hf):
            probs.add((*where, "hostfile"), f"hostfile not found: {hf}")
        else:
            try:
                hosts = [ln for ln in facts.text(hf).splitlines() if ln.split("#", 1)[0].strip()]
            except OSError as e:
                probs.add((*where, "hostfile"), f"cannot read the hostfile {hf}: {e.strerror}")
            else:
                if len(hosts) < d.nodes:
                    probs.add(
                        (*where, "nodes"),
                        f"nodes: {d.nodes} but {hf} lists {len(hosts)} host(s); list one 'host slots=N' "
                        f"line per node, or lower nodes",
                    )
    user_ds: dict[str, Any] | None = None
    if d.deepspeed_config is not None:
        if d.strategy not in ("auto", *ZERO_STAGES):
            probs.add(
                (*where, "deepspeed_config"),
                f"a DeepSpeed config needs strategy zero1/zero2/zero3 or auto, not {d.strategy}",
            )
        path = facts.resolved(d.deepspeed_config)
        try:
            loaded = facts.json(path)
        except FileNotFoundError:
            probs.add((*where, "deepspeed_config"), f"DeepSpeed config not found: {path}")
        except (OSError, ValueError) as e:
            probs.add((*where, "deepspeed_config"), f"{path.name} is not valid JSON: {e}")
        else:
            problem = deepspeed_config_problem(loaded)
            if problem:
                probs.add((*where, "deepspeed_config"), f"{path.name}: {problem}")
            else:
                user_ds = loaded
                stage = loaded.get("zero_optimization", {}).get("stage", 0)
                if d.strategy in ZERO_STAGES and ZERO_STAGES[d.strategy] != stage:
                    probs.add(
                        (*where, "strategy"),
                        f"strategy {d.strategy} but {path.name} has ZeRO "
                        f"stage {stage}; make them agree or use strategy: auto",
                    )
    return user_ds


def check_ray(cfg: RunConfig, probs: Problems) -> None:
    """ray: is an engine of its own: Ray places the workers, so what places processes elsewhere is refused
    beside it, naming what to keep."""
    d, where = cfg.distributed, ("distributed",)
    if d.ray is None:
        return
    for key, given in (("slurm", d.slurm is not None), ("hostfile", d.hostfile is not None)):
        if given:
            probs.add((*where, key), f"{key}: and ray: are two ways to place the run; keep one")
    if d.nodes > 1:
        probs.add((*where, "nodes"), "with ray:, Ray places the workers: set ray: num_workers, not nodes")
    if isinstance(d.num_processes, int) and d.num_processes > 1:
        probs.add((*where, "num_processes"), "with ray:, each worker is one process: set ray: num_workers "
                                             "instead of num_processes")  # fmt: skip
    if d.launcher not in ("auto",):
        probs.add((*where, "launcher"), f"with ray:, Ray Train starts the workers: leave launcher: auto, "
                                        f"not {d.launcher}")  # fmt: skip
    if d.strategy not in ("auto", "ddp", "none"):
        probs.add((*where, "strategy"), f"strategy: {d.strategy} is not offered on Ray yet: Ray Train's "
                                        "workers train with DDP here (strategy: ddp or auto)")  # fmt: skip
    if d.offload != "none":
        probs.add((*where, "offload"), "offload needs DeepSpeed, which nbtrain does not run on Ray yet")


def check_nvme(cfg: RunConfig, facts: Facts, probs: Problems) -> None:
    """offload: nvme (DeepSpeed ZeRO-Infinity) needs ZeRO-3, a folder for its swap files on a filesystem
    that takes O_DIRECT (DeepSpeed's async I/O opens them so), and the async_io op (libaio)."""
    d, where = cfg.distributed, ("distributed",)
    if d.offload != "nvme":
        if d.nvme_path is not None:
            probs.add((*where, "nvme_path"), "nvme_path is used only with offload: nvme; add offload: nvme "
                                             "(strategy: zero3) or remove nvme_path")  # fmt: skip
        return
    if d.strategy in ("zero1", "zero2"):
        probs.add((*where, "offload"), "offload: nvme swaps parameters and optimizer state to disk, which "
                                       "needs strategy: zero3 (or auto)")  # fmt: skip
    if cfg.method == "qlora":
        probs.add((*where, "offload"), "offload: nvme needs ZeRO-3, which cannot partition bitsandbytes' "
                                       "4-bit weights; use method: lora or full")  # fmt: skip
    if d.nvme_path is None:
        probs.add((*where, "offload"), "offload: nvme needs nvme_path: a folder on a fast local disk "
                                       "(NVMe SSD) for the swap files, under distributed:")  # fmt: skip
        return
    problem = facts.nvme_problem(facts.resolved(d.nvme_path))
    if problem is None:
        problem = facts.async_io_problem()
    if problem is not None:
        probs.add((*where, "nvme_path"), problem)


def deepspeed_config_problem(ds: Any) -> str | None:
    if not isinstance(ds, dict):
        return "a DeepSpeed config is a JSON object"
    zero = ds.get("zero_optimization", {})
    if not isinstance(zero, dict):
        return "zero_optimization must be an object"
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        return f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}"
    for key in ("offload_optimizer", "offload_param"):
        sub = zero.get(key)
        ok = isinstance(sub, dict) and sub.get("device") in ("cpu", "nvme", "none")
        if sub is not None and not ok:
            return f"zero_optimization.{key}.device must be cpu, nvme or none"
    if zero.get("offload_param") and zero["offload_param"].get("device") not in (None, "none") and stage != 3:
        return "offload_param needs zero_optimization.stage 3"
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        v = ds.get(key)
        if v is not None and v != "auto" and not (isinstance(v, int) and v > 0):
            return f'{key} must be a positive integer or "auto", got {v!r}'
    return None
