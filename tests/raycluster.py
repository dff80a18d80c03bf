"""A real Ray cluster on this machine for the Ray tests: a head and two worker nodes of one CPU each, started
with Ray's own multi-node-on-one-host helper (``ray.cluster_utils.Cluster``), in a temporary folder of its
own, its traffic kept on loopback. Clients find it through its dashboard's address (the Jobs and state
APIs), as a notebook outside a cluster does.

Ray binds the machine's interface address by default (and its drivers look for the cluster there):
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the environment of every process of the cluster, and of this one
before Ray is imported, makes each of them use 127.0.0.1, so no test sends anything past loopback. The
cluster's processes are children of the process that started it; ``stop`` ends exactly them."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing() -> str | None:
    """Why the Ray tests cannot run here, or None."""
    # found, not imported: Ray reads its loopback setting as it is imported (RayCluster.start sets it first)
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install 'nbtrain[ray]')"
    return None


class RayCluster:
    """Head + ``workers`` nodes; ``address`` is its dashboard (http://127.0.0.1:PORT)."""

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers
        self.cluster: Any = None
        self.nodes: list[Any] = []
        self.address = ""
        # not under a folder named "ray": a job started in its parent folder would import it as Ray
        self.tmp = Path(tempfile.mkdtemp(prefix="nbray-"))

    def start(self) -> RayCluster:
        # before Ray is imported here, and inherited by its processes: loopback, and the cluster's files (and
        # the address file ray.init("auto") reads) in this cluster's folder, not /tmp/ray
        os.environ.update({**LOOPBACK_ENV, "RAY_TMPDIR": str(self.tmp)})
        from ray._private import ray_constants
        from ray.cluster_utils import Cluster

        ray_constants.ENABLE_RAY_CLUSTER = False  # read at import: this process may have imported Ray before

        for attempt in (1, 2):  # Ray gives a node 30 s to register: on a loaded machine, once more
            port = _free_port()
            try:
                self._start(Cluster, port)
                return self
            except Exception:
                self.stop()  # what did start (a head without its workers) goes
                if attempt == 2:
                    raise
                self.tmp.mkdir(parents=True, exist_ok=True)
                self.nodes = []
        return self

    def _start(self, cluster: Any, port: int) -> None:
        self.cluster = cluster(
            initialize_head=True,
            connect=False,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": True,
                "dashboard_host": "127.0.0.1",
                "dashboard_port": port,
                "node_ip_address": "127.0.0.1",
                "object_store_memory": 80 * 2**20,
            },
        )
        for _ in range(self.workers):
            self.nodes.append(self.add_worker())
        self.address = f"http://127.0.0.1:{port}"
        self._wait_for_jobs_api()

    def add_worker(self) -> Any:
        return self.cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=80 * 2**20)

    def _wait_for_jobs_api(self, timeout: float = 60.0) -> None:
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + timeout
        while True:
            try:
                JobSubmissionClient(self.address).list_jobs()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def restore(self, workers: int = 2) -> None:
        """Back to ``workers`` worker nodes after a test killed some, Ray's state API listing exactly those
        alive (it lists a killed node as alive until the GCS has missed its health checks)."""
        from nbtrain.control.launch import rayjobs

        while len(self.nodes) < workers:
            self.nodes.append(self.add_worker())
        deadline = time.monotonic() + 90
        while len(alive := rayjobs.nodes(self.address)) != 1 + workers:
            assert time.monotonic() < deadline, f"Ray lists {len(alive)} nodes alive, not {1 + workers}"
            time.sleep(0.5)

    def kill_worker(self, node: Any) -> None:
        """A worker node lost: its raylet and every process of it killed at once."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.nodes.remove(node)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
        shutil.rmtree(self.tmp, ignore_errors=True)
