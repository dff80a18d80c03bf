"""A LLaMA-Factory dataset_info.json named in data: (train: the json or its folder, dataset: the name):
resolved once in the kernel into plain facts (file, columns in nbtrain's names, tags, split), every row
checked through them, and what cannot be used refused naming the cause and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nbtrain.contract.errors import ConfigError
from nbtrain.control.config.load import load_config


def write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in value))
    else:
        path.write_text(json.dumps(value))


def problems(text: str) -> str:
    with pytest.raises(ConfigError) as ei:
        load_config(text)
    return "\n".join(p.render() for p in ei.value.problems)


def config(data: str, objective: str = "sft") -> str:
    return f"model: ./tiny-llama\nobjective: {objective}\ndata:\n{data}train:\n  max_steps: 2\n"


# Our own rows, in LLaMA-Factory's shapes with columns and tags of their own.
QA = [
    {"q": f"What is {i} + 1?", "ctx": "", "a": str(i + 1), "sys": "Add.", "past": [["Hi", "Hello"]]}
    for i in range(6)
]
CHAT = [
    {
        "dialog": [
            {"speaker": "me", "text": f"Count to {i}."},
            {"speaker": "bot", "text": " ".join(map(str, range(1, i + 1)))},
        ],
        "persona": "Counter.",
    }
    for i in range(2, 8)
]  # fmt: skip
RANKED = [
    {"dialog": [{"speaker": "me", "text": f"Double {i}?"}], "good": {"speaker": "bot", "text": str(2 * i)},
     "bad": {"speaker": "bot", "text": "no"}}
    for i in range(6)
]  # fmt: skip
KTO = [{"instruction": f"Say {i}.", "output": str(i) if i % 2 else "?", "ok": bool(i % 2)} for i in range(6)]
TAGS = {"role_tag": "speaker", "content_tag": "text", "user_tag": "me", "assistant_tag": "bot"}
INFO = {
    "qa": {
        "file_name": "files/qa.jsonl",
        "columns": {"prompt": "q", "query": "ctx", "response": "a", "system": "sys", "history": "past"},
    },
    "chat": {
        "file_name": "files/chat.jsonl", "formatting": "sharegpt",
        "columns": {"messages": "dialog", "system": "persona"}, "tags": TAGS,
    },
    "ranked": {
        "file_name": "files/ranked.jsonl", "formatting": "sharegpt", "ranking": True,
        "columns": {"messages": "dialog", "chosen": "good", "rejected": "bad"}, "tags": TAGS,
    },
    "kto": {"file_name": "files/kto.jsonl", "columns": {"kto_tag": "ok"}},
    "gone": {"file_name": "files/gone.jsonl"},
    "scope": {"ms_hub_url": "someone/data"},
}  # fmt: skip


@pytest.fixture
def lf(workdir: Path) -> Path:
    folder = workdir / "lf"
    write(folder / "files" / "qa.jsonl", QA)
    write(folder / "files" / "chat.jsonl", CHAT)
    write(folder / "files" / "ranked.jsonl", RANKED)
    write(folder / "files" / "kto.jsonl", KTO)
    write(folder / "dataset_info.json", INFO)
    return folder


def test_an_alpaca_dataset_by_name_records_its_file_and_columns_in_nbtrains_names(lf: Path) -> None:
    res = load_config(config("  train: lf/dataset_info.json\n  dataset: qa\n"))
    src = res.train_data
    assert src.location == str(lf / "files" / "qa.jsonl") and src.kind == "jsonl" and src.format == "alpaca"
    assert src.columns == {
        "instruction": "q",
        "input": "ctx",
        "output": "a",
        "system": "sys",
        "history": "past",
    }
    assert src.dataset == "qa" and src.dataset_info == str(lf / "dataset_info.json") and src.tags is None
    # the config keeps the json (a resume resolves it again); the worker reads the source's facts
    assert res.config.data.train == str(lf / "dataset_info.json") and res.config.data.dataset == "qa"
    assert "dataset 'qa'" in res.notes[0]


def test_a_folder_is_read_as_its_dataset_info_and_sharegpt_tags_are_recorded(lf: Path) -> None:
    src = load_config(config("  train: lf\n  dataset: chat\n")).train_data
    assert src.format == "sharegpt" and src.tags == TAGS
    assert src.columns == {"conversations": "dialog", "system": "persona"}


def test_ranking_and_kto_entries_are_preference_and_unpaired_data(lf: Path) -> None:
    ranked = load_config(config("  train: lf/dataset_info.json\n  dataset: ranked\n", "dpo")).train_data
    assert ranked.format == "preference" and ranked.tags == TAGS
    kto = load_config(config("  train: lf/dataset_info.json\n  dataset: kto\n", "kto")).train_data
    assert kto.format == "unpaired" and kto.columns == {"kto_tag": "ok"}


def test_datasets_of_a_train_list_and_data_columns_winning_name_by_name(lf: Path) -> None:
    res = load_config(
        config(
            "  train:\n"
            "    - {path: lf/dataset_info.json, dataset: qa, weight: 2}\n"
            "    - {path: lf, dataset: chat, weight: 1, columns: {system: persona}}\n"
        )
    )
    qa, chat = res.train_sources
    assert (qa.dataset, qa.weight, chat.dataset, chat.weight) == ("qa", 2.0, "chat", 1.0)
    assert chat.tags == TAGS and chat.columns == {"conversations": "dialog", "system": "persona"}
    assert [s.path for s in res.config.data.train] == [str(lf / "dataset_info.json")] * 2  # type: ignore[union-attr]


def test_a_wrong_name_lists_the_names_with_the_closest_first(lf: Path) -> None:
    text = problems(config("  train: lf/dataset_info.json\n  dataset: chatt\n"))
    assert "has no dataset 'chatt'; did you mean 'chat'?" in text
    assert "its datasets: chat, gone, kto, qa, ranked, scope" in text and "data.dataset" in text


def test_a_missing_file_name_names_the_path_looked_for(lf: Path) -> None:
    text = problems(config("  train: lf/dataset_info.json\n  dataset: gone\n"))
    assert f"file_name 'files/gone.jsonl' is not there (looked for {lf / 'files' / 'gone.jsonl'})" in text


def test_what_nbtrain_does_not_read_is_refused_by_name(lf: Path) -> None:
    assert "(only ms_hub_url, which nbtrain does not read)" in problems(
        config("  train: lf/dataset_info.json\n  dataset: scope\n")
    )
    info = json.loads((lf / "dataset_info.json").read_text())
    info["qa"]["columns"]["videos"] = "clips"
    info["chat"]["columns"]["prompt"] = "q"
    write(lf / "dataset_info.json", info)
    assert "columns: videos is not read by nbtrain" in problems(config("  train: lf\n  dataset: qa\n"))
    text = problems(config("  train: lf\n  dataset: chat\n"))
    assert "columns: prompt is a alpaca column, and the dataset's formatting is sharegpt" in text


def test_the_json_without_a_name_and_a_name_without_the_json(lf: Path, workdir: Path) -> None:
    text = problems(config("  train: lf/dataset_info.json\n"))
    assert (
        "LLaMA-Factory's index of datasets, not rows: name the dataset" in text and "data: dataset:" in text
    )
    text = problems(config("  train: data\n  dataset: qa\n"))
    assert f"{workdir / 'data' / 'dataset_info.json'} is not there" in text


def test_rows_are_checked_through_the_entrys_columns_and_tags(lf: Path) -> None:
    bad = [*CHAT[:2], {"dialog": [{"speaker": "someone", "text": "hi"}], "persona": "x"}]
    write(lf / "files" / "chat.jsonl", bad)
    text = problems(config("  train: lf\n  dataset: chat\n"))
    assert "row 3 is not valid sharegpt data" in text and "speaker='someone' is not one of" in text


def test_the_panels_preview_reads_the_dataset_through_its_columns_and_tags(lf: Path, workdir: Path) -> None:
    from nbtrain.ui.panel import data_preview

    pv = data_preview({"model": "./tiny-llama", "data": {"train": "lf", "dataset": "chat"}}, workdir)
    assert [r.format for r in pv.rows] == ["sharegpt"] * 3 and pv.rows[0].error is None
    assert pv.rows[0].example == {
        "messages": [
            {"role": "system", "content": "Counter."},
            {"role": "user", "content": "Count to 2."},
            {"role": "assistant", "content": "1 2"},
        ]
    }
    pv = data_preview({"data": {"train": "lf", "dataset": "chatt"}}, workdir)
    assert pv.note is not None and "did you mean 'chat'?" in pv.note
