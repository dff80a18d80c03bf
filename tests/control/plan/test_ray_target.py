"""A Ray run is planned for its cluster, never for this machine: what ray: cannot combine with is refused
naming what to keep, and a cluster that cannot be read is a config problem naming it (the plan against the
real test cluster: tests/control/launch/test_ray.py)."""

from __future__ import annotations

import importlib.util
import socket

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.launch.rayjobs import dashboard, entrypoint, submission_id
from tests.conftest import lora_yaml

# found, not imported: Ray is imported by the tests that use it (tests/raycluster.py sets its env first)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")


def refused(config: str) -> str:
    with pytest.raises(ConfigError) as e:
        nbtrain.prepare(config)
    return str(e.value)


def ray_config(distributed: str) -> str:
    return lora_yaml(10) + "distributed:\n" + distributed


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again once the socket is


def test_what_places_processes_another_way_is_refused_beside_ray(workdir) -> None:
    ray = "  ray: {address: 'http://127.0.0.1:1', num_workers: 2}\n"
    said = refused(ray_config(ray + "  slurm: {partition: debug}\n"))
    assert "slurm: and ray: are two ways to place the run; keep one" in said
    said = refused(ray_config(ray + "  strategy: zero2\n"))
    assert "strategy: zero2 is not offered on Ray yet" in said
    said = refused(ray_config(ray + "  nodes: 2\n"))
    assert "set ray: num_workers, not nodes" in said and "needs hostfile" not in said


def test_a_ray_address_that_is_not_one_is_refused_with_the_forms_it_takes(workdir) -> None:
    said = refused(ray_config("  ray: {address: 'head 8265'}\n"))
    assert "is not a Ray address: give auto, the dashboard's http://HOST:8265, or ray://HOST:10001" in said
    zero = ray_config("  ray: {address: auto, num_workers: 0}\n")
    assert "num_workers is 'auto' or a number" in refused(zero)


def test_a_cluster_that_does_not_answer_is_a_config_problem_never_this_machine(workdir) -> None:
    address = f"http://127.0.0.1:{closed_port()}"
    said = refused(ray_config(f"  ray: {{address: '{address}'}}\n"))
    assert "cannot read the Ray cluster to plan the run" in said and address in said
    assert "never plans a Ray run for this machine" in said


def test_the_jobs_addresses_and_command_line() -> None:
    assert dashboard("auto") is None
    assert dashboard("http://head:8265/") == "http://head:8265"
    assert dashboard("ray://head:10001") == "http://head:8265"
    assert dashboard("10.0.0.5:6379") == "http://10.0.0.5:8265"
    assert submission_id("20261207-abc", 2) == "nbtrain-20261207-abc-2"
    line = entrypoint("/opt/my venv/bin/python", __import__("pathlib").Path("/runs/a b"))
    assert line == "'/opt/my venv/bin/python' -m nbtrain.worker.rayjob '/runs/a b'"
