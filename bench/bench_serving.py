"""The built-in server under concurrent clients, side by side in one run: nbtrain's FastAPI server with
continuous batching (transformers' manager, the default), the same server on the one-request-at-a-time
engine it replaced (NBTRAIN_SERVE_BATCHING=0), and ``transformers serve --continuous-batching`` (the
other candidate for the built-in engine; it serves no adapters, so it gets the run merged by
``nbtrain.export``).

- Runs: a 2-step LoRA run of SmolLM2-135M-Instruct (bench/peers.lora_config) and of the tiny-adder, each
  served by ``run.serve()`` (the tuned model).
- Clients: 1, 4 and 8 threads, each sending the same number of streaming chat requests one after another
  (greedy, 48 new tokens at most, different prompts) through the real ``openai`` client with
  ``stream_options.include_usage``. Aggregate tokens/s: completion tokens of all requests over the wall
  time from the first request to the last answer; time to first token per request (the first streamed
  content), p50 and p95. One request per server first, to warm it.
- Result: ``ratio_8_clients`` (batching over the old engine's aggregate tokens/s at 8 clients, SmolLM2),
  ``ttft_p95_8_over_1`` (batching, p95 time to first token at 8 clients over 1) and
  ``over_transformers_serve`` (nbtrain's aggregate tokens/s over transformers serve's, per client count),
  with every figure.

    python bench/bench_serving.py           # writes bench/results/serving.json
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "serving.json"

from bench.peers import CHAT_PROMPTS, lora_config  # noqa: E402

PROMPTS = CHAT_PROMPTS
CLIENTS = (1, 4, 8)
MAX_TOKENS = 48


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def load(client: Any, n_clients: int, per_client: int, model: str = "tuned") -> dict[str, float]:
    """``n_clients`` threads, ``per_client`` streaming requests each: aggregate tokens/s and TTFTs."""
    ttfts: list[float] = []
    tokens: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one(c: int) -> None:
        for r in range(per_client):
            prompt = PROMPTS[(c * per_client + r) % len(PROMPTS)]
            t = time.perf_counter()
            first, n = None, 0
            try:
                stream = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": prompt}], temperature=0,
                    max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True},
                )  # fmt: skip
                for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter() - t
                    if chunk.usage is not None:
                        n = int(chunk.usage.completion_tokens)
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(repr(e))
                continue
            with lock:
                ttfts.append(first if first is not None else time.perf_counter() - t)
                tokens.append(n)

    threads = [threading.Thread(target=one, args=(c,)) for c in range(n_clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
    return {
        "requests": len(tokens), "completion_tokens": sum(tokens), "seconds": wall,
        "tokens_per_s": sum(tokens) / wall, "ttft_p50_s": statistics.median(ttfts),
        "ttft_p95_s": _pct(ttfts, 0.95),
    }  # fmt: skip


def measure(run: Any, batching: bool, per_client: int) -> dict[str, Any]:
    import openai

    os.environ["NBTRAIN_SERVE_BATCHING"] = "1" if batching else "0"
    server = run.serve()
    try:
        client = openai.OpenAI(base_url=server.url, api_key=server.api_key, max_retries=0, timeout=900)
        load(client, 1, 1)  # warm
        out = {}
        for n in CLIENTS:
            out[str(n)] = r = load(client, n, per_client)
            how = "batching" if batching else "one at a time"
            print(f"  {how}, {n} clients: {r['tokens_per_s']:.1f} tokens/s, TTFT p50 {r['ttft_p50_s']:.2f} s"
                  f" p95 {r['ttft_p95_s']:.2f} s", flush=True)  # fmt: skip
        return out
    finally:
        server.stop()


def measure_transformers_serve(run: Any, work: Path, per_client: int) -> dict[str, Any]:
    """``transformers serve`` with continuous batching on the run merged into its base."""
    import signal
    import socket
    import subprocess
    import urllib.request

    import openai

    import nbtrain

    merged = work / f"merged-{run.name}"
    nbtrain.export(run, to=merged)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = str(Path(sys.executable).with_name("transformers"))
    argv = [exe, "serve", str(merged), "--continuous-batching", "--device", "cpu", "--host", "127.0.0.1",
            "--port", str(port)]  # fmt: skip
    log = (work / f"transformers-serve-{run.name}.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"transformers serve did not start: see {log.name}") from None
                time.sleep(0.5)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=900
        )
        load(client, 1, 1, str(merged))  # warm (its first request builds the batching cache)
        out = {}
        for n in CLIENTS:
            out[str(n)] = r = load(client, n, per_client, str(merged))
            print(f"  transformers serve, {n} clients: {r['tokens_per_s']:.1f} tokens/s, TTFT p50 "
                  f"{r['ttft_p50_s']:.2f} s p95 {r['ttft_p95_s']:.2f} s", flush=True)  # fmt: skip
        return out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()


def main() -> int:
    import nbtrain
    from nbtrain.examples import write_dataset

    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "loadavg_start": os.getloadavg(),
        "max_tokens": MAX_TOKENS,
    }
    with tempfile.TemporaryDirectory(prefix="nbtrain-bench-serving-") as d:
        work = Path(d)
        os.environ["NBTRAIN_HOME"] = str(work / "home")
        os.environ["NBTRAIN_RUNS_DIR"] = str(work / "runs")
        os.chdir(work)
        data = write_dataset(work / "data.jsonl", n=64)
        models = {"smollm2-135m": nbtrain.example_model(name="smollm2-135m-instruct"),
                  "tiny-adder": nbtrain.example_model()}  # fmt: skip
        for label, model in models.items():
            run = nbtrain.finetune(lora_config(model, data, 2), name=f"serving-{label}")
            run.wait(timeout=1800)
            print(f"{label}:", flush=True)
            per_client = 3 if label == "smollm2-135m" else 6
            res[label] = {
                "one_at_a_time": measure(run, False, per_client),
                "batching": measure(run, True, per_client),
                "transformers_serve": measure_transformers_serve(run, work, per_client),
            }
            old, new = res[label]["one_at_a_time"], res[label]["batching"]
            res[label]["ratio"] = {n: new[n]["tokens_per_s"] / old[n]["tokens_per_s"] for n in new}
            tfs = res[label]["transformers_serve"]
            res[label]["over_transformers_serve"] = {
                n: new[n]["tokens_per_s"] / tfs[n]["tokens_per_s"] for n in new
            }
            res[label]["ttft_p95_8_over_1"] = new["8"]["ttft_p95_s"] / new["1"]["ttft_p95_s"]
        os.chdir(ROOT)
    res["ratio_8_clients"] = res["smollm2-135m"]["ratio"]["8"]
    res["ttft_p95_8_over_1"] = res["smollm2-135m"]["ttft_p95_8_over_1"]
    res["over_transformers_serve"] = res["smollm2-135m"]["over_transformers_serve"]
    res["loadavg_end"] = os.getloadavg()
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    for label in models:
        r = res[label]
        ratios = ", ".join(f"{n} clients {v:.2f}x" for n, v in r["ratio"].items())
        over = ", ".join(f"{n} clients {v:.2f}x" for n, v in r["over_transformers_serve"].items())
        print(f"{label}: batching / one at a time: {ratios}; TTFT p95 8 vs 1 client "
              f"{r['ttft_p95_8_over_1']:.2f}x; nbtrain / transformers serve: {over}")  # fmt: skip
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
