"""A real SLURM cluster on this machine for the tests: Debian's slurm-wlm and munge (``make slurm``
installs them), one munged, one slurmctld and six slurmd (n1, n2, g1, g2, l1, l2, one CPU each, NodeAddr
127.0.0.1), with every file -- the munge key and socket, slurm.conf, state, spool, logs -- in one
temporary folder. Clients find it through ``SLURM_CONF``. Partition ``gpu`` is two more nodes (g1, g2)
that declare four GPUs each through GRES (``gpu:a100:4``, backed by four empty files: slurmd counts
files, not cards): what a login node sees of a GPU partition; jobs that need a real GPU are not run
there. The CPU partitions ``debug`` (the default) and ``urgent`` over n1 and n2 are as before; partition
``long`` (l1, l2, CPU) holds the runs a test starts early and checks late (time limits that take minutes of
SLURM's clock), so they go on beside the tests on ``debug`` instead of before them. ``stop()``
cancels every job it ran and stops exactly the daemons it started, then removes the folder.

    python -m tests.slurmcluster     # start one, print its SLURM_CONF, wait for Ctrl-C
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.conftest import lora_yaml

GPU_NODES = ("g1", "g2")  # partition gpu: GRES gpu:a100:4 each
LONG_NODES = ("l1", "l2")  # partition long: CPU nodes for runs that go on beside other tests
NODES = ("n1", "n2", *GPU_NODES, *LONG_NODES)
GPUS_PER_NODE = 4
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")


def missing() -> str | None:
    """Why a cluster cannot start here (None: it can)."""
    lacking = [d for d in DAEMONS if _which(d) is None]
    if lacking:
        return (
            f"SLURM is not installed ({', '.join(lacking)} missing): make slurm installs Debian's slurm-wlm "
            "and munge (root with apt-get), or run: sudo apt-get install -y slurm-wlm munge"
        )
    if os.getuid() != 0:
        return "the test cluster's daemons run as root (SlurmUser=root); run the SLURM tests as root"
    return None


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d) / name).exists()), None
    )


def fake_scontrol(folder: Path, gres: str = "gpu:h100:4", *, cpus: int = 16, memory_mb: int = 128000) -> Path:
    """An ``scontrol`` for tests that need a partition's nodes read but no cluster: every partition asked
    for (the default, ``batch``, when none is) is two nodes f1, f2 with ``gres`` ("" none), ``cpus`` and
    ``memory_mb`` each. Written into ``folder``, which the test puts first on PATH; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *"show partition"*) echo "PartitionName=${4:-batch} Default=YES Nodes=f[1-2] State=UP" ;;\n'
        f'  *"show node"*) for n in f1 f2; do echo "NodeName=$n CPUTot={cpus} RealMemory={memory_mb} '
        f'Gres={gres or "(null)"} State=IDLE"; done ;;\n'
        '  *) echo "fake scontrol: $*" >&2; exit 1 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="nbtrain-slurm-"))
        self.root.chmod(0o711)  # munged (user munge) reaches its own folder inside
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen[bytes]] = []

    # ------------------------------------------------------------------------------------ start
    def start(self, timeout: float = 60.0) -> Cluster:
        try:
            self._munge()
            self._write_conf()
            for argv, log in (
                ([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out"),
                *(
                    ([_which("slurmd"), "-D", "-N", n, "-f", str(self.conf)], f"slurmd-{n}.out")
                    for n in NODES
                ),
            ):
                self._spawn([str(a) for a in argv], log)
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, argv: list[str], log: str, **kw: object) -> None:
        with open(self.root / log, "wb") as out:
            self.procs.append(
                subprocess.Popen(  # type: ignore[call-overload]
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, env=self.env, **kw,
                )
            )  # fmt: skip

    def _munge(self) -> None:
        m = self.root / "munge"
        m.mkdir()
        m.chmod(0o711)  # munged: the socket's folder is traversable by all (clients reach the socket)
        key = m / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        user = pwd.getpwnam("munge")
        for p in (m, key):
            os.chown(p, user.pw_uid, user.pw_gid)
        self.munge_socket = m / "munge.socket.2"
        argv = [_which("munged"), "-F", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--log-file={m / 'munged.log'}", f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'munged.seed'}"]  # fmt: skip
        self._spawn([str(a) for a in argv], "munged.out", user=user.pw_uid, group=user.pw_gid)
        deadline = time.monotonic() + 20
        while not self.munge_socket.exists():
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(self.root / 'munged.out').read_text()}")
            time.sleep(0.1)

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        r = self.root
        (r / "state").mkdir()
        (r / "spool").mkdir()
        fake = r / "fakegpu"  # slurmd 22.05 counts a GRES's device files: empty regular files do
        fake.mkdir()
        for i in range(GPUS_PER_NODE):
            (fake / f"nvidia{i}").touch()
        (r / "gres.conf").write_text(  # beside slurm.conf, where slurmd looks for it
            f"NodeName=g[1-2] Name=gpu Type=a100 File={fake}/nvidia[0-{GPUS_PER_NODE - 1}]\n"
        )
        lines = [
            "ClusterName=nbtraintest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: how long a requeued job waits before it may start again (SLURM default 120 s)
            f"AuthInfo=socket={self.munge_socket},cred_expire=5",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            "DefMemPerCPU=4000",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2,bf_interval=2",  # a requeued job starts soon after its wait
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MpiDefault=none",
            # a step over its job's --mem is killed (no cgroups here: the accounting poll, each second)
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherParams=OverMemoryKill",
            "JobAcctGatherFrequency=task=1",
            "AccountingStorageType=accounting_storage/none",
            "MinJobAge=3600",  # the session's jobs stay known to scontrol while later tests read them
            "KillWait=10",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "PropagateResourceLimits=NONE",
            "GresTypes=gpu",
            *(
                f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=1 "
                f"RealMemory=8000{f' Gres=gpu:a100:{GPUS_PER_NODE}' if n in GPU_NODES else ''} State=UNKNOWN"
                for n in NODES
            ),
            # "urgent" preempts "debug": a job that may be requeued is, one that may not is ended PREEMPTED
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            "PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
            "PartitionName=urgent Nodes=n1,n2 MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
            # GPU nodes (without GPUs): what a login node plans a GPU job for
            f"PartitionName=gpu Nodes={','.join(GPU_NODES)} MaxTime=INFINITE State=UP PriorityTier=1",
            f"PartitionName=long Nodes={','.join(LONG_NODES)} MaxTime=INFINITE State=UP PriorityTier=1",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a SLURM daemon exited ({p.args!r}); see {self.root}")
            r = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            out = r.stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if all(states.get(n) == "idle" for n in NODES):
                return
            time.sleep(0.3)
        raise RuntimeError(f"the SLURM nodes did not become idle in {timeout:g} s: {out!r}; see {self.root}")

    # ------------------------------------------------------------------------------------- use
    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(_which(argv[0]) or argv[0]), *argv[1:]], capture_output=True, text=True, env=self.env,
            check=check, timeout=60,
        )  # fmt: skip

    def jobs(self, partition: str | None = None) -> list[str]:
        """The ids of the jobs queued or running (in ``partition`` only, where given)."""
        where = ["-p", partition] if partition else []
        return self.run("squeue", "-h", "-o", "%i", *where, check=False).stdout.split()

    # ------------------------------------------------------------------------------------- stop
    def stop(self) -> None:
        if self.conf.exists() and self.procs:
            for job in self.jobs():
                self.run("scancel", job, check=False)
            deadline = time.monotonic() + 30
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.3)
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":
    import sys

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    c = Cluster().start()
    print(f"export SLURM_CONF={c.conf}", flush=True)
    try:
        signal.pause()
    finally:
        c.stop()


# The runs of the SLURM tests (tests/control/launch/test_slurm.py, and conftest.py's time-limit runs).
def on_slurm(max_steps: int, *, nodes: int = 1, slurm_extra: str = "", save_steps: int = 5) -> str:
    return lora_yaml(max_steps, extra=f"  save_steps: {save_steps}\n") + (
        f"distributed:\n  strategy: {'ddp' if nodes > 1 else 'auto'}\n  nodes: {nodes}\n  num_processes: 1\n"
        f"  slurm: {{time: '00:10:00'{slurm_extra}}}\n"
    )


# A notebook's callback that makes each step take 0.2 s, so a job of a one-minute limit trains a known while.
SLOW = """
import time
from transformers import TrainerCallback


class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.2)
"""


def slowed(text: str) -> tuple[str, dict[str, object]]:
    """The run's config with the Slow callback, and the notebook namespace that defines it."""
    ns: dict[str, object] = {"__name__": "__main__"}
    exec(compile(SLOW, "<notebook cell>", "exec"), ns)
    return text + "hooks:\n  callbacks: [Slow]\n", ns
