"""The server extension's REST API, through a real Jupyter server (pytest-jupyter's jp_fetch).

Read-only endpoints are checked on run directories written with nbtrain.contract.rundir (what a worker
writes); stop and checkpoint on a real training run of the tiny model.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

import nbtrain
from nbtrain.ui.server.handlers import GpuSampler, _LossTrail
from tests.conftest import lora_yaml
from tests.ui.server.fakes import make_run

Fetch = Any  # pytest-jupyter's jp_fetch factory (untyped)


async def get_json(jp_fetch: Fetch, *parts: str, **kw: Any) -> Any:
    resp = await jp_fetch("nbtrain", *parts, **kw)
    assert resp.code == 200
    return json.loads(resp.body)


async def status_code(jp_fetch: Fetch, *parts: str, **kw: Any) -> int:
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("nbtrain", *parts, **kw)
    return e.value.code


ROUTES = [
    ("GET", "runs"),
    ("GET", "runs/a-1"),
    ("GET", "runs/a-1/metrics"),
    ("GET", "runs/a-1/logs"),
    ("GET", "runs/a-1/figure"),
    ("POST", "runs/a-1/stop"),
    ("POST", "runs/a-1/checkpoint"),
    ("POST", "runs/a-1/resume"),
    ("POST", "runs/a-1/delete"),
    ("POST", "runs/a-1/server/stop"),
    ("GET", "gpus"),
    ("GET", "schema"),
    ("POST", "validate"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_refuses_a_request_without_a_token(jp_fetch: Fetch, method: str, path: str) -> None:
    make_run("a-1")
    body = "{}" if method == "POST" else None
    code = await status_code(jp_fetch, path, method=method, body=body, headers={"Authorization": ""})
    assert code == 403


async def test_runs_lists_state_progress_and_last_loss(jp_fetch: Fetch) -> None:
    make_run("first-1", state="completed", step=10, losses=(2.0, 1.5, 1.25))
    make_run("second-2", state="queued")
    runs = await get_json(jp_fetch, "runs")
    assert [r["id"] for r in runs] == ["first-1", "second-2"]
    first, second = runs
    assert (first["state"], first["step"], first["max_steps"], first["loss"]) == ("completed", 10, 10, 1.25)
    assert first["done"] is True
    assert (second["state"], second["loss"]) == ("queued", None)
    assert first["losses"] == [2.0, 1.5, 1.25] and second["losses"] == []


async def test_a_run_logging_every_5_steps_lists_its_time_left_once_two_steps_are_timed(
    jp_fetch: Fetch,
) -> None:
    from nbtrain.contract.rundir import atomic_write_json, write_status

    paths = make_run("lab6-1", step=1)
    atomic_write_json(
        paths.resolved, {"id": "lab6-1", "name": "lab6", "config": {}, "train_args": {"logging_steps": 5}}
    )
    write_status(paths, "running", step=1, step_seconds=20.0, step_ended=time.time(), steps_timed=1)
    (run,) = await get_json(jp_fetch, "runs")
    assert (run["left"], run["left_text"]) == (None, None)  # one step, its warm-up with it, says little
    assert run["first_loss_text"] == "first loss at step 5"
    write_status(paths, "running", step=2, step_seconds=20.0, step_ended=time.time(), steps_timed=2)
    (run,) = await get_json(jp_fetch, "runs")
    assert 150 < run["left"] <= 160 and run["left_text"].endswith(" s left")  # 8 steps of 20 s
    assert re.fullmatch(r"first loss at step 5, in about (5\d|60) s", run["first_loss_text"])
    assert (await get_json(jp_fetch, "runs", "lab6-1"))["left_text"].endswith(" s left")  # the run page's
    write_status(paths, "completed", step=10)
    (run,) = await get_json(jp_fetch, "runs")
    assert (run["left"], run["left_text"], run["first_loss_text"]) == (None, None, None)


async def test_runs_name_the_model_each_trains_a_folder_by_its_name(jp_fetch: Fetch) -> None:
    make_run("hub-1", model="HuggingFaceTB/SmolLM2-135M-Instruct")
    make_run("local-2", model="/home/me/models/tiny-llama")
    make_run("none-3")
    runs = {r["id"]: r["model"] for r in await get_json(jp_fetch, "runs")}
    assert runs == {"hub-1": "HuggingFaceTB/SmolLM2-135M-Instruct", "local-2": "tiny-llama", "none-3": ""}


async def test_runs_skips_registered_runs_whose_directory_was_deleted(jp_fetch: Fetch) -> None:
    paths = make_run("gone-1")
    make_run("kept-1")
    for p in sorted(paths.root.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    paths.root.rmdir()
    assert [r["id"] for r in await get_json(jp_fetch, "runs")] == ["kept-1"]


async def test_last_loss_follows_records_appended_between_polls(jp_fetch: Fetch) -> None:
    paths = make_run("grow-1", losses=(3.0,))
    assert (await get_json(jp_fetch, "runs"))[0]["loss"] == 3.0
    with open(paths.metrics, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": 2, "loss": 2.5}) + "\n")
        f.write(json.dumps({"step": 2, "eval_loss": 9.0}) + "\n")  # a record without loss keeps the last
    assert (await get_json(jp_fetch, "runs"))[0]["loss"] == 2.5


async def test_status_of_one_run(jp_fetch: Fetch) -> None:
    make_run("one-1", state="running", step=4, losses=(1.0,))
    st = await get_json(jp_fetch, "runs", "one-1")
    got = (st["id"], st["state"], st["step"], st["max_steps"], st["loss"])
    assert got == ("one-1", "running", 4, 10, 1.0)


async def test_metrics_are_read_incrementally_from_the_returned_offset(jp_fetch: Fetch) -> None:
    paths = make_run("inc-1", losses=(3.0, 2.0))
    first = await get_json(jp_fetch, "runs", "inc-1", "metrics")
    assert [r["loss"] for r in first["records"]] == [3.0, 2.0]
    assert first["offset"] == paths.metrics.stat().st_size and first["reset"] is False

    again = await get_json(jp_fetch, "runs", "inc-1", "metrics", params={"offset": first["offset"]})
    assert again["records"] == [] and again["offset"] == first["offset"]

    with open(paths.metrics, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": 3, "loss": 1.0}) + "\n")
        f.write('{"step": 4, "lo')  # a line still being written is not returned until it is whole
    new = await get_json(jp_fetch, "runs", "inc-1", "metrics", params={"offset": first["offset"]})
    assert [r["step"] for r in new["records"]] == [3]
    assert new["offset"] == paths.metrics.stat().st_size - len('{"step": 4, "lo')


async def test_metrics_offset_past_the_end_restarts_and_says_so(jp_fetch: Fetch) -> None:
    make_run("reset-1", losses=(3.0,))
    got = await get_json(jp_fetch, "runs", "reset-1", "metrics", params={"offset": 10**9})
    assert got["reset"] is True and [r["loss"] for r in got["records"]] == [3.0]


async def test_metrics_route_and_run_metrics_agree_on_a_file_with_a_torn_last_line(jp_fetch: Fetch) -> None:
    paths = make_run("torn-1", losses=(3.0, 2.0, 1.5))
    with open(paths.metrics, "ab") as f:
        f.write(b"\0" * 32 + b"\n")  # NUL padding a crash left: not a record for either reader
        f.write(b'{"t": 1.0, "step": 4, "lo')  # still being written
    got = await get_json(jp_fetch, "runs", "torn-1", "metrics")
    frame = nbtrain.get_run("torn-1").metrics()
    assert got["records"] == frame.to_dict("records")
    assert [r["loss"] for r in got["records"]] == [3.0, 2.0, 1.5]
    again = await get_json(jp_fetch, "runs", "torn-1", "metrics", params={"offset": got["offset"]})
    assert again["records"] == [] and again["offset"] == got["offset"]
    with open(paths.metrics, "ab") as f:
        f.write(b'ss": 1.25}\n')
    new = await get_json(jp_fetch, "runs", "torn-1", "metrics", params={"offset": got["offset"]})
    assert new["records"] == [{"t": 1.0, "step": 4, "loss": 1.25}]
    assert new["records"] == nbtrain.get_run("torn-1").metrics().to_dict("records")[-1:]


@pytest.mark.parametrize("offset", ["-1", "abc", "1.5"])
async def test_metrics_rejects_a_bad_offset(jp_fetch: Fetch, offset: str) -> None:
    make_run("bad-1")
    assert await status_code(jp_fetch, "runs", "bad-1", "metrics", params={"offset": offset}) == 400


async def test_logs_returns_the_last_n_lines(jp_fetch: Fetch) -> None:
    make_run("log-1")
    got = await get_json(jp_fetch, "runs", "log-1", "logs", params={"n": 3})
    assert got["text"] == "line 97\nline 98\nline 99"
    assert await status_code(jp_fetch, "runs", "log-1", "logs", params={"n": 10**6}) == 400


async def test_unknown_run_is_404(jp_fetch: Fetch) -> None:
    make_run("known-1")
    assert await status_code(jp_fetch, "runs", "unknown-1") == 404
    # Ids are exact: the prefix and name matching of %finetune does not apply to the API.
    assert await status_code(jp_fetch, "runs", "known") == 404


@pytest.mark.parametrize(
    "raw_path",
    [
        "runs/..",
        "runs/..%2F..%2Fetc%2Fpasswd",
        "runs/%2Fetc%2Fpasswd",
        "runs/..%2Fhome/logs",
        "runs/a%00b",
        "runs/..%5C..%5Cwindows",
    ],
)
async def test_path_traversal_in_a_run_id_is_refused(
    raw_path: str, http_server_client: Any, jp_base_url: str, jp_auth_header: dict[str, str]
) -> None:
    # Sent raw (jp_fetch would escape the %): the encoded separators must reach the handler's check.
    with pytest.raises(HTTPClientError) as e:
        await http_server_client.fetch(f"{jp_base_url}nbtrain/{raw_path}", headers=jp_auth_header)
    assert e.value.code in (400, 404)
    assert e.value.code == 400 or "%2F" not in raw_path


async def test_unescaped_traversal_matches_no_route(
    http_server_client: Any, jp_base_url: str, jp_auth_header: dict[str, str]
) -> None:
    with pytest.raises(HTTPClientError) as e:
        await http_server_client.fetch(f"{jp_base_url}nbtrain/runs/../../etc/passwd", headers=jp_auth_header)
    assert e.value.code == 404


async def test_checkpoint_on_a_finished_run_is_a_conflict(jp_fetch: Fetch) -> None:
    make_run("done-1", state="completed")
    assert await status_code(jp_fetch, "runs", "done-1", "checkpoint", method="POST", body="{}") == 409


async def test_stop_on_a_finished_run_returns_its_final_state(jp_fetch: Fetch) -> None:
    make_run("done-2", state="completed", step=10)
    resp = await jp_fetch("nbtrain", "runs", "done-2", "stop", method="POST", body="{}")
    assert json.loads(resp.body)["state"] == "completed"


async def test_stop_rejects_a_bad_timeout(jp_fetch: Fetch) -> None:
    make_run("to-1")
    body = json.dumps({"timeout": "soon"})
    assert await status_code(jp_fetch, "runs", "to-1", "stop", method="POST", body=body) == 400


async def test_runs_show_folder_time_and_whether_resume_can_continue(
    jp_fetch: Fetch, jp_root_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(jp_root_dir)  # runs in <server root>/runs: the folder is shown relative to the root
    make_run("20250101-000000-same-aaaa", name="same", state="stopped", step=4, checkpoint=4, created=1.0e9)
    make_run("20250101-000001-same-bbbb", name="same", state="failed", step=0, created=1.1e9)
    make_run("20250101-000002-done-cccc", state="completed", step=10, checkpoint=10)
    stopped, failed, done = await get_json(jp_fetch, "runs")
    assert (stopped["name"], failed["name"]) == ("same", "same")  # told apart by id and time
    assert (stopped["created"], failed["created"]) == (1.0e9, 1.1e9)
    assert stopped["folder"] == "runs" and stopped["run_dir"].endswith("/runs/20250101-000000-same-aaaa")
    assert (stopped["resumable"], stopped["resume_note"]) == (True, None)
    assert (failed["resumable"], failed["resume_note"]) == (False, "no checkpoint saved")
    assert done["resumable"] is False and "completed" in done["resume_note"]


async def test_resume_refuses_what_cannot_continue_saying_why(jp_fetch: Fetch) -> None:
    from nbtrain.contract.rundir import lock_run

    make_run("run-1", state="running", step=3)
    make_run("done-1", state="completed", step=10, checkpoint=10)
    make_run("early-1", state="stopped", step=0)
    locked = make_run("locked-1", state="stopped", step=4, checkpoint=4)

    async def refusal(run_id: str) -> str:
        with pytest.raises(HTTPClientError) as e:
            await jp_fetch("nbtrain", "runs", run_id, "resume", method="POST", body="{}")
        assert e.value.code == 409
        assert e.value.response is not None
        return str(json.loads(e.value.response.body)["message"])

    assert "is running; stop it before resuming" in await refusal("run-1")
    assert "completed; nothing to resume" in await refusal("done-1")
    assert "no complete checkpoint to resume from" in await refusal("early-1")
    fd = lock_run(locked)  # another resume (or its worker) holds the run's writer lock
    assert fd is not None
    try:
        assert "is being written by another process" in await refusal("locked-1")
    finally:
        os.close(fd)
    assert (await get_json(jp_fetch, "runs", "locked-1"))["state"] == "stopped"  # left as it was


async def test_delete_moves_a_finished_run_to_the_trash_and_refuses_an_active_one(jp_fetch: Fetch) -> None:
    done = make_run("done-1", state="completed", step=10)
    active = make_run("active-1", state="running", step=3)
    got = await get_json(jp_fetch, "runs", "done-1", "delete", method="POST", body="{}")
    trash = done.root.parent / ".trash" / "done-1"
    assert got == {"id": "done-1", "trash": str(trash)}
    assert not done.root.exists() and (trash / "status.json").is_file()  # moved, nothing erased
    assert [r["id"] for r in await get_json(jp_fetch, "runs")] == ["active-1"]  # and not rebuilt back
    assert await status_code(jp_fetch, "runs", "done-1") == 404

    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("nbtrain", "runs", "active-1", "delete", method="POST", body="{}")
    assert e.value.code == 409 and e.value.response is not None
    assert "is running: stop it before deleting it" in json.loads(e.value.response.body)["message"]
    assert active.root.is_dir()


async def test_gpus_is_empty_without_an_nvidia_driver(jp_fetch: Fetch) -> None:
    if nbtrain.hardware.facts.probe().gpus:
        pytest.skip("this machine has a GPU")
    got = await get_json(jp_fetch, "gpus")
    assert got["gpus"] == [] and got["error"]


def test_one_gpu_sampler_serves_every_reader_from_its_own_thread() -> None:
    calls: list[str] = []

    def sample() -> tuple[list[dict[str, Any]], str | None]:
        import threading

        calls.append(threading.current_thread().name)
        return [{"index": 0, "name": "fake", "memory_total": 8, "memory_used": len(calls)}], None

    sampler = GpuSampler(sample, period=0.2)
    first = [sampler.latest() for _ in range(20)]  # twenty readers at once: one sample, no queries of theirs
    assert all(r["gpus"][0]["name"] == "fake" for r in first)
    assert len(calls) == 1 and calls[0] == "nbtrain-gpu-sampler"
    time.sleep(0.5)
    assert sampler.latest()["gpus"][0]["memory_used"] >= 2  # it keeps sampling in the background
    assert set(calls) == {"nbtrain-gpu-sampler"}


async def test_schema_has_config_keys_with_enum_values(jp_fetch: Fetch) -> None:
    got = await get_json(jp_fetch, "schema")
    keys = got["keys"]
    assert got["schema"]["title"] == "RunConfig"
    assert {"full", "lora", "qlora"} <= set(keys["method"]["enum"])
    assert keys["lora.bias"]["enum"] == ["none", "all", "lora_only"]
    assert keys["distributed.strategy"]["enum"][:2] == ["auto", "none"]
    assert "data.train" in keys and "distributed.slurm.partition" in keys
    assert "train.learning_rate" in keys and "train.output_dir" not in keys  # nbtrain sets output_dir


async def test_schema_serves_each_objectives_own_train_keys(jp_fetch: Fetch) -> None:
    got = await get_json(jp_fetch, "schema")
    objectives = got["objectives"]
    assert set(objectives) == {"sft", "dpo", "orpo", "kto", "reward", "grpo", "rloo"}
    assert "train.beta" in objectives["dpo"] and "train.beta" not in got["keys"]  # DPOConfig's, not SFT's
    assert "train.num_generations" in objectives["grpo"]
    rloo_only = "train.normalize_advantages"  # RLOOConfig's, not GRPOConfig's
    assert rloo_only in objectives["rloo"] and rloo_only not in objectives["grpo"]
    assert "train.center_rewards_coefficient" in objectives["reward"]
    assert "train.packing" in objectives["sft"] and "train.packing" not in objectives["dpo"]
    assert all("train.output_dir" not in keys for keys in objectives.values())


async def test_validate_answers_what_prepare_refuses_in_its_words(jp_fetch: Fetch, workdir: Path) -> None:
    from nbtrain.contract.errors import ConfigError
    from nbtrain.examples import write_dataset

    write_dataset(workdir / "data" / "kto.jsonl", "unpaired", 16)
    text = (
        "model: ./tiny-llama\nobjective: kto\ndata: {train: data/kto.jsonl}\n"
        "train: {max_steps: 2, per_device_train_batch_size: 1}\n"
    )
    got = await get_json(jp_fetch, "validate", method="POST", body=json.dumps({"config": text}))
    with pytest.raises(ConfigError) as e:
        nbtrain.prepare(text)
    assert got["valid"] is False
    assert [p["message"] for p in got["problems"]] == [p.message for p in e.value.problems]
    first = got["problems"][0]
    assert first["path"] == "train.per_device_train_batch_size" and first["line"] == 4
    fixed = text.replace("per_device_train_batch_size: 1", "per_device_train_batch_size: 2")
    ok = await get_json(jp_fetch, "validate", method="POST", body=json.dumps({"config": fixed}))
    assert ok == {"valid": True, "problems": []}


async def test_validate_without_a_config_is_a_bad_request(jp_fetch: Fetch) -> None:
    assert await status_code(jp_fetch, "validate", method="POST", body="{}") == 400


def test_loss_trail_keeps_a_bounded_evenly_thinned_history(tmp_path: Path) -> None:
    from nbtrain.contract.rundir import JsonlWriter

    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path, "metrics")
    trail = _LossTrail(points=8)
    for step in range(1, 101):
        w.write({"step": step, "loss": float(step)})
        if step % 7 == 0:
            trail.get(path)  # polls in between read only what was appended
    w.close()
    last, kept = trail.get(path)
    assert last == 100.0
    assert len(kept) < 8 and kept[0] == 1.0
    gaps = {b - a for a, b in itertools.pairwise(kept)}
    assert len(gaps) == 1  # evenly spaced over the whole run, not just its tail
    assert kept[-1] > 80  # and reaching near its end


def test_loss_trail_reads_only_what_was_appended_and_restarts_on_a_new_file(tmp_path: Path) -> None:
    from nbtrain.contract.rundir import JsonlWriter

    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path, "metrics")
    w.write({"step": 1, "loss": 1.0})
    trail = _LossTrail()
    assert trail.get(path) == (1.0, [1.0])
    # the line already read, rewritten in place to another loss of the same length: not read again
    path.write_bytes(path.read_bytes().replace(b'"loss": 1.0', b'"loss": 7.0'))
    w.write({"step": 2, "loss": 2.0})
    w.close()
    assert trail.get(path) == (2.0, [1.0, 2.0])
    path.unlink()
    assert trail.get(path) == (None, [])
    w = JsonlWriter(path, "metrics")
    w.write({"step": 1, "loss": 5.0})
    w.close()
    assert trail.get(path) == (5.0, [5.0])


LONG = lora_yaml(100_000).replace("  logging_steps: 1", "  logging_steps: 1\n  save_steps: 100000")


async def poll(jp_fetch: Fetch, run_id: str, cond: Any, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = await get_json(jp_fetch, "runs", run_id)
        if cond(st):
            return st
        await asyncio.sleep(0.3)
    raise AssertionError(f"run {run_id} never reached the condition; last status {st}")


@pytest.mark.slow
async def test_checkpoint_then_stop_a_real_run_through_the_api(jp_fetch: Fetch, workdir: Path) -> None:
    run = nbtrain.finetune(LONG, name="api")
    st = await poll(jp_fetch, run.id, lambda s: s["step"] >= 2 and s["loss"] is not None)
    assert st["state"] == "running"

    metrics = await get_json(jp_fetch, "runs", run.id, "metrics")
    assert metrics["records"] and all("loss" in r for r in metrics["records"] if "eval_loss" not in r)
    more = await get_json(jp_fetch, "runs", run.id, "metrics", params={"offset": metrics["offset"]})
    assert more["offset"] >= metrics["offset"]
    seen = {r["step"] for r in metrics["records"]}
    assert all(r["step"] not in seen for r in more["records"])  # no record is sent twice

    await jp_fetch("nbtrain", "runs", run.id, "checkpoint", method="POST", body="{}")
    deadline = time.monotonic() + 60
    while not any(run.paths.checkpoints.glob("checkpoint-*")) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)  # not time.sleep: the server under test runs on this loop
    assert any(run.paths.checkpoints.glob("checkpoint-*")), "checkpoint-now made no checkpoint"
    assert (await get_json(jp_fetch, "runs", run.id))["state"] == "running"  # checkpointing does not stop

    body = json.dumps({"timeout": 60})
    resp = await jp_fetch("nbtrain", "runs", run.id, "stop", method="POST", body=body, request_timeout=120)
    final = json.loads(resp.body)
    assert final["state"] == "stopped" and final["done"] is True
    # The stop's SIGTERM reaches the worker at once, but status.json says who asked: the sidebar.
    assert json.loads(run.paths.status.read_text())["stop_reason"] == "sidebar"
    logs = await get_json(jp_fetch, "runs", run.id, "logs", params={"n": 200})
    assert logs["text"]
    listed = await get_json(jp_fetch, "runs")
    assert [(r["id"], r["state"]) for r in listed] == [(run.id, "stopped")]


@pytest.mark.slow
async def test_a_runs_model_server_is_listed_with_its_address_not_its_key_and_stopped_from_the_sidebar(
    jp_fetch: Fetch, tuned_run: Path
) -> None:
    import shutil

    from nbtrain.control.jobs.serve import find_server, serve
    from nbtrain.control.runs import registry

    root = Path.cwd() / "runs" / "served-1"
    shutil.copytree(tuned_run, root, ignore=shutil.ignore_patterns("serve.json", "logs", "checkpoints"))
    registry.add("served-1", "served", root, None)
    make_run("plain-2", state="completed", step=10)
    handle = serve(root)
    try:
        listed = {r["id"]: r for r in await get_json(jp_fetch, "runs")}
        assert listed["plain-2"]["server"] is None
        server = listed["served-1"]["server"]
        assert server["url"] == handle.url and server["pid"] == handle.pid
        assert handle.api_key and handle.api_key not in json.dumps(listed)  # the key stays in serve.json
        resp = await jp_fetch("nbtrain", "runs", "served-1", "server", "stop", method="POST", body="{}")
        assert json.loads(resp.body)["server"] is None and find_server(root) is None
        assert not handle.alive()
        code = await status_code(jp_fetch, "runs", "served-1", "server", "stop", method="POST", body="{}")
        assert code == 409  # none runs now: said, not a silent 200
    finally:
        if find_server(root) is not None:
            handle.stop()


@pytest.mark.slow
async def test_the_sidebars_stop_waits_for_a_slow_step_and_says_so_while_it_does(
    jp_fetch: Fetch, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtrain.contract.rundir import checkpoint_step
    from nbtrain.control.runs.run import last_checkpoint
    from tests.faults.test_stop_faults import slow_run

    monkeypatch.setenv("NBTRAIN_STOP_GRACE", "1")  # the floor shorter than a step: the step time decides
    run = slow_run("sidebar", 3.0, 200)
    await poll(jp_fetch, run.id, lambda s: s["step"] >= 2 and s["state"] == "running", timeout=240)
    stop = asyncio.ensure_future(
        jp_fetch("nbtrain", "runs", run.id, "stop", method="POST", body="{}", request_timeout=300)
    )
    said = await poll(jp_fetch, run.id, lambda s: (s["phase"] or "").startswith("stopping"), timeout=60)
    phase = said["phase"]
    assert said["stopping"] is True  # the chip says "stopping" and Stop "Stopping…" (any client, any tab)
    assert phase.startswith(f"stopping after step {said['step'] + 1}") or "saving a checkpoint" in phase
    final = json.loads((await stop).body)
    assert final["state"] == "stopped" and final["resumable"] is True, final
    ckpt = last_checkpoint(run)
    assert ckpt is not None and checkpoint_step(ckpt) == final["step"]  # no step lost
