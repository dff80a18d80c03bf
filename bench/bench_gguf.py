"""GGUF export of the real SmolLM2-135M: export time and size per type, and generation speed in llama.cpp
(llama-cpp-python's OpenAI server) against nbtrain's own server, on the same prompts and machine.

- The run: a short LoRA run of SmolLM2-135M-Instruct (bench/peers.lora_job, 4 steps): what is exported.
- Export: ``nbtrain.export(run, format="gguf", quant=[f16, q8_0, q4_k_m])`` from the kernel's side (the
  whole job: merge, convert once, quantise twice, check each file on 8 prompts), then the same export
  again (the conversion reused): seconds and bytes per file.
- Generation: 8 prompts, greedy, 64 new tokens each, one client, through the real ``openai`` client
  against each server: nbtrain's (``run.serve()``, the merged model in transformers, fp32) and
  ``python -m llama_cpp.server`` on each GGUF file. Tokens/s: completion tokens over the wall time of
  the 8 requests, after one request to warm each server.

    python bench/bench_gguf.py              # writes bench/results/gguf.json
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "gguf.json"

from bench.peers import CHAT_PROMPTS, lora_config  # noqa: E402

PROMPTS = CHAT_PROMPTS[:8]
QUANTS = ["f16", "q8_0", "q4_k_m"]


def tokens_per_s(client: Any, model: str) -> dict[str, float]:
    def ask(p: str) -> int:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                           temperature=0, max_tokens=64)  # fmt: skip
        return int(r.usage.completion_tokens)

    ask(PROMPTS[0])  # warm
    t = time.perf_counter()
    n = sum(ask(p) for p in PROMPTS)
    secs = time.perf_counter() - t
    return {"completion_tokens": n, "seconds": secs, "tokens_per_s": n / secs}


def llama_server(gguf: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", "1024", "--n_threads", str(os.cpu_count() or 1)]  # fmt: skip
    quiet = subprocess.DEVNULL
    proc = subprocess.Popen(argv, stdout=quiet, stderr=quiet, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_up(client: Any, proc: subprocess.Popen[bytes] | None = None, timeout: float = 120) -> None:
    import openai

    deadline = time.monotonic() + timeout
    while True:
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError("the server did not start") from None
            time.sleep(0.5)


def main() -> int:
    import openai

    import nbtrain
    from nbtrain.control.jobs import llamacpp
    from nbtrain.examples import write_dataset

    why = llamacpp.missing()
    if why:
        print(why, file=sys.stderr)
        return 1
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "loadavg_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-gguf-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        model = nbtrain.example_model(name="smollm2-135m-instruct")
        data = write_dataset(work / "data.jsonl", n=64)
        run = nbtrain.finetune(lora_config(model, data, 4), name="gguf-bench")
        run.wait(timeout=1800)
        exports = {}
        for label, to in (("first", "out"), ("again", "out2")):
            t = time.perf_counter()
            e = nbtrain.export(run, to=work / to, format="gguf", quant=QUANTS, prompts=PROMPTS)
            exports[label] = {"seconds": time.perf_counter() - t, "reused": e.record["gguf"]["reused"]}
            report = e.record["gguf"]
        res["export"] = exports
        keep = ("bytes", "same_as_transformers", "tokens_per_s")
        res["files"] = {q: {k: report["files"][q][k] for k in keep} for q in QUANTS}
        first, again = exports["first"]["seconds"], exports["again"]["seconds"]
        print(f"export: {first:.1f} s, again {again:.1f} s", flush=True)

        speed: dict[str, Any] = {}
        server = run.serve()
        try:
            client = openai.OpenAI(base_url=server.url, api_key=server.api_key, max_retries=0, timeout=600)
            speed["nbtrain"] = tokens_per_s(client, "gguf-bench")
        finally:
            if not server.reused:
                server.stop()
        print(f"  nbtrain server: {speed['nbtrain']['tokens_per_s']:.1f} tokens/s", flush=True)
        for q in QUANTS:
            proc, url = llama_server(work / "out" / f"gguf-bench-{q}.gguf")
            try:
                client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
                wait_up(client, proc)
                speed[f"llama.cpp {q}"] = tokens_per_s(client, "gguf-bench")
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            print(f"  llama.cpp {q}: {speed[f'llama.cpp {q}']['tokens_per_s']:.1f} tokens/s", flush=True)
        os.chdir(ROOT)
    res["generation"] = speed
    base = speed["nbtrain"]["tokens_per_s"]
    res["tokens_per_s_vs_nbtrain_server"] = {k: v["tokens_per_s"] / base for k, v in speed.items()}
    res["loadavg_end"] = os.getloadavg()
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print("| file | MiB | answers as transformers' (8) | server tokens/s | vs nbtrain's server |")
    print("|---|---|---|---|---|")
    for q in QUANTS:
        f, s = res["files"][q], speed[f"llama.cpp {q}"]
        print(f"| {q} | {f['bytes'] / 2**20:.1f} | {f['same_as_transformers']} | {s['tokens_per_s']:.1f} | "
              f"{res['tokens_per_s_vs_nbtrain_server'][f'llama.cpp {q}']:.2f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
