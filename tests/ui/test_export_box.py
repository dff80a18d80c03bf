"""The export form (nbtrain.ui.export_box), driven from code on a real trained run: safetensors and GGUF
exports through the same function the cell and the CLI call, progress while it works, refusals in words."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nbtrain.control.runs.run import get_run
from nbtrain.ui.export_box import ExportBox
from tests.worker.test_export_gguf import llama_cpp_ready


def _box(run_dir: Path) -> ExportBox:
    return ExportBox(get_run(run_dir))


def test_the_form_suggests_a_folder_per_format_and_keeps_one_the_user_typed(
    run_copy: Path, tmp_path: Path
) -> None:
    box = _box(run_copy)
    assert box.to.value == "exports/tuned" and box.quant_row.layout.display == "none"
    box.format.value = "gguf"
    assert box.to.value == "exports/tuned-gguf" and box.quant_row.layout.display is None
    assert box.request() == {"to": "exports/tuned-gguf", "merge": True, "format": "gguf",
                             "quant": ["f16", "q8_0", "q4_k_m"]}  # fmt: skip
    box.to.value = "my-model"
    box.format.value = "hf"
    assert box.to.value == "my-model"
    (tmp_path / "exports" / "tuned").mkdir(parents=True)
    (tmp_path / "exports" / "tuned" / "f.txt").write_text("mine")
    assert _box(run_copy).to.value == "exports/tuned-2"  # a taken folder is not suggested


def test_a_lora_run_offers_its_adapter_alone_and_a_gguf_adapter_keeps_to_lora_types(run_copy: Path) -> None:
    box = _box(run_copy)
    assert box.merge_row.layout.display is None and not box.merge.disabled
    box.format.value = "gguf"
    box.merge.value = False
    box.quants = ["q8_0", "q4_k_m"]
    assert box.request()["quant"] == ["q8_0"] and box.request()["merge"] is False


@pytest.mark.slow
def test_safetensors_export_from_the_box_writes_a_loadable_model_and_says_how(run_copy: Path) -> None:
    box = _box(run_copy)
    started = time.monotonic()
    box.export_button.click()
    assert time.monotonic() - started < 2, "the export must not block the kernel"
    assert box.busy and box.export_button.disabled and "exporting run" in box.status.value
    assert box.wait(300)
    assert box.error is None, box.error
    assert box.result is not None and box.result.kind == "merged"
    target = run_copy.parent.parent / "exports" / "tuned"
    assert box.result.dir == target.resolve() and (target / "config.json").is_file()
    assert (
        "AutoModelForCausalLM.from_pretrained(" in box.report.value
        and str(target.resolve()) in box.report.value
    )
    assert not box.export_button.disabled


def test_a_non_empty_folder_is_refused_in_the_box_and_nothing_is_written(
    run_copy: Path, tmp_path: Path
) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "f.txt").write_text("mine")
    box = _box(run_copy)
    box.to.value = "taken"
    box.export_button.click()
    assert box.wait(60)
    assert box.error is not None and "is not empty" in box.error and "overwrite" in box.error
    assert "nbtrain-export-error" in box.status.value and box.result is None
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["f.txt"]
    assert not (run_copy / "logs" / "export.log").exists()  # nothing was started
    assert not box.export_button.disabled
    box.format.value = "gguf"
    box.quants = []
    box.export_button.click()
    assert box.error is not None and box.error.startswith("pick at least one GGUF type")
    box.to.value = ""
    box.export_button.click()
    assert box.error == "give a folder to export to (a new or empty one)"


def test_a_run_without_trained_weights_says_so_before_anything(run_copy: Path) -> None:
    import shutil

    shutil.rmtree(run_copy / "output")
    box = _box(run_copy)
    assert box.error is not None and "no trained weights yet" in box.error


@pytest.mark.slow
def test_gguf_export_from_the_box_shows_progress_then_the_check(run_copy: Path) -> None:
    llama_cpp_ready()
    box = _box(run_copy)
    box.format.value = "gguf"
    box.quants = ["f16", "q8_0"]
    seen: set[str] = set()
    box.status.observe(lambda c: seen.add(c["new"]), names="value")
    box.export_button.click()
    assert box.wait(600)
    assert box.error is None, box.error
    assert box.result is not None and box.result.kind.startswith("gguf")
    out = run_copy.parent.parent / "exports" / "tuned-gguf"
    assert sorted(p.name for p in out.glob("*.gguf")) == ["tuned-f16.gguf", "tuned-q8_0.gguf"], list(
        out.iterdir()
    )
    # the job's own lines went by in the status while it worked, then the report showed below
    said = [s for s in seen if "converting" in s or "quantis" in s or "checking" in s]
    assert said, seen
    assert any(line.startswith("nbtrain export:") for line in box.lines)
    assert "<td><b>f16</b></td>" in box.report.value and "<td><b>q8_0</b></td>" in box.report.value
    assert "4/4" in box.report.value  # llama.cpp's answers are transformers', on each of the 4 prompts
    assert "nbtrain-export-verdict'><b>f16 matches the full model on 4/4, q8_0 on " in box.report.value
    assert "ollama create" in box.report.value
