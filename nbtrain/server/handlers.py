"""REST handlers under ``<base_url>/nbtrain/``: the run registry, one run's status, metrics and logs,
stop/checkpoint, GPU memory and the config schema.

Every handler is a thin shim over nbtrain.runs (the same calls the magics and the CLI make). Their work
touches the filesystem and the SQLite registry (whose busy timeout can block for seconds while another
kernel writes) and ``stop`` waits for the run to exit, so all of it runs on a thread pool, never on the
IOLoop that serves every other request of the Jupyter server.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado.ioloop import IOLoop

from nbtrain import registry
from nbtrain.errors import NbtrainError
from nbtrain.hardware import probe
from nbtrain.rundir import iter_jsonl
from nbtrain.runs import Run, RunStatus

T = TypeVar("T")

# Run ids are made by runs.new_run_id: a timestamp, a slug of [A-Za-z0-9._-] and a random suffix. Anything
# else (a slash, "..", an absolute path, a NUL) is refused before it reaches the registry or the disk.
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_RECORDS = 5000  # per metrics response; the client continues from the offset it gets back
MAX_LOG_LINES = 2000
GPU_SAMPLE_S = 2.0
GPU_RETRY_S = 30.0  # without an NVIDIA driver, asking NVML every 2 s would only repeat the same error
GPU_IDLE_S = 60.0  # the sampler stops when nobody has asked for that long
SPARK_POINTS = 64  # a run's loss history in the runs listing is thinned to fewer points than this

# Stops wait up to their timeout each; a pool of their own would only hide a pile-up, so one bounded pool
# serves all handlers and is sized so a few slow stops leave room for the 2 s polls.
_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="nbtrain-server")


def _valid_run_id(run_id: str) -> bool:
    return bool(RUN_ID_RE.match(run_id)) and ".." not in run_id


def _lookup(run_id: str) -> tuple[Run, registry.Row]:
    """The registered run with exactly this id (no prefix or name matching: an API takes ids)."""
    if not _valid_run_id(run_id):
        raise tornado.web.HTTPError(400, f"invalid run id {run_id!r}")
    row = next((r for r in registry.find(run_id) if r.id == run_id), None)
    if row is None or not Path(row.run_dir).is_dir():
        raise tornado.web.HTTPError(404, f"no run {run_id!r}")
    return Run(row.run_dir, run_id=row.id, name=row.name), row


class _LossTrail:
    """Per run: the last logged loss and a bounded, evenly thinned history of it for the sidebar's
    sparkline, read incrementally: each poll costs only the bytes appended since the last one, however
    long the run's metrics.jsonl has grown."""

    def __init__(self, points: int = SPARK_POINTS) -> None:
        self._lock = threading.Lock()
        self._points = points
        self._seen: dict[str, _Trail] = {}

    def get(self, path: Path) -> tuple[float | None, list[float]]:
        key = str(path)
        # Held for the (incremental, small) read: two tabs polling the same run must not add its new
        # records twice.
        with self._lock:
            trail = self._seen.get(key) or _Trail()
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return None, []
            if size < trail.offset:  # the file was replaced (a run dir rebuilt): read it again from the start
                trail = _Trail()
            for end, rec in iter_jsonl(path, trail.offset):
                trail.offset = end
                if isinstance(rec.get("loss"), (int, float)):
                    trail.add(float(rec["loss"]), self._points)
            self._seen[key] = trail
            return trail.last, list(trail.kept)


@dataclass
class _Trail:
    offset: int = 0
    last: float | None = None
    seen: int = 0  # losses read so far
    stride: int = 1  # every stride-th loss is kept; doubles whenever the kept list fills up
    kept: list[float] = field(default_factory=list)

    def add(self, loss: float, points: int) -> None:
        if self.seen % self.stride == 0:
            self.kept.append(loss)
            if len(self.kept) >= points:
                self.kept = self.kept[::2]
                self.stride *= 2
        self.seen += 1
        self.last = loss


_LOSS_TRAIL = _LossTrail()


def _status_dict(run: Run, row: registry.Row, st: RunStatus) -> dict[str, Any]:
    loss, losses = _LOSS_TRAIL.get(run.paths.metrics)
    return {
        "id": run.id,
        "name": run.name,
        "run_dir": str(run.dir),
        "created": row.created,
        "state": st.state,
        "done": st.done,
        "step": st.step,
        "max_steps": st.max_steps,
        "error": st.error,
        "updated": st.updated,
        "loss": loss,
        "losses": losses,
    }


def list_runs() -> list[dict[str, Any]]:
    out = []
    for row in registry.rows():
        if not Path(row.run_dir).is_dir():
            continue  # deleted by hand; the registry only says where runs were
        run = Run(row.run_dir, run_id=row.id, name=row.name)
        out.append(_status_dict(run, row, run.status()))
    return out


def run_status(run_id: str) -> dict[str, Any]:
    run, row = _lookup(run_id)
    return _status_dict(run, row, run.status())


def run_metrics(run_id: str, offset: int) -> dict[str, Any]:
    run, _ = _lookup(run_id)
    path = run.paths.metrics
    reset = False
    try:
        if offset > path.stat().st_size:
            # The client holds an offset into an older file: start again and tell it to drop its history.
            offset, reset = 0, True
    except FileNotFoundError:
        return {"records": [], "offset": 0, "reset": offset > 0}
    records: list[dict[str, Any]] = []
    end = offset
    for end, rec in iter_jsonl(path, offset):  # noqa: B007 - `end` is the offset after the last record
        records.append(rec)
        if len(records) >= MAX_RECORDS:
            break
    return {"records": records, "offset": end, "reset": reset}


def run_logs(run_id: str, n: int) -> dict[str, Any]:
    run, _ = _lookup(run_id)
    return {"id": run.id, "path": str(run.paths.rank_log(0)), "text": run.logs(n)}


def stop_run(run_id: str, timeout: float) -> dict[str, Any]:
    run, row = _lookup(run_id)
    return _status_dict(run, row, run.stop(timeout=timeout))


def checkpoint_run(run_id: str) -> dict[str, Any]:
    run, row = _lookup(run_id)
    run.checkpoint()
    return _status_dict(run, row, run.status())


class GpuSampler:
    """One background thread for the whole server samples GPU memory through NVML every ~2 s.

    Handlers read the latest sample, so a dozen open browser tabs cost one NVML query per period, and
    NVML (which can stall for hundreds of ms on a busy driver) never runs on the IOLoop. The thread starts
    on the first read and ends after a minute without readers.
    """

    def __init__(
        self,
        sample: Callable[[], tuple[list[dict[str, Any]], str | None]] | None = None,
        period: float = GPU_SAMPLE_S,
    ) -> None:
        self._sample = sample or _nvml_memory
        self._period = period
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_read = 0.0
        self._latest: dict[str, Any] = {"gpus": [], "error": None, "sampled": None}
        self._first = threading.Event()

    def latest(self, wait: float = 5.0) -> dict[str, Any]:
        with self._lock:
            self._last_read = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._first.clear()
                self._thread = threading.Thread(target=self._loop, name="nbtrain-gpu-sampler", daemon=True)
                self._thread.start()
        # Only the very first request waits (briefly) for a sample; later ones get the latest at once.
        self._first.wait(wait)
        with self._lock:
            return dict(self._latest)

    def _loop(self) -> None:
        while True:
            try:
                gpus, error = self._sample()
            except Exception as e:  # noqa: BLE001 - a sampler that dies would freeze the status bar
                gpus, error = [], f"{type(e).__name__}: {e}"
            with self._lock:
                self._latest = {"gpus": gpus, "error": error, "sampled": time.time()}
                idle = time.monotonic() - self._last_read > GPU_IDLE_S
                if idle:
                    self._thread = None
            self._first.set()
            if idle:
                return
            time.sleep(self._period if error is None else max(self._period, GPU_RETRY_S))


def _nvml_memory() -> tuple[list[dict[str, Any]], str | None]:
    hw = probe()
    gpus = [
        {
            "index": g.index,
            "name": g.name,
            "memory_total": g.memory_total,
            "memory_used": g.memory_total - g.memory_free,
        }
        for g in hw.gpus
    ]
    return gpus, hw.nvml_error


GPU_SAMPLER = GpuSampler()


def _schema_keys(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Flatten the pydantic JSON schema into ``{"lora.r": {"type", "enum", "default", "description"}}``,
    the shape an editor completer needs (one lookup per key path, no $ref resolution in TypeScript)."""
    defs: dict[str, Any] = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return resolve(defs[ref.rsplit("/", 1)[-1]]) if isinstance(ref, str) else node

    def describe(node: dict[str, Any]) -> tuple[list[str], list[Any], dict[str, Any] | None]:
        """(types, enum values, nested object schema) of a property, through anyOf / $ref."""
        node = resolve(node)
        types: list[str] = []
        enum: list[Any] = list(node.get("enum", []))
        if "const" in node:
            enum.append(node["const"])
        nested = node if node.get("type") == "object" and "properties" in node else None
        if isinstance(node.get("type"), str):
            types.append(node["type"])
        for alt in node.get("anyOf", []):
            t, e, n = describe(alt)
            types += t
            enum += e
            nested = nested or n
        return types, enum, nested

    out: dict[str, dict[str, Any]] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, prop in node.get("properties", {}).items():
            types, enum, nested = describe(prop)
            key = f"{prefix}{name}"
            info: dict[str, Any] = {"type": sorted(set(types)), "enum": enum or None}
            if "default" in prop:
                info["default"] = prop["default"]
            if "description" in prop:
                info["description"] = prop["description"]
            out[key] = info
            if nested is not None:
                walk(nested, key + ".")

    walk(schema, "")
    return out


def _train_keys(objective: str) -> dict[str, dict[str, Any]]:
    """``train.<name>`` entries for the TRL config of ``objective`` (what the validator accepts there)."""
    from nbtrain import trainargs

    return {
        f"train.{name}": {
            "type": list(spec.kinds),
            "enum": list(spec.choices) if spec.choices else None,
            "default": spec.default,
            "description": spec.help,
        }
        for name, spec in trainargs.fields_for(objective).items()
        if name not in trainargs.MANAGED
    }


def config_schema() -> dict[str, Any]:
    from nbtrain.config import RunConfig
    from nbtrain.objectives import OBJECTIVES

    schema = RunConfig.model_json_schema()
    keys = _schema_keys(schema)
    # train: takes the objective's TRL config names (SFTConfig unless the cell says `objective: dpo` ...);
    # `keys` carries SFT's, and `objectives` every objective's own train keys, so the editor can complete
    # what the validator will accept for the objective the cell names.
    keys.update(_train_keys("sft"))
    objectives = {name: _train_keys(name) for name in OBJECTIVES}
    return {"schema": schema, "keys": keys, "objectives": objectives}


_SCHEMA_CACHE: dict[str, Any] = {}


def cached_schema() -> dict[str, Any]:
    # The schema is fixed for the server's life; trainargs may build its field list in a subprocess once.
    if not _SCHEMA_CACHE:
        _SCHEMA_CACHE.update(config_schema())
    return _SCHEMA_CACHE


class _Base(APIHandler):
    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await IOLoop.current().run_in_executor(_POOL, fn, *args)

    async def _reply(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            result = await self._off_loop(fn, *args)
        except tornado.web.HTTPError:
            raise
        except NbtrainError as e:  # a run that is not running, or runs on another host
            raise tornado.web.HTTPError(409, str(e)) from e
        self.finish(json.dumps(result, default=str))

    def _int_arg(self, name: str, default: int, lo: int, hi: int) -> int:
        raw = self.get_argument(name, str(default))
        try:
            value = int(raw)
        except ValueError:
            raise tornado.web.HTTPError(400, f"{name} must be an integer, not {raw!r}") from None
        if not lo <= value <= hi:
            raise tornado.web.HTTPError(400, f"{name} must be between {lo} and {hi}")
        return value


class RunsHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        await self._reply(list_runs)


class RunHandler(_Base):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        await self._reply(run_status, run_id)


class MetricsHandler(_Base):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        await self._reply(run_metrics, run_id, self._int_arg("offset", 0, 0, 2**62))


class LogsHandler(_Base):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        await self._reply(run_logs, run_id, self._int_arg("n", 40, 0, MAX_LOG_LINES))


class StopHandler(_Base):
    @tornado.web.authenticated
    async def post(self, run_id: str) -> None:
        body = self.get_json_body() or {}
        try:
            timeout = float(body.get("timeout", 60.0))
        except (TypeError, ValueError, AttributeError):
            raise tornado.web.HTTPError(400, "timeout must be a number of seconds") from None
        if not 0 < timeout <= 600:
            raise tornado.web.HTTPError(400, "timeout must be between 0 and 600 seconds")
        await self._reply(stop_run, run_id, timeout)


class CheckpointHandler(_Base):
    @tornado.web.authenticated
    async def post(self, run_id: str) -> None:
        await self._reply(checkpoint_run, run_id)


class GpusHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        # latest() only waits for the sampler's first result; off the loop so that wait blocks no one.
        await self._reply(GPU_SAMPLER.latest)


class SchemaHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        await self._reply(cached_schema)


def setup_handlers(web_app: Any) -> None:
    base = url_path_join(web_app.settings.get("base_url", "/"), "nbtrain")
    # [^/]+ lets an encoded slash (%2F) reach the handler, where the run id check refuses it with a 400.
    run = r"runs/(?P<run_id>[^/]+)"
    routes: list[tuple[str, type[_Base]]] = [
        ("runs", RunsHandler),
        (run, RunHandler),
        (run + "/metrics", MetricsHandler),
        (run + "/logs", LogsHandler),
        (run + "/stop", StopHandler),
        (run + "/checkpoint", CheckpointHandler),
        ("gpus", GpusHandler),
        ("schema", SchemaHandler),
    ]
    web_app.add_handlers(".*$", [(url_path_join(base, path) + "/?$", h) for path, h in routes])
