"""Apple MPS and Ascend NPU facts from platform facts given as input (no such device on the test machines),
and the real probe here, which imports no torch."""

from __future__ import annotations

import glob
import subprocess
import sys

import pytest

from nbtrain.hardware import Accelerator, Hardware
from nbtrain.hardware.facts import mps_facts, npu_facts

GiB = 2**30


@pytest.mark.parametrize(("macos", "version", "bf16"), [("14.5", (14, 5), True), ("13.6.1", (13, 6), False)])
def test_apple_silicon_with_a_recent_macos_is_one_mps_gpu_sharing_the_ram(
    macos: str, version: tuple[int, int], bf16: bool
) -> None:
    acc, note = mps_facts("Darwin", "arm64", macos, 16 * GiB)
    assert note is None and acc is not None
    assert (acc.kind, acc.count, acc.memory_total, acc.macos, acc.bf16) == ("mps", 1, 16 * GiB, version, bf16)
    assert f"macOS {macos}" in acc.name


@pytest.mark.parametrize(
    ("system", "machine", "macos", "why"),
    [
        ("Darwin", "x86_64", "14.5", "needs Apple silicon and an arm64 Python"),  # Intel Mac, or Rosetta
        ("Darwin", "arm64", "12.1", "needs macOS 12.3 or newer"),
        ("Darwin", "arm64", "", "needs macOS 12.3 or newer"),
    ],
)
def test_a_mac_without_a_usable_mps_backend_gets_none_and_says_why(
    system: str, machine: str, macos: str, why: str
) -> None:
    acc, note = mps_facts(system, machine, macos, 8 * GiB)
    assert acc is None and note is not None and why in note


def test_linux_is_never_mps() -> None:
    assert mps_facts("Linux", "aarch64", "", 8 * GiB) == (None, None)


def test_ascend_npus_are_the_davinci_devices_this_process_may_see() -> None:
    devices = ["/dev/davinci0", "/dev/davinci1", "/dev/davinci7", "/dev/davinci_manager"]
    acc, note = npu_facts("2.5.1", devices)
    assert note is None and acc is not None
    assert (acc.kind, acc.count, acc.memory_total, acc.bf16) == ("npu", 3, 0, True)
    assert "torch_npu 2.5.1" in acc.name
    acc, _ = npu_facts("2.5.1", devices, visible="1,7")  # ASCEND_RT_VISIBLE_DEVICES
    assert acc is not None and acc.count == 2


def test_npu_devices_without_torch_npu_or_torch_npu_without_devices_say_what_is_missing() -> None:
    acc, note = npu_facts(None, ["/dev/davinci0"])
    assert acc is None and note is not None and "torch_npu is not installed" in note and "torch-npu" in note
    acc, note = npu_facts("2.5.1", ["/dev/davinci_manager"])
    assert acc is None and note is not None and "no Ascend NPU is visible" in note
    assert npu_facts(None, []) == (None, None)


def test_the_accelerator_is_in_the_hardware_record_with_its_bf16() -> None:
    acc = Accelerator("mps", 1, "Apple silicon GPU (MPS), macOS 13.6", 16 * GiB, (13, 6))
    d = Hardware(ram_total=16 * GiB, accelerator=acc).to_dict()
    assert d["accelerator"]["kind"] == "mps" and d["accelerator"]["bf16"] is False
    assert Hardware().to_dict()["accelerator"] is None


def test_the_probe_here_finds_no_accelerator_and_imports_neither_torch_nor_torch_npu() -> None:
    code = (
        "import sys\nfrom nbtrain.hardware import probe\nhw = probe()\n"
        "print(hw.accelerator, 'torch' in sys.modules, 'torch_npu' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    found, torch_loaded, torch_npu_loaded = out.stdout.split()
    assert (torch_loaded, torch_npu_loaded) == ("False", "False"), out.stderr
    if sys.platform == "linux" and not glob.glob("/dev/davinci[0-9]*"):  # the machines the suite runs on
        assert found == "None"
