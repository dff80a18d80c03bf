"""One fit rule and one validation entry: what ``nbtrain.estimate``'s table calls fitting is exactly what
``prepare`` plans as fitting (and ``start`` accepts), and ``validate`` reports exactly what stops a launch."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbtrain.contract.errors import ConfigError, NbtrainError
from nbtrain.control.memory import GiB
from nbtrain.control.prepare import launch_refusal, prepare, validate
from nbtrain.control.start import start
from nbtrain.examples import write_dataset
from nbtrain.hardware import GPU, Hardware
from nbtrain.ui.estimate_chart import estimate

CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "model_configs"


def gpus(name: str, total_gib: float, free_gib: float, n: int, *, ram: float, ram_free: float) -> Hardware:
    cards = [GPU(i, name, int(total_gib * GiB), int(free_gib * GiB), (8, 0)) for i in range(n)]
    return Hardware(gpus=cards, cpu_count=32, ram_total=int(ram * GiB), ram_available=int(ram_free * GiB))


MACHINES = {
    "one 24 GiB card": gpus("NVIDIA GeForce RTX 4090", 24, 23.5, 1, ram=64, ram_free=60),
    "four 80 GiB cards, little host RAM": gpus("NVIDIA A100-SXM4-80GB", 80, 79, 4, ram=96, ram_free=90),
    "a card another process half fills": gpus("NVIDIA A100-SXM4-80GB", 80, 38, 2, ram=512, ram_free=500),
    "no GPU, busy RAM": Hardware(cpu_count=2, ram_total=24 * GiB, ram_available=9 * GiB),
    "no GPU, 64 GiB RAM, 20 free": Hardware(cpu_count=8, ram_total=64 * GiB, ram_available=20 * GiB),
}
CASES = [
    ("one 24 GiB card", "Meta-Llama-3-8B"),
    ("four 80 GiB cards, little host RAM", "Llama-2-13b"),
    ("a card another process half fills", "Qwen2.5-7B"),
    ("no GPU, busy RAM", "Qwen2.5-0.5B"),
    ("no GPU, 64 GiB RAM, 20 free", "Meta-Llama-3-8B"),
]


def config(model: str, method: str, strategy: str = "none", offload: str = "none", processes: int = 1) -> str:
    return (
        f"model: {CONFIGS / model}\nmethod: {method}\ndata: {{train: data/add.jsonl}}\n"
        f"train: {{max_length: 512, per_device_train_batch_size: 2}}\n"
        f"distributed: {{strategy: {strategy}, offload: {offload}, num_processes: {processes}}}\n"
    )


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "data" / "add.jsonl")


@pytest.mark.parametrize(("machine", "model"), CASES)
def test_prepare_accepts_exactly_the_rows_the_estimate_table_marks_as_fitting(
    data: Path, machine: str, model: str
) -> None:
    hw = MACHINES[machine]
    table = estimate(config(model, "lora"), hardware=hw).table
    assert table and any(r["fits"] for r in table) and any(not r["fits"] for r in table), (
        "each case should hold rows of both kinds"
    )
    for row in table:
        text = config(model, row["method"], row["strategy"], row["offload"], row["world_size"])
        prep = prepare(text, hardware=hw)
        label = f"{row['method']} {row['strategy']}+{row['offload']} x{row['world_size']}"
        assert prep.plan.estimate is not None
        assert prep.plan.estimate["per_device_bytes"] == row["per_device_bytes"], label
        assert prep.plan.fits == row["fits"], f"{label}: table says {row['why']!r}"
        problems = validate(text, hardware=hw)
        if row["fits"]:
            assert launch_refusal(prep) is None and problems == [], label
        else:
            refusal = launch_refusal(prep)
            assert refusal is not None and refusal.startswith(f"not started: {row['reason']}"), label
            assert [p.message for p in problems] == [refusal], label


def test_start_refuses_a_row_that_does_not_fit_with_the_tables_reason(data: Path) -> None:
    hw = MACHINES["one 24 GiB card"]
    row = next(r for r in estimate(config("Meta-Llama-3-8B", "full"), hardware=hw).table if not r["fits"])
    prep = prepare(config("Meta-Llama-3-8B", row["method"], row["strategy"], row["offload"], 1), hardware=hw)
    with pytest.raises(NbtrainError) as e:
        start(prep)
    assert str(e.value).startswith(f"not started: {row['reason']}")


# ------------------------------------------------------------------------------------ one validation


def tiny(model: Path, objective: str, train: str, extra: str = "") -> str:
    return (
        f"model: {model}\nobjective: {objective}\ndata: {{train: data/d.jsonl}}\n"
        f"train: {{max_steps: 2, {train}}}\n{extra}"
    )


@pytest.mark.parametrize(
    ("objective", "fmt", "train", "extra", "message"),
    [
        ("kto", "unpaired", "per_device_train_batch_size: 1", "", "KTO estimates its KL term"),
        (
            "grpo",
            "prompt",
            "per_device_train_batch_size: 3, num_generations: 2",
            "rewards: [format_reward]\n",
            "must be a multiple of num_generations (2)",
        ),
    ],
)
def test_validate_reports_what_only_planning_finds_as_prepare_raises_it(
    workdir: Path, objective: str, fmt: str, train: str, extra: str, message: str
) -> None:
    write_dataset(workdir / "data" / "d.jsonl", fmt, 16)
    text = tiny(workdir / "tiny-llama", objective, train, extra)
    problems = validate(text)
    with pytest.raises(ConfigError) as e:
        prepare(text)
    assert problems == list(e.value.problems)
    assert any(message in p.message for p in problems)


def test_validate_is_empty_exactly_when_the_config_launches(workdir: Path) -> None:
    write_dataset(workdir / "data" / "d.jsonl", "unpaired", 16)
    text = tiny(workdir / "tiny-llama", "kto", "per_device_train_batch_size: 2")
    assert validate(text) == []
    assert launch_refusal(prepare(text)) is None


def test_validate_reports_the_presets_memory_cap(workdir: Path) -> None:
    (workdir / "nbtrain.lab.yaml").write_text("max_memory_gb: 0.001\n")
    write_dataset(workdir / "data" / "d.jsonl", "messages", 16)
    text = tiny(workdir / "tiny-llama", "sft", "per_device_train_batch_size: 2")
    problems = validate(text)
    with pytest.raises(ConfigError) as e:
        prepare(text)
    assert problems == list(e.value.problems)
    assert any("rule 'max_memory_gb'" in p.message for p in problems)


def test_prepare_reads_the_models_config_json_once_for_every_stage(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.control.plan import facts

    reads: list[str] = []
    real = facts.load_model_config

    def counted(model: str, *args: object) -> object:
        reads.append(str(model))
        return real(model, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(facts, "load_model_config", counted)
    monkeypatch.chdir(data.parent.parent)
    machine = gpus("NVIDIA A100-SXM4-80GB", 80, 79, 2, ram=512, ram_free=500)
    prep = prepare(config("Qwen2.5-7B", "full", "zero3", "optimizer", processes=2), hardware=machine)
    assert prep.memory() is not None and prep.plan.strategy == "zero3"  # plan, vision check, estimate
    assert reads == [str(CONFIGS / "Qwen2.5-7B")]


def test_a_schema_problem_a_preset_violation_and_a_plan_that_does_not_fit_come_in_one_error(
    workdir: Path,
) -> None:
    """prepare raises once, with every stage's problems where the earlier stages let the later ones look:
    the schema's (the key left out, the rest planned), the course preset's, and the fit rule's verdict."""
    from nbtrain.control.config.preset import PRESET_FILE
    from tests.conftest import lora_yaml

    (workdir / PRESET_FILE).write_text("methods: [qlora]\n", encoding="utf-8")
    text = lora_yaml(3).replace("  logging_steps: 1\n", "  logging_steps: 1\nlora: {r: big}\n")
    tiny_ram = Hardware(cpu_count=2, ram_total=1 * GiB, ram_available=2**20)  # 1 MiB free: nothing fits
    with pytest.raises(ConfigError) as e:
        prepare(text, hardware=tiny_ram)
    said = {p.path: p.message for p in e.value.problems}
    assert "big" in said["lora.r"]  # the schema's
    assert "'lora' is not allowed" in said["method"] and "rule 'methods'" in said["method"]  # the preset's
    assert said[""].startswith("it would not fit: ") and "RAM" in said[""]  # the fit rule's
    assert len(e.value.problems) == 3
    # alone, a plan that does not fit is still a plan (a dry run shows it; start refuses it)
    (workdir / PRESET_FILE).unlink()
    prep = prepare(lora_yaml(3), hardware=tiny_ram)
    assert not prep.plan.fits and launch_refusal(prep) is not None
