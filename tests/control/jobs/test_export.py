"""nbtrain.control.jobs.export from the kernel side: checks before anything starts, the detached export
worker, the merged model reloaded on its own, and a hub push that fails offline without losing the export."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import NbtrainError
from tests.worker.test_export import greedy


@pytest.mark.slow
def test_merged_export_reloads_alone_and_generates_what_base_plus_adapter_does(
    run_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "merged"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here: the push must fail, the export must stay
    with pytest.raises(NbtrainError) as err:
        nbtrain.get_run(run_copy).export(target, dtype="fp32", push_to_hub="someone/tiny-merged")
    msg = str(err.value)
    assert f"exported to {target}" in msg and "someone/tiny-merged" in msg and "offline" in msg.lower()
    log = (run_copy / "logs" / "export.log").read_text()
    assert "nbtrain export: not loaded (this run does not use them): bitsandbytes, scipy" in log

    import torch
    from transformers import AutoModelForCausalLM

    from nbtrain.worker.tuned import load_tuned

    names = {p.name for p in target.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "nbtrain_export.json"} <= names  # fmt: skip
    record = json.loads((target / "nbtrain_export.json").read_text())
    assert (record["kind"], record["method"], record["dtype"]) == ("merged", "lora", "float32")
    merged = AutoModelForCausalLM.from_pretrained(target)  # no peft, no base model path needed
    assert merged.dtype == torch.float32
    tuned, tok = load_tuned(run_copy, dtype="fp32")  # base + adapter (unmerged), same dtype
    assert greedy(merged, tok) == greedy(tuned, tok)


def test_a_non_empty_target_is_refused_and_left_untouched(run_copy: Path, tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(NbtrainError, match=r"not empty; .*overwrite=True"):
        nbtrain.export(run_copy, to=target)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
    assert not (run_copy / "logs" / "export.log").exists()  # nothing was started


def test_every_problem_is_reported_at_once_before_anything_starts(run_copy: Path, tmp_path: Path) -> None:
    shutil.rmtree(run_copy / "output")
    with pytest.raises(NbtrainError) as err:
        nbtrain.export(run_copy, to=tmp_path / "x", dtype="int3", push_to_hub="not a repo")
    msg = str(err.value)
    assert "no trained weights" in msg and "'int3' is not one of" in msg and "not a hub repo id" in msg
    assert not (tmp_path / "x").exists() and not (run_copy / "logs" / "export.log").exists()


def test_a_gguf_export_to_unknown_types_is_refused_before_it_starts(run_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(NbtrainError) as err:
        nbtrain.export(run_copy, to=tmp_path / "x", format="gguf", quant="f16,q9_z", merge=False)
    msg = str(err.value)
    assert "quant q9_z: give some of f32, f16, bf16, q8_0" in msg
    assert "a GGUF LoRA is written as f16, f32, bf16, q8_0, not q9_z" in msg
    with pytest.raises(NbtrainError, match="format 'onnx' is not one of hf, gguf"):
        nbtrain.export(run_copy, to=tmp_path / "x", format="onnx")
    with pytest.raises(NbtrainError, match="quant is for format='gguf'"):
        nbtrain.export(run_copy, to=tmp_path / "x", quant="q8_0")
    assert not (tmp_path / "x").exists() and not (run_copy / "logs" / "export.log").exists()


@pytest.mark.parametrize("kept", [False, True], ids=["nothing-set-up", "converter-kept-package-building"])
def test_a_gguf_export_without_llama_cpp_set_up_says_how_to_set_it_up(
    run_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    # The two states a machine is in before `make test`'s background setup ends (a fresh one; the
    # converter kept while pip still builds the package), made here whatever this machine has built.
    from nbtrain.contract.ggufcache import CONVERTED, llama_cpp_dir

    monkeypatch.setenv("NBTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # not importable, and find_spec finds none
    if kept:
        llama_cpp_dir().mkdir(parents=True)
        (llama_cpp_dir() / CONVERTED).write_text("llama_cpp_python.tar.gz\n")
    from nbtrain.control.jobs.llamacpp import NotSetUp

    with pytest.raises(NotSetUp) as err:
        nbtrain.export(run_copy, to=tmp_path / "x", format="gguf")
    msg = str(err.value)
    assert msg.startswith("not exported: GGUF export needs llama-cpp-python (llama.cpp; built from source")
    assert ("llama.cpp's converter" in msg) is not kept and "not set up on this machine yet" in msg
    assert "run `%finetune gguf-setup` in a notebook cell (or `nbtrain gguf-setup` in a terminal)" in msg
    # IPython shows it as the one paragraph, no traceback (the README's export line in a notebook)
    assert err.value._render_traceback_() == [f"NotSetUp: {msg}"] and "\n" not in msg
    assert not (tmp_path / "x").exists() and not (run_copy / "logs" / "export.log").exists()


def test_families_the_converter_does_not_take_and_vision_models_are_named_with_the_reason() -> None:
    from nbtrain.control.jobs.export import family_problem

    known = {"LlamaForCausalLM", "Qwen2ForCausalLM"}
    assert family_problem({"architectures": ["LlamaForCausalLM"]}, known) is None
    why = family_problem({"architectures": ["MadeUpForCausalLM"]}, known)
    assert why is not None and "does not convert MadeUpForCausalLM" in why and "LlamaForCausalLM" in why
    vision = family_problem({"architectures": ["LlavaForConditionalGeneration"], "vision_config": {}}, known)
    assert vision is not None and "mmproj" in vision


def test_the_kept_converter_lists_the_families_it_converts() -> None:
    from nbtrain.control.jobs import llamacpp
    from tests.worker.test_export_gguf import llama_cpp_ready

    if not llamacpp.kept():  # waits for the setup under make test (NBTRAIN_REQUIRE_LLAMACPP), else skips
        llama_cpp_ready()
    text, projectors = llamacpp.architectures()
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"} <= text and len(text) > 100
    assert projectors  # vision projectors are a list of their own


def test_the_kernel_side_imports_no_torch() -> None:
    code = (
        "import sys, nbtrain, nbtrain.ui.magics, nbtrain.control.jobs.export, nbtrain.control.jobs.evaluate\n"
        "import nbtrain.control.launch.tracking\n"
        "heavy = ('torch', 'transformers', 'peft', 'trl', 'bitsandbytes', 'lm_eval', 'tensorboard',\n"
        "         'wandb')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_an_export_shows_as_a_readable_summary_with_its_record_folded_away(tmp_path: Path) -> None:
    from nbtrain.control.jobs.export import ExportResult

    (tmp_path / "model.safetensors").write_bytes(b"\0" * 3 * 2**20)
    (tmp_path / "config.json").write_text("{}")
    record = {"run_id": "20261205-sft-1a2b", "run_name": "identity", "step": 40, "method": "lora",
              "objective": "sft", "base_model": "/models/smollm2", "dtype": "float32",
              "kind": "merged"}  # fmt: skip
    out = ExportResult(tmp_path, "merged", record, ["model.safetensors", "config.json"])
    rows = dict(out.summary())
    assert rows["run"] == "identity (20261205-sft-1a2b), step 40"
    assert rows["what"] == "merged: lora sft of /models/smollm2" and rows["files"] == "2, 3.0 MiB"
    assert rows["load it"].startswith("from_pretrained(DIR)")
    page = out._repr_html_()
    assert page.index("<table>") < page.index("<details>")  # the summary first, the raw record folded
    assert "&quot;run_id&quot;: &quot;20261205-sft-1a2b&quot;" in page.split("<details>")[1]


def _gguf_report(same: dict[str, int], right: int, n: int = 32) -> dict[str, object]:
    files = {q: {"bytes": 2**20, "same_as_transformers": k, "accuracy": right / n, "tokens_per_s": 30.0}
             for q, k in same.items()}  # fmt: skip
    return {"prompts": n, "prompts_from": "the run's eval rows", "files": files,
            "transformers": {"accuracy": right / n, "right": right, "scored": n}}  # fmt: skip


def test_a_gguf_report_opens_with_a_verdict_on_the_quant_and_on_the_model_itself() -> None:
    from nbtrain.control.jobs.export import gguf_verdict

    untrained = _gguf_report({"q4_k_m": 20}, right=0)  # what an under-trained tiny-adder run gave
    assert gguf_verdict(untrained) == (
        "q4_k_m matches the full model on 20/32 prompts; the model itself answers 0/32 right: train longer "
        "before exporting"
    )
    lossy = gguf_verdict(_gguf_report({"f16": 32, "q4_k_m": 20}, right=31))
    assert lossy == (
        "f16 matches the full model on 32/32, q4_k_m on 20/32 prompts; the model itself answers 31/32 right: "
        "q4_k_m changes 12 of the answers; use f16 where they must hold"
    )
    assert gguf_verdict(_gguf_report({"q8_0": 32}, right=30)).endswith("answers 30/32 right: ready to use")
    older = {**untrained, "transformers": {"accuracy": 0.25}}  # a report from before the counts
    assert "the model itself answers 8/32 right" in str(gguf_verdict(older))
    assert gguf_verdict({"prompts": 0, "files": {"f16": {"bytes": 1}}}) is None  # nothing was checked


def test_a_gguf_export_shows_its_types_not_the_merges_precision_and_its_check_once(tmp_path: Path) -> None:
    from nbtrain.control.jobs.export import ExportResult
    from nbtrain.ui.export_box import report_html

    (tmp_path / "tiny-q4_k_m.gguf").write_bytes(b"\0" * 2**20)
    report = _gguf_report({"q4_k_m": 20}, right=0)
    record = {"run_id": "20261206-follow-758a", "run_name": "follow", "step": 150, "method": "lora",
              "objective": "sft", "base_model": "/m/tiny-adder", "dtype": "float32", "kind": "gguf",
              "quants": ["q4_k_m"], "gguf": report}  # fmt: skip
    out = ExportResult(tmp_path, "gguf", record, ["tiny-q4_k_m.gguf"])
    rows = dict(out.summary())
    assert "precision" not in rows and rows["GGUF types"] == "q4_k_m"  # no float32 beside a q4_k_m file
    page, text = out._repr_html_(), repr(out)
    assert text.startswith(f"<export gguf of run 20261206-follow-758a in {tmp_path} (q4_k_m)>\n"), text
    for shown in (page, text):
        assert shown.count("checked on 32 prompts") == 1 and shown.count("train longer before exporting") == 1
    assert "train longer before exporting" in report_html(report)  # the export form's report too
