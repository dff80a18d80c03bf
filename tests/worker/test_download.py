"""Which files of a Hub revision the worker fetches before loading, and how a starting run's phase reads.
The download itself (bytes growing in status.json) runs against the local Hub in
tests/control/models/test_hub.py."""

from __future__ import annotations

from nbtrain.control.runs.run import RunStatus
from nbtrain.worker.download import wanted

REPO = {
    "config.json": 700,
    "generation_config.json": 200,
    "tokenizer.json": 28_000,
    "tokenizer_config.json": 190,
    "chat_template.jinja": 260,
    "model-00001-of-00002.safetensors": 5 * 10**9,
    "model-00002-of-00002.safetensors": 4 * 10**9,
    "model.safetensors.index.json": 30_000,
    "pytorch_model.bin": 9 * 10**9,
    "model.gguf": 4 * 10**9,
    "onnx/model.onnx": 9 * 10**9,
    "original/consolidated.00.pth": 9 * 10**9,
    "modeling_custom.py": 5000,
    "README.md": 3000,
}


def test_safetensors_are_fetched_instead_of_the_bin_and_other_formats_are_not() -> None:
    got = wanted(REPO, trust_remote_code=False)
    assert sorted(got) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sum(got.values()) < 9.1 * 10**9  # one copy of the weights


def test_the_bin_weights_when_there_are_no_safetensors_and_code_only_when_trusted() -> None:
    old = {k: v for k, v in REPO.items() if not k.endswith(".safetensors")}
    assert "pytorch_model.bin" in wanted(old, trust_remote_code=False)
    assert "modeling_custom.py" not in wanted(REPO, trust_remote_code=False)
    assert "modeling_custom.py" in wanted(REPO, trust_remote_code=True)


def test_a_starting_runs_phase_reads_as_bytes_and_rate_and_ends_with_the_start() -> None:
    download = {"repo": "org/big", "done": 3.1e9, "total": 15.2e9, "rate": 40e6, "files": 9}
    st = RunStatus("starting", phase="downloading model", download=download)
    assert st.describe() == "starting: downloading model org/big 3.1 / 15.2 GB, 40.0 MB/s"
    small = RunStatus("starting", phase="downloading model", download={**download, "done": 2e5, "total": 6e5})
    assert "downloading model org/big 200 / 600 kB, 40.0 MB/s" in small.describe()
    data = RunStatus("starting", phase="downloading data", download={**download, "repo": "org/ds"})
    assert data.describe() == "starting: downloading data org/ds 3.1 / 15.2 GB, 40.0 MB/s"
    assert RunStatus("starting", phase="loading model").describe() == "starting: loading model"
    running = RunStatus("running", step=3, max_steps=10, phase="loading model")
    assert running.describe() == "running (step 3/10)"
