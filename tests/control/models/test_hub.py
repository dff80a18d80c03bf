"""Hub models and datasets, against a local server that speaks the Hub's HTTP API (tests/hubserver.py),
with the real huggingface_hub / transformers / datasets clients pointed at it through HF_ENDPOINT."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbtrain
from nbtrain.contract.errors import ConfigError
from nbtrain.control.models import hub
from nbtrain.control.prepare import estimate_table, prepare
from nbtrain.examples import write_dataset
from tests.hubserver import HubServer, Repo, files_of


@pytest.fixture(scope="module")
def server(
    tiny_model: Path, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubServer]:
    model = files_of(tiny_model)
    bigger = json.loads(model["config.json"])
    bigger["num_hidden_layers"] = 8
    data = tmp_path_factory.mktemp("hubdata")
    write_dataset(data / "add.jsonl", n=40)
    good = (data / "add.jsonl").read_bytes()
    lines = good.decode().splitlines(keepends=True)
    lines[6] = json.dumps({"messages": [{"role": "user"}]}) + "\n"  # row 7: a message without content
    test_rows = b"".join(good.splitlines(keepends=True)[:5])
    srv = HubServer(
        models={
            "org/tiny": Repo({"main": model, "big": {**model, "config.json": json.dumps(bigger).encode()}}),
            "org/gated": Repo({"main": model}, gated=True),
            "org/private": Repo({"main": model}, private=True),
            # a GGUF repo as they are on the Hub: no config.json, the model in one .gguf file
            "org/smol-gguf": Repo(
                {"main": {"README.md": b"# SmolLM2 GGUF", GGUF: smollm2_gguf.read_bytes()}}
            ),
        },
        datasets={
            "org/add": Repo({"main": {"data/train.jsonl": good, "data/test.jsonl": test_rows}}),
            # a test split of 4 shards, together half the tiny weights' size: a non-streamed load downloads
            # every split (the client writes a file in one piece below 10 MB: bytes grow file by file)
            "org/add-big": Repo(
                {
                    "main": {
                        "data/train-00000-of-00001.jsonl": good,
                        **{f"data/test-0000{i}-of-00004.jsonl": good * (14 + i) for i in range(4)},
                    }
                }
            ),
            "org/bad": Repo({"main": {"train.jsonl": "".join(lines).encode()}}),
            "org/gated-data": Repo({"main": {"train.jsonl": good}}, gated=True),
        },
    ).start()
    yield srv
    srv.stop()


@pytest.fixture
def hub_env(
    server: HubServer, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> HubServer:
    """HF_ENDPOINT at the local server, an HF cache of this module's own, no token, online."""
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    cache = tmp_path_factory.getbasetemp() / "hf-hub-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(cache.parent / "hf-home"))  # no token file of the user's
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    hub._configs.clear()  # what an earlier test fetched under other settings
    return server


GGUF = "smollm2-135m-instruct-q4_1.gguf"


@pytest.mark.slow
def test_a_hub_repos_gguf_file_is_checked_then_downloaded_converted_and_trained(
    hub_env: HubServer, workdir: Path, smollm2: Path
) -> None:
    with pytest.raises(ConfigError, match=r"model org/smol-gguf has no file 'other\.gguf'"):
        prepare(lora_config("org/smol-gguf", extra="gguf_file: other.gguf\n"))
    cfg = lora_config("org/smol-gguf", extra=f"gguf_file: {GGUF}\n")
    before = prepare(cfg)
    assert before.plan.estimate is None and before.gguf is not None and before.gguf["dtype"] == "float32"
    assert any("when the worker has downloaded it" in r for r in before.plan.reasons)
    run = nbtrain.finetune(cfg)
    run.wait(timeout=600)
    assert run.status().state == "completed", run.status().error
    adapter = json.loads((run.dir / "output" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(smollm2)  # the same bytes: the machine's conversion
    after = prepare(cfg)  # the file is in the HF cache now: its header gives the estimate
    assert after.plan.estimate is not None and after.plan.estimate["total_params"] == 134_515_008


def lora_config(model: str, train: str = "data/add.jsonl", extra: str = "") -> str:
    return f"""\
model: {model}
method: lora
data: {{train: {train}}}
train: {{max_steps: 2, per_device_train_batch_size: 2, logging_steps: 1}}
{extra}"""


def test_the_estimate_of_a_hub_id_equals_that_of_the_same_model_as_a_directory(
    hub_env: HubServer, workdir: Path
) -> None:
    local, local_table = estimate_table(lora_config("./tiny-llama"))
    remote, remote_table = estimate_table(lora_config("org/tiny"))
    assert remote.plan.estimate is not None and local.plan.estimate is not None

    def of_the_model(d: dict) -> dict:  # not what the machine had free at that moment (it moves)
        return {k: v for k, v in d.items() if k not in ("usable_bytes", "reason", "why")}

    assert of_the_model(remote.plan.estimate) == of_the_model(local.plan.estimate)
    assert [of_the_model(r) for r in remote_table] == [of_the_model(r) for r in local_table] and remote_table
    assert remote.resolved.model_kind == "hub"


def test_revision_selects_the_config_of_that_revision(hub_env: HubServer, workdir: Path) -> None:
    main = prepare(lora_config("org/tiny")).plan.estimate
    big = prepare(lora_config("org/tiny", extra="revision: big\n"))
    assert big.resolved.config.revision == "big"
    assert main is not None and big.plan.estimate is not None
    assert big.plan.estimate["total_params"] > main["total_params"]
    with pytest.raises(ConfigError) as e:
        prepare(lora_config("org/tiny", extra="revision: nope\n"))
    assert "org/tiny has no revision 'nope'" in str(e.value)


def test_a_gated_repo_without_a_token_is_refused_before_a_run_directory_exists(
    hub_env: HubServer, workdir: Path
) -> None:
    with pytest.raises(ConfigError) as e:
        nbtrain.finetune(lora_config("org/gated"))
    message = str(e.value)
    assert "org/gated is gated" in message and "HF_TOKEN" in message and "hf auth login" in message
    assert f"{hub_env.url}/org/gated" in message
    runs = workdir / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_a_missing_or_private_repo_names_the_id_and_a_close_match(hub_env: HubServer, workdir: Path) -> None:
    with pytest.raises(ConfigError) as e:
        prepare(lora_config("org/tinny"))
    assert "model org/tinny was not found on the Hub" in str(e.value)
    assert "did you mean 'org/tiny'?" in str(e.value)
    with pytest.raises(ConfigError) as e:
        prepare(lora_config("org/private"))
    assert "org/private was not found" in str(e.value) and "HF_TOKEN" in str(e.value)


def test_a_hub_dataset_with_a_bad_row_7_is_refused_naming_row_7(hub_env: HubServer, workdir: Path) -> None:
    with pytest.raises(ConfigError) as e:
        nbtrain.finetune(lora_config("./tiny-llama", train="org/bad"))
    assert "org/bad (train.jsonl): row 7 is not valid messages data" in str(e.value)
    runs = workdir / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_hub_dataset_rows_are_checked_for_the_split_and_data_files_asked(
    hub_env: HubServer, workdir: Path
) -> None:
    prep = prepare(lora_config("./tiny-llama", train="org/add"))
    assert (prep.resolved.train_data.kind, prep.resolved.train_data.format) == ("hub", "messages")
    assert prep.resolved.train_data.sample_rows == 40
    test = prepare(lora_config("./tiny-llama", train="[{path: org/add, split: test}]"))
    assert test.resolved.train_data.sample_rows == 5
    only = prepare(lora_config("./tiny-llama", train="[{path: org/add, data_files: 'data/test*'}]"))
    assert only.resolved.train_data.sample_rows == 5
    assert only.to_dict()["data"]["sources"][0]["data_files"] == "data/test*"
    with pytest.raises(ConfigError) as e:
        prepare(lora_config("./tiny-llama", train="[{path: org/add, split: validation}]"))
    assert "dataset org/add has no split 'validation'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        prepare(lora_config("./tiny-llama", train="org/gated-data"))
    assert "dataset org/gated-data is gated" in str(e.value) and "HF_TOKEN" in str(e.value)


def test_a_dataset_info_entrys_hf_hub_url_and_split_are_the_hub_dataset_read(
    hub_env: HubServer, workdir: Path
) -> None:
    info = {"add": {"hf_hub_url": "org/add", "split": "test"}, "nothing": {"hf_hub_url": "org/none"}}
    (workdir / "dataset_info.json").write_text(json.dumps(info))
    prep = prepare(lora_config("./tiny-llama", train="dataset_info.json, dataset: add"))
    src = prep.to_dict()["data"]["sources"][0]
    assert (src["location"], src["kind"], src["split"], src["format"]) == (
        "org/add",
        "hub",
        "test",
        "messages",
    )
    assert src["sample_rows"] == 5 and src["dataset"] == "add"
    with pytest.raises(ConfigError) as e:
        prepare(lora_config("./tiny-llama", train="dataset_info.json, dataset: nothing"))
    assert "org/none" in str(e.value)


def test_an_unreachable_hub_leaves_a_reason_instead_of_an_estimate(
    hub_env: HubServer, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    prep = prepare(lora_config("org/never-downloaded"))
    assert prep.plan.estimate is None
    assert any("could not be reached" in r and "not in the local cache" in r for r in prep.plan.reasons)


def test_offline_without_the_model_cached_says_offline_and_how_to_fix_it(
    hub_env: HubServer, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as e:
        prepare(lora_config("org/private"))
    assert "HF_HUB_OFFLINE" in str(e.value) and "hf download org/private" in str(e.value)


@pytest.mark.slow
def test_a_gated_hub_model_trains_with_a_token_that_never_reaches_the_run_dir_then_offline_from_the_cache(
    hub_env: HubServer, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", hub_env.token)
    run = nbtrain.finetune(lora_config("org/gated", train="org/add"))
    assert run.wait(timeout=600).state == "completed"
    assert any(
        m == "GET" and p.startswith("/org/gated/resolve/") and p.endswith("/model.safetensors")
        for m, p in hub_env.requests
    )  # the worker downloaded the weights through HF_ENDPOINT
    leaked = [p for p in run.dir.rglob("*") if p.is_file() and hub_env.token.encode() in p.read_bytes()]
    assert leaked == []

    # Offline, from what that run left in the cache: the estimate and a run still work.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    served = len(hub_env.requests)
    prep = prepare(lora_config("org/gated"))
    assert prep.plan.estimate is not None
    assert any("HF_HUB_OFFLINE" in n for n in prep.resolved.notes)
    offline = nbtrain.finetune(lora_config("org/gated"))
    assert offline.wait(timeout=600).state == "completed"
    assert len(hub_env.requests) == served  # nothing asked of the Hub


@pytest.mark.slow
def test_a_hub_models_download_shows_in_the_status_with_growing_bytes_then_it_trains(
    hub_env: HubServer, workdir: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    import time

    monkeypatch.setenv("HF_HUB_CACHE", str(workdir / "fresh-cache"))  # nothing of org/tiny cached yet
    weights = (tiny_model / "model.safetensors").stat().st_size
    monkeypatch.setattr(hub_env, "delay_per_byte", 2.5 / weights)  # the weights take ~2.5 s to arrive
    run = nbtrain.finetune(lora_config("org/tiny", train="org/add-big"))
    seen: list[tuple[str | None, int | None, int | None]] = []
    deadline = time.monotonic() + 300
    while (st := run.status()).state in ("queued", "starting") and time.monotonic() < deadline:
        d = st.download or {}
        seen.append((st.phase, d.get("done"), d.get("total")))
        if st.phase == "downloading model":
            assert st.describe().startswith("starting: downloading model org/tiny ") and "/s" in st.describe()
        if st.phase == "downloading data":
            assert (
                st.describe().startswith("starting: downloading data org/add-big ") and "/s" in st.describe()
            )
        time.sleep(0.1)
    assert run.wait(timeout=300).state == "completed", run.logs(30)
    done = [d for phase, d, _ in seen if phase == "downloading model" and d is not None]
    assert done == sorted(done) and any(0 < d < weights for d in done), seen  # bytes seen arriving
    totals = {t for phase, _, t in seen if phase == "downloading model"}
    assert totals and all(t is not None and t >= weights for t in totals), seen  # the weights, and the rest
    # then the dataset's files, every split (what load_dataset reads then comes from the cache)
    big = sum(len(b) for b in hub_env.datasets["org/add-big"].revisions["main"].values())
    data = [(d, t) for phase, d, t in seen if phase == "downloading data"]
    assert data and all(t == big for _, t in data), seen
    assert any(d is not None and 0 < d < t for d, t in data), data
    fetched = [
        p for m, p in hub_env.requests if m == "GET" and p.startswith("/datasets/org/add-big/resolve/")
    ]
    # the worker's, at the resolved commit, each file once (load_dataset read them from the cache); the
    # kernel's check of the first rows reads the branch
    worker = [p for p in fetched if "/resolve/main/" not in p]
    assert len(worker) == len(set(worker)) == 5, fetched
    assert any(phase == "loading model" for phase, _, _ in seen), seen  # then the weights load
    assert run.status().phase_text() is None  # phases end with the start
