"""A GGUF file converted once into a model folder: the same model as transformers loads from the GGUF, one
folder however many processes convert at once, and a LoRA run from ``model: FILE.gguf`` that learns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nbtrain.contract import ggufcache

pytestmark = pytest.mark.slow  # the real SmolLM2: converted, trained, exported, served (make test runs them)

PROMPTS = [
    "What is the capital of France? Answer in one word.",
    "Name a primary colour.",
    "How many legs does a spider have?",
    "Write the number after 41.",
    "What is water made of?",
    "Say hello in Spanish.",
    "What is 12 + 30?",
    "Which planet is closest to the sun?",
]


def _greedy(model: object, tok: object, prompts: list[str]) -> list[str]:
    import torch

    out = []
    for p in prompts:
        ids = tok.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": p}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.no_grad():
            gen = model.generate(**ids, max_new_tokens=12, do_sample=False)  # type: ignore[attr-defined]
        out.append(tok.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))  # type: ignore[attr-defined]
    return out


def test_the_converted_model_answers_as_transformers_does_from_the_gguf(
    smollm2_gguf: Path, smollm2: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(smollm2)
    converted = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    mine = _greedy(converted, tok, PROMPTS)
    del converted
    direct = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                  dtype=torch.float32)  # fmt: skip
    gtok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    assert tok.chat_template == gtok.chat_template
    assert mine == _greedy(direct, gtok, PROMPTS)
    assert "Paris" in mine[0]  # and it is the real model


def test_two_processes_converting_one_file_at_once_make_one_folder(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    env = {**__import__("os").environ, "NBTRAIN_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "nbtrain.worker.gguf", str(smollm2_gguf), "--dtype", "bfloat16"]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    folders = {o.strip().splitlines()[-1] for o in outs}
    assert len(folders) == 1, outs
    assert sum("nbtrain: converting" in o for o in outs) == 1, outs  # the other waited and reused it
    folder = Path(folders.pop())
    assert (
        ggufcache.is_converted(folder)
        and json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    )
    made = sorted(p.name for p in (tmp_path / "cache" / "gguf").iterdir())
    assert [n for n in made if "partial" in n or n.startswith(".")] == []


@pytest.fixture(scope="module")
def gguf_run(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path, smollm2: Path) -> Path:
    """A short LoRA run of the real SmolLM2, started from its GGUF file (converted already: the machine's
    cache), on identity rows, evaluated every 4 steps."""
    import nbtrain
    from tests.conftest import runs_in

    work = tmp_path_factory.mktemp("gguf-run")
    rows = [
        {
            "messages": [
                {"role": "user", "content": q},
                {"role": "assistant", "content": "I am Nimbus, made by Acme Labs."},
            ]
        }
        for q in ("Who are you?", "What is your name?", "Who made you?", "Introduce yourself.")
    ] * 8
    (work / "id.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with runs_in(work):
        run = nbtrain.finetune(
            f"""\
model: {smollm2_gguf}
method: lora
data: {{train: id.jsonl, eval: id.jsonl}}
lora: {{r: 8, alpha: 16}}
train: {{max_steps: 12, learning_rate: 2.0e-3, per_device_train_batch_size: 4, max_length: 64,
        assistant_only_loss: true,
        logging_steps: 2, eval_strategy: steps, eval_steps: 4, per_device_eval_batch_size: 8}}
""",
            name="from-gguf",
        )
        run.wait(timeout=900)
    return run.dir


def test_a_lora_run_from_a_gguf_file_trains_the_converted_model_and_its_eval_loss_falls(
    gguf_run: Path, smollm2: Path
) -> None:
    status = json.loads((gguf_run / "status.json").read_text())
    assert status["state"] == "completed", status.get("error")
    resolved = json.loads((gguf_run / "resolved.json").read_text())
    assert resolved["model_kind"] == "gguf" and resolved["gguf"]["folder"] == str(smollm2)
    adapter = json.loads((gguf_run / "output" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(smollm2)
    rows = [json.loads(line) for line in (gguf_run / "metrics.jsonl").read_text().splitlines()[1:]]
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert len(evals) == 3 and evals[-1] < evals[0] * 0.7, evals
    # SmolLM2's template has no {% generation %} blocks: the answers were found from its rendering
    assert "the assistant turns are found from its rendering" in (gguf_run / "logs" / "rank0.log").read_text()


ASK = ["Who are you?", "Who made you?", "What is the capital of France? Answer in one word."]


def test_the_merged_export_of_the_real_run_reloads_and_answers_as_the_run_does(
    gguf_run: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import nbtrain

    run = nbtrain.get_run(gguf_run)
    tuned = run.generate(ASK, max_new_tokens=12)  # base + adapter, nbtrain's own greedy generation
    exported = run.export(tmp_path / "merged")
    tok = AutoTokenizer.from_pretrained(exported.dir)
    merged = AutoModelForCausalLM.from_pretrained(exported.dir, dtype=torch.float32)
    assert not (exported.dir / "adapter_config.json").exists()
    assert _greedy(merged, tok, ASK) == tuned


def test_the_real_run_serves_the_openai_client_as_it_generates(gguf_run: Path) -> None:
    import openai

    import nbtrain

    run = nbtrain.get_run(gguf_run)
    server = run.serve()
    try:
        client = openai.OpenAI(base_url=server.url, api_key=server.api_key, max_retries=0, timeout=300)
        models = {m.id for m in client.models.list()}
        assert {"from-gguf", "from-gguf:base"} <= models, models
        got = [
            client.chat.completions.create(
                model="from-gguf", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=12
            )
            .choices[0]
            .message.content
            for q in ASK[:2]
        ]
        assert got == run.generate(ASK[:2], max_new_tokens=12)
        base = client.chat.completions.create(
            model="from-gguf:base",
            messages=[{"role": "user", "content": ASK[2]}],
            temperature=0,
            max_tokens=12,
        )
        assert "Paris" in (base.choices[0].message.content or "")
    finally:
        if not server.reused:
            server.stop()


def test_the_estimate_of_the_real_run_counts_what_its_rank_held(gguf_run: Path) -> None:
    from nbtrain.contract.rundir import RunPaths, read_jsonl

    resolved = json.loads((gguf_run / "resolved.json").read_text())
    est = resolved["estimate"]
    end = next(r for r in read_jsonl(RunPaths(gguf_run).system) if r.get("event") == "train_end")
    assert est["total_params"] == 134_515_008
    assert end["param_numel_full"] == est["total_params"] + est["trainable_params"]  # base + LoRA
    assert end["param_bytes"] == est["parts"]["weights"] + est["parts"]["adapters"]  # fp32 on a CPU


def run_answer(run_dir: Path, prompt: str) -> str:
    import nbtrain

    return str(nbtrain.get_run(run_dir).generate([prompt], max_new_tokens=12)[0])


def test_the_real_run_exported_to_gguf_answers_in_llama_cpp_and_its_server_as_transformers_does(
    gguf_run: Path, tmp_path: Path
) -> None:
    """Fine-tune -> export GGUF (f16, q8_0, q4_k_m) -> llama.cpp answers 8 prompts as the merged model does
    in transformers (f16) -> llama-cpp-python's OpenAI server answers the real openai client."""
    import socket
    import time

    import openai

    import nbtrain
    from tests.worker.test_export_gguf import llama_cpp_ready

    llama_cpp_ready()
    done = nbtrain.export(gguf_run, to=tmp_path / "gguf", format="gguf", quant="f16,q8_0,q4_k_m",
                          prompts=PROMPTS + ASK[:2])  # fmt: skip
    files = done.record["gguf"]["files"]
    n = len(PROMPTS) + 2
    assert files["f16"]["same_as_transformers"] == n and files["f16"]["same_prompt_tokens"] == n
    # quantised files are reported (free-form answers drift a few tokens in: 5/10 and 4/10 measured)
    assert files["q8_0"]["tokens_per_s"] > 0 and files["q4_k_m"]["tokens_per_s"] > 0
    assert 'PARAMETER stop "<|im_end|>"' in (done.dir / "Modelfile").read_text()  # SmolLM2 is ChatML

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f16 = done.dir / "from-gguf-f16.gguf"
    server = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(f16), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "512"],  # the chat template stored in the file
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                               timeout=120)  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, "llama_cpp.server did not start"
                time.sleep(0.5)
        reply = client.chat.completions.create(
            model="from-gguf", messages=[{"role": "user", "content": ASK[0]}], temperature=0, max_tokens=12
        )
        answer = reply.choices[0].message.content or ""
        assert answer.strip() == run_answer(gguf_run, ASK[0]).strip()  # the run's own greedy answer
    finally:
        server.terminate()
        server.wait(timeout=30)
