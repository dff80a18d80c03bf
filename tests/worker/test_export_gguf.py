"""GGUF export (nbtrain.worker.jobs.export_gguf) of a real run of the tiny-adder, checked by running each
file in llama.cpp (llama-cpp-python, built once per machine: nbtrain.control.jobs.llamacpp; `make test` starts
its setup before the suite)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import runs_in

pytestmark = pytest.mark.slow

QUANTS = ["f16", "q8_0", "q4_k_m"]


def llama_cpp_ready() -> None:
    """llama.cpp set up on this machine: waits for `make test`'s background setup; with
    NBTRAIN_REQUIRE_LLAMACPP=1 (make) a missing setup fails the test, else it skips saying why."""
    from nbtrain.control.jobs import llamacpp

    why = llamacpp.wait(timeout=1200)
    if why is None:
        return
    if os.environ.get("NBTRAIN_REQUIRE_LLAMACPP") == "1":
        pytest.fail(f"{why}\nsetup log: {llamacpp.log_path()}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def llama_cpp() -> None:
    llama_cpp_ready()


@pytest.fixture(scope="module")
def adder_run(tmp_path_factory: pytest.TempPathFactory, llama_cpp: None) -> dict[str, Any]:
    """The tiny-adder taught to answer sums in a chat (lab 0's job: 300 LoRA steps, ~17 s), its eval
    rows the 32 held-out sums; then exported to f16, q8_0 and q4_k_m by a kernel-like process that must
    import neither torch nor llama_cpp."""
    import nbtrain
    from nbtrain.examples import write_dataset
    from nbtrain.examples.pretrained import held_out_addition

    work = tmp_path_factory.mktemp("gguf-export")
    with runs_in(work):
        data = write_dataset(work / "add.jsonl", n=400)
        rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
                for q, a in held_out_addition(32)]  # fmt: skip
        (work / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        model = nbtrain.example_model()
        run = nbtrain.finetune(
            f"""\
model: {model}
method: lora
data: {{train: {data}, eval: held.jsonl}}
lora: {{r: 8, alpha: 16, dropout: 0.05, target_modules: all-linear}}
train: {{max_steps: 300, per_device_train_batch_size: 16, learning_rate: 5.0e-3, warmup_steps: 20}}
""",
            name="adder",
        )
        run.wait(timeout=600)
        kernel = (
            "import json, sys, nbtrain\n"
            f"e = nbtrain.export({str(run.dir)!r}, to='out', format='gguf', quant={QUANTS!r})\n"
            "print(repr(e))\n"  # what a cell ending in the export shows (its HTML holds the same report)
            "print('LEAKED', sorted(m for m in ('torch', 'llama_cpp', 'transformers') if m in sys.modules))\n"
        )
        t = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", kernel], capture_output=True, text=True, cwd=work,
                              env=dict(os.environ), timeout=600, check=False)  # fmt: skip
        took = time.monotonic() - t
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"run": run, "out": work / "out", "stdout": proc.stdout, "took": took, "work": work}


def test_each_quant_answers_the_held_out_sums_in_llama_cpp_as_the_merged_model_does(
    adder_run: dict[str, Any],
) -> None:
    out: Path = adder_run["out"]
    report = json.loads((out / "gguf_report.json").read_text())
    assert report["prompts"] == 32 and report["prompts_from"] == "the run's eval rows"
    assert report["transformers"]["accuracy"] >= 0.9  # the run learnt the sums: the check means something
    files = report["files"]
    assert list(files) == QUANTS
    f16, q8 = files["f16"], files["q8_0"]
    assert f16["same_as_transformers"] == 32 and f16["same_prompt_tokens"] == 32  # the must-hold
    assert abs(q8["accuracy"] - report["transformers"]["accuracy"]) <= 0.02
    assert files["q4_k_m"]["accuracy"] is not None and files["q4_k_m"]["tokens_per_s"] > 0
    assert files["q4_k_m"]["bytes"] < files["q8_0"]["bytes"] < files["f16"]["bytes"]
    for q in QUANTS:
        assert (out / f"adder-{q}.gguf").stat().st_size == files[q]["bytes"]
    # what the cell shows: the job's progress as it goes, the table and the Ollama command
    said = adder_run["stdout"]
    assert (
        said.index("nbtrain export: converting the model to GGUF (f16)")
        < said.index("nbtrain export: quantising to q4_k_m")
        < said.index("checked on 32 prompts")
    )
    assert "answers as transformers' 32/32" in adder_run["stdout"]
    assert said.count("checked on 32 prompts") == 1  # the report once: the result's, not printed again
    assert "\nf16 matches the full model on 32/32, q8_0 on " in said  # its verdict heads it
    assert f"Ollama: ollama create adder -f {out / 'Modelfile'}" in adder_run["stdout"]
    assert "LEAKED []" in adder_run["stdout"]  # the kernel imported no torch, transformers or llama_cpp


def test_the_modelfile_and_readme_say_how_to_run_it_in_ollama_llama_cpp_and_lm_studio(
    adder_run: dict[str, Any],
) -> None:
    out: Path = adder_run["out"]
    modelfile = (out / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./adder-q4_k_m.gguf\n")
    # the tiny-adder's template is Phi-3's shape: <|user|> ... <|end|> <|assistant|>
    assert "<|{{ .Role }}|>" in modelfile and 'PARAMETER stop "<|end|>"' in modelfile
    readme = (out / "README.md").read_text()
    for words in ("llama-server -m adder-q4_k_m.gguf", "ollama create adder -f Modelfile", "LM Studio"):
        assert words in readme
    record = json.loads((out / "nbtrain_export.json").read_text())
    assert record["kind"] == "gguf" and record["quants"] == QUANTS and record["format"] == "gguf"


def test_a_second_export_of_the_same_weights_reuses_the_conversion(
    adder_run: dict[str, Any], tmp_path: Path
) -> None:
    import nbtrain

    t = time.monotonic()
    again = nbtrain.export(adder_run["run"], to=tmp_path / "again", format="gguf", quant="q8_0,f16")
    took = time.monotonic() - t
    report = again.record["gguf"]
    assert sorted(report["reused"]) == ["f16", "q8_0"]
    assert report["files"]["f16"]["same_as_transformers"] == 32
    assert (tmp_path / "again" / "adder-q8_0.gguf").read_bytes() == (
        adder_run["out"] / "adder-q8_0.gguf"
    ).read_bytes()
    assert took < adder_run["took"]


def test_an_export_killed_midway_leaves_no_gguf_that_looks_complete_and_the_next_one_tidies_up(
    adder_run: dict[str, Any], tmp_path: Path
) -> None:
    from gguf import GGUFReader

    run = adder_run["run"]
    target = tmp_path / "killed"
    argv = [sys.executable, "-m", "nbtrain.worker.jobs.export", str(run.dir), "--to", str(target),
            "--format", "gguf", "--quant", "bf16,q5_k_m"]  # fmt: skip
    quiet = subprocess.DEVNULL
    proc = subprocess.Popen(argv, stdout=quiet, stderr=quiet, start_new_session=True)
    cache = run.dir / "gguf"
    deadline = time.monotonic() + 300
    while not list(cache.glob("*/.hf.partial-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the export ended before it could be killed midway"
    os.killpg(proc.pid, signal.SIGKILL)  # the job and its converter
    proc.wait()
    assert not target.exists()
    for f in cache.glob("*/model-*.gguf"):  # every file under its final name is whole
        GGUFReader(f)
    assert not list(cache.glob("*/model-bf16.gguf")) and not list(cache.glob("*/model-q5_k_m.gguf"))
    assert list(tmp_path.glob(".killed.partial-*")) or list(cache.glob("*/.*partial-*"))

    import nbtrain

    done = nbtrain.export(run, to=target, format="gguf", quant="bf16,q5_k_m")
    assert sorted(p.name for p in target.glob("*.gguf")) == ["adder-bf16.gguf", "adder-q5_k_m.gguf"]
    assert done.record["gguf"]["files"]["bf16"]["same_prompt_tokens"] == 32
    assert not list(tmp_path.glob(".killed.*")) and not list(cache.glob("*/.*partial-*"))


def test_the_adapter_alone_exports_as_a_gguf_lora_that_llama_cpp_applies_on_the_base(
    adder_run: dict[str, Any], tmp_path: Path
) -> None:
    import nbtrain

    done = nbtrain.export(adder_run["run"], to=tmp_path / "lora", format="gguf", merge=False)
    assert done.kind == "gguf-lora"
    names = sorted(p.name for p in done.dir.glob("*.gguf"))
    assert names == ["adder-base-f16.gguf", "adder-lora-f16.gguf"]
    report = done.record["gguf"]
    # the LoRA applied at run time by llama.cpp answers as the merged model does in transformers
    assert report["files"]["f16"]["same_as_transformers"] == 32 and report["files"]["f16"]["accuracy"] >= 0.9
    assert report["files"]["f16"]["bytes"] < report["base"]["bytes"] / 2
    modelfile = (done.dir / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./adder-base-f16.gguf\nADAPTER ./adder-lora-f16.gguf\n")
    assert "--lora adder-lora-f16.gguf" in (done.dir / "README.md").read_text()


def test_an_export_that_runs_out_of_space_fails_saying_so_and_leaves_nothing_that_looks_complete(
    adder_run: dict[str, Any], tmp_path: Path
) -> None:
    """A full disk, as a write sees it: the export job may write files of at most 300 kB (RLIMIT_FSIZE,
    SIGXFSZ ignored: writes past it fail with EFBIG, as they would with ENOSPC), and q6_k is quantised
    from the kept f16 file (1 MB), so the failure comes while llama.cpp writes the new file."""
    import resource

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    run = adder_run["run"]
    target = tmp_path / "full"
    result = tmp_path / "result.json"
    argv = [sys.executable, "-m", "nbtrain.worker.jobs.export", str(run.dir), "--to", str(target),
            "--format", "gguf", "--quant", "q6_k", "--result", str(result)]  # fmt: skip
    proc = subprocess.run(
        argv, capture_output=True, text=True, preexec_fn=small_files, timeout=300, check=False
    )
    assert proc.returncode == 1
    assert "could not quantise" in json.loads(result.read_text())["error"]
    cache = run.dir / "gguf"
    assert not list(cache.glob("*/model-q6_k.gguf")) and not list(cache.glob("*/.*q6_k*"))
    assert not target.exists() and not list(tmp_path.glob(".full.*"))
