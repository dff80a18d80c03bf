"""REST handlers under ``<base_url>/nbtrain/``: the run registry, one run's status, metrics and logs,
stop/checkpoint/resume/delete, GPU memory, the config schema, and validation of a config (``POST validate``).

Every handler is a thin shim over nbtrain.control (the same calls the magics and the CLI make: ``Run.stop``,
``start.resume`` with its writer lock, ``runs.run.trash_run``).
Their work touches the filesystem and the SQLite registry (whose busy timeout can block for seconds
while another kernel writes) and ``stop`` waits for the run to exit, so all of it runs on a thread pool,
never on the IOLoop that serves every other request of the Jupyter server.

Whatever a run directory holds, no request blocks or reads without bound: a run directory that is a
symbolic link is refused, files in it are opened only when they are regular files and never through a
link (``contract/rundir.open_regular``: a FIFO would block a thread forever, a link could show a file
outside the run), and metrics are read in bounded chunks with a byte budget per request, a line longer
than any record skipped. One run's unreadable file is that run's problem (a 409 naming the file, or the
run marked in the listing), never the listing's.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import tornado.web
from jupyter_server.utils import url_path_join

from nbtrain.contract.errors import NbtrainError
from nbtrain.contract.rundir import (
    MAX_JSON_BYTES,
    NotRegularFile,
    latest_complete_checkpoint,
    read_json,
    read_tail,
)
from nbtrain.control.runs import eta, registry
from nbtrain.control.runs.metrics import JsonlTail
from nbtrain.control.runs.run import Run, RunStatus, trash_run
from nbtrain.hardware import probe
from nbtrain.ui.server import sweeps
from nbtrain.ui.server.base import _Base
from nbtrain.ui.server.logtext import readable

T = TypeVar("T")

# Run ids are made by runs.new_run_id: a timestamp, a slug of [A-Za-z0-9._-] and a random suffix. Anything
# else (a slash, "..", an absolute path, a NUL) is refused before it reaches the registry or the disk.
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
MAX_RECORDS = 5000  # per metrics response; the client continues from the offset it gets back
# Bytes of metrics.jsonl one request reads at most (a few ms): a file holding a huge line is gone through
# over several requests, each answered at once, instead of holding a thread for one long read.
MAX_READ_BYTES = 16 << 20
MAX_LOG_LINES = 2000
GPU_SAMPLE_S = 2.0
GPU_RETRY_S = 30.0  # without an NVIDIA driver, asking NVML every 2 s would only repeat the same error
GPU_IDLE_S = 60.0  # the sampler stops when nobody has asked for that long
SPARK_POINTS = 64  # a run's loss history in the runs listing is thinned to fewer points than this


def _valid_run_id(run_id: str) -> bool:
    return bool(RUN_ID_RE.match(run_id)) and ".." not in run_id


def _not_a_link(run_dir: Path) -> None:
    """Refuse a run directory that is a symbolic link: what it points to could be anywhere."""
    if os.path.islink(run_dir):
        raise NotRegularFile(
            f"the run directory {run_dir} is a symbolic link: the server reads no run through a link (it "
            "could point anywhere); move the run directory to where the link is instead"
        )


def _lookup(run_id: str) -> tuple[Run, registry.Row]:
    """The registered run with exactly this id (no prefix or name matching: an API takes ids)."""
    if not _valid_run_id(run_id):
        raise tornado.web.HTTPError(400, f"invalid run id {run_id!r}")
    row = next((r for r in registry.find(run_id) if r.id == run_id), None)
    if row is None or not (os.path.islink(row.run_dir) or Path(row.run_dir).is_dir()):
        raise tornado.web.HTTPError(404, f"no run {run_id!r}")
    _not_a_link(Path(row.run_dir))
    return Run(row.run_dir, run_id=row.id, name=row.name), row


class _LossTrail:
    """Per run: the last logged loss and a bounded, evenly thinned history of it for the sidebar's
    sparkline, read incrementally: each poll costs only the bytes appended since the last one, however
    long the run's metrics.jsonl has grown."""

    def __init__(self, points: int = SPARK_POINTS) -> None:
        self._lock = threading.Lock()
        self._points = points
        self._seen: dict[str, _Trail] = {}

    def get(self, path: Path, below: Path | None = None) -> tuple[float | None, list[float]]:
        """The last loss and the thinned history; raises NotRegularFile when the file is a FIFO or a link
        (``below``: the run directory, under which no link is followed)."""
        key = str(path)
        # Held for the (incremental, bounded) read: two tabs polling the same run must not add its new
        # records twice.
        with self._lock:
            trail = self._seen.pop(key, None) or _Trail(JsonlTail(path, below=below))
            if trail.reader.replaced():  # gone, or a run dir rebuilt: the history held is another run's
                trail = _Trail(JsonlTail(path, below=below))
            # On an error the trail is dropped (popped above): a file replaced by a FIFO starts afresh.
            for rec in trail.reader.records(max_bytes=MAX_READ_BYTES):
                if isinstance(rec.get("loss"), (int, float)):
                    trail.add(float(rec["loss"]), self._points)
                if isinstance(rec.get("t"), (int, float)) and isinstance(rec.get("step"), (int, float)):
                    trail.times.append((float(rec["t"]), float(rec["step"])))
            self._seen[key] = trail
            return trail.last, list(trail.kept)

    def timing(self, path: Path) -> tuple[int, list[tuple[float, float]]]:
        """The losses read so far and the (time, step) of the last records, as the last :meth:`get` left
        them (for the time left, ``control/runs/eta``)."""
        with self._lock:
            trail = self._seen.get(str(path))
            return (0, []) if trail is None else (trail.seen, list(trail.times))


@dataclass
class _Trail:
    reader: JsonlTail
    last: float | None = None
    seen: int = 0  # losses read so far
    stride: int = 1  # every stride-th loss is kept; doubles whenever the kept list fills up
    kept: list[float] = field(default_factory=list)
    times: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=eta.RECENT + 1))

    def add(self, loss: float, points: int) -> None:
        if self.seen % self.stride == 0:
            self.kept.append(loss)
            if len(self.kept) >= points:
                self.kept = self.kept[::2]
                self.stride *= 2
        self.seen += 1
        self.last = loss


_LOSS_TRAIL = _LossTrail()


# The folder the notebooks are opened from (the server's root_dir): run folders are shown relative to it.
_ROOT: list[Path] = []


def _folder(run_dir: Path) -> str:
    """The folder holding a run directory, as a person reads it: relative to the server's root when
    inside it ("runs"), else with the home folder as ~ ("~/data/nbtrain_runs")."""
    folder = run_dir.parent
    for root in _ROOT:
        with contextlib.suppress(ValueError):
            rel = folder.relative_to(root)
            return str(rel) if str(rel) != "." else "."
    home = Path.home()
    with contextlib.suppress(ValueError):
        return str(Path("~") / folder.relative_to(home))
    return str(folder)


def _resume_note(run: Run, st: RunStatus) -> str | None:
    """None when Resume can continue the run; else why not, in the words the resume route would use."""
    if not st.done:
        return f"the run is {st.state}"
    if st.state == "completed":
        return "the run completed; nothing to resume"
    try:
        ckpt = latest_complete_checkpoint(run.paths)
    except OSError as e:
        return str(e)
    return None if ckpt is not None else "no checkpoint saved"  # (only complete ones count)


def _model_name(run: Run) -> str:
    """The model a run trains as the sidebar shows it: a Hub id as it is, a folder or file by its name."""
    try:
        model = str((run.resolved.get("config") or {}).get("model") or "")
    except (NbtrainError, OSError, ValueError, AttributeError):
        return ""
    return Path(model).name if model.startswith(("/", ".", "~")) else model


def _sweep_of(run: Run) -> dict[str, Any] | None:
    """A sweep's trial: its sweep's id and name and its trial number (the card says so), else None."""
    try:
        sweep = run.resolved.get("sweep")
    except (NbtrainError, OSError, ValueError):
        return None
    if not isinstance(sweep, dict) or not isinstance(sweep.get("trial"), int):
        return None
    return {
        "id": str(sweep.get("id")),
        "name": str(sweep.get("name") or sweep.get("id")),
        "trial": sweep["trial"],
    }


def _server(run: Run) -> dict[str, Any] | None:
    """The run's live model server as the sidebar shows it (its URL, never its key), or None."""
    from nbtrain.control.jobs.serve import ServeError, find_server

    try:
        handle = find_server(run)
    except ServeError as e:  # a serve.json another user wrote: its URL and pid are not acted on, only named
        return {"url": None, "note": str(e)}
    except (NbtrainError, OSError, ValueError, KeyError, TypeError):
        return None  # a serve.json being written, or torn: the next poll reads it
    if handle is None:
        return None
    return {"url": handle.url, "pid": handle.pid, "engine": handle.engine, "device": handle.device}


def _status_dict(run: Run, row: registry.Row, st: RunStatus) -> dict[str, Any]:
    problems: list[str] = []  # files of the run that cannot be read (the rest of it still shows)
    try:
        loss, losses = _LOSS_TRAIL.get(run.paths.metrics, run.dir)
    except OSError as e:  # NotRegularFile (a FIFO, a link), or not readable by this user
        loss, losses = None, []
        problems.append(str(e))
    resume_note = _resume_note(run, st)
    left = _time_left(run, st)
    return {
        "id": run.id,
        "name": run.name,
        "run_dir": str(run.dir),
        "model": _model_name(run),
        "folder": _folder(run.dir),
        "created": row.created,
        "resumable": resume_note is None,
        "resume_note": resume_note,
        "sweep": _sweep_of(run),
        "state": st.state,
        "phase": st.phase_text(),  # while starting: "downloading model org/x 3.1 / 15.2 GB, 40 MB/s", ...
        "stopping": st.stop_text() is not None,  # a stop is under way (the chip and Stop say so)
        "done": st.done,
        "step": st.step,
        "max_steps": st.max_steps,
        "error": st.error,
        "updated": st.updated,
        "loss": loss,
        "losses": losses,
        # while it trains: seconds to its last step and in words, and before its first loss when it comes
        "left": left.seconds,
        "left_text": left.text,
        "first_loss_text": left.first_loss_text,
        "problems": problems,
        "server": _server(run),
    }


def _time_left(run: Run, st: RunStatus) -> eta.TimeLeft:
    """The one estimate the cell's header shows too (``control/runs/eta``), from the records the loss trail
    read and status.json; the pause before this attempt's launch left out of the records' timing."""
    if st.state != "running":
        return eta.TimeLeft()
    losses, times = _LOSS_TRAIL.timing(run.paths.metrics)
    read: list[Any] = []
    for path in (run.paths.resolved, run.paths.launch):  # launch.json: none for a notebook_launcher run
        try:
            data = read_json(path, max_bytes=MAX_JSON_BYTES, below=run.dir)
        except (OSError, ValueError):
            data = None
        read.append(data if isinstance(data, dict) else {})
    args, launch = read[0].get("train_args"), read[1].get("start_time")
    pauses = ((float(launch), float(launch)),) if isinstance(launch, (int, float)) else ()
    return eta.time_left(
        st,
        logged=eta.logged_seconds_per_step(times, pauses),
        losses=losses,
        loss_every=eta.loss_every(args if isinstance(args, dict) else None, st.max_steps),
        now=time.time(),
    )


def _unreadable(row: registry.Row, e: Exception) -> dict[str, Any]:
    """A listed run none of whose state can be read (its directory is a link, its launch.json a FIFO...)."""
    return {
        "id": row.id,
        "name": row.name,
        "run_dir": row.run_dir,
        "model": "",
        "folder": _folder(Path(row.run_dir)),
        "created": row.created,
        "resumable": False,
        "resume_note": str(e),
        "state": "failed",
        "done": True,
        "step": 0,
        "max_steps": None,
        "error": {"type": "unreadable", "message": str(e)},
        "updated": None,
        "loss": None,
        "losses": [],
        "left": None,
        "left_text": None,
        "first_loss_text": None,
        "problems": [str(e)],
        "server": None,
    }


def list_runs() -> list[dict[str, Any]]:
    out = []
    for row in registry.rows():
        if not (os.path.islink(row.run_dir) or Path(row.run_dir).is_dir()):
            continue  # deleted by hand; the registry only says where runs were
        try:
            _not_a_link(Path(row.run_dir))
            run = Run(row.run_dir, run_id=row.id, name=row.name)
            out.append(_status_dict(run, row, run.status()))
        except (NbtrainError, OSError, ValueError) as e:  # this run is marked; every other run still lists
            out.append(_unreadable(row, e))
    return out


def run_status(run_id: str) -> dict[str, Any]:
    run, row = _lookup(run_id)
    return _status_dict(run, row, run.status())


def run_metrics(run_id: str, offset: int) -> dict[str, Any]:
    run, _ = _lookup(run_id)
    # The client holds the offset between requests; an offset into an older file (the run directory was
    # rebuilt) starts again from 0 with "reset", telling it to drop its history.
    # At most MAX_READ_BYTES per request: "caught_up" false says there is more to ask for at once. A line
    # longer than any record is skipped ("skipped" counts them) and the offset moves past it, so no later
    # request reads it again.
    reader = JsonlTail(run.paths.metrics, offset, below=run.dir)
    records = reader.read(max_records=MAX_RECORDS, max_bytes=MAX_READ_BYTES)
    return {
        "records": records,
        "offset": reader.offset,
        "reset": reader.restarted,
        "caught_up": reader.caught_up,
        "skipped": reader.skipped,
    }


def run_logs(run_id: str, n: int) -> dict[str, Any]:
    run, _ = _lookup(run_id)
    path = run.paths.rank_log(0)
    # read_tail: the last 256 kB at most; a FIFO or a link raises NotRegularFile (a 409 naming it)
    # the trainer's printed metrics dicts as "loss 3.086 · grad_norm 2.494 · ..." (logtext)
    return {"id": run.id, "path": str(path), "text": readable(read_tail(path, n, below=run.dir))}


def run_figure(run_id: str, since: str | None) -> dict[str, Any]:
    """The run's dashboard figure for its page (``runfigure``: the notebook dashboard's own figure)."""
    from nbtrain.ui.server import runfigure

    run, _ = _lookup(run_id)
    return runfigure.run_figure(run, since)


def stop_run(run_id: str, timeout: float | None) -> dict[str, Any]:
    run, row = _lookup(run_id)
    # The REST API is the sidebar's: status.json's stop_reason says the sidebar asked (not the SIGTERM).
    return _status_dict(run, row, run.stop(timeout=timeout, by="sidebar"))


def resume_run(run_id: str) -> dict[str, Any]:
    """Continue a stopped or failed run from its last complete checkpoint: control.start.resume, which takes
    the run's writer lock (two resumes of one run cannot both go on) and refuses a run that is running,
    completed or has no complete checkpoint, saying so (a 409 with its message)."""
    from nbtrain.control.start import resume

    run, row = _lookup(run_id)
    resumed = resume(run)
    return _status_dict(resumed, row, resumed.status())


def delete_run(run_id: str) -> dict[str, Any]:
    """Move a finished run's directory to the trash folder under its runs root and unregister it
    (control.runs.run.trash_run); refused for a run that runs, or one with a model server running."""
    from nbtrain.control.jobs.serve import find_server

    run, _ = _lookup(run_id)
    if find_server(run) is not None:
        raise NbtrainError(
            f"run {run_id} has a model server running: stop it first (%finetune serve --stop {run_id})"
        )
    return {"id": run_id, "trash": str(trash_run(run))}


def stop_server(run_id: str) -> dict[str, Any]:
    """Stop the run's model server (SIGTERM to its process group, checked to be the one serve.json names,
    SIGKILL after 15 s); a run without one is said so (a 409)."""
    from nbtrain.control.jobs.serve import find_server

    run, row = _lookup(run_id)
    handle = find_server(run)
    if handle is None:
        raise NbtrainError(f"run {run_id} has no model server running")
    handle.stop()
    return _status_dict(run, row, run.status())


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


def _train_keys(objective: str) -> dict[str, dict[str, Any]]:
    """``train.<name>`` entries for the TRL config of ``objective`` (what the validator accepts there)."""
    from nbtrain.control.config import trainargs

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
    from nbtrain.contract.objectives import OBJECTIVES
    from nbtrain.control.config.reference import schema_keys
    from nbtrain.control.config.schema import RunConfig

    schema = RunConfig.model_json_schema()
    keys = schema_keys(schema)
    # train: takes the objective's TRL config names (SFTConfig unless the cell says `objective: dpo` ...);
    # `keys` carries SFT's, and `objectives` every objective's own train keys, so the editor can complete
    # what the validator will accept for the objective the cell names.
    keys.update(_train_keys("sft"))
    objectives = {name: _train_keys(name) for name in OBJECTIVES}
    return {"schema": schema, "keys": keys, "objectives": objectives}


def validate_config(text: str) -> dict[str, Any]:
    """What would stop the config ``text`` (a cell's YAML) from launching: nbtrain.control.prepare's
    ``validate``, the one entry the panel, the magics and the CLI use too, with the same messages.

    Relative paths (model, data, the lab preset) resolve against the server's working directory, the
    root the notebooks are opened from. Reward functions are left unchecked: they live in a notebook's
    kernel, which the server cannot see (the kernel checks them when the run starts)."""
    from nbtrain.control.prepare import validate

    problems = validate(text, capture_notebook=False)
    return {"valid": not problems, "problems": [asdict(p) for p in problems]}


_SCHEMA_CACHE: dict[str, Any] = {}


def cached_schema() -> dict[str, Any]:
    # The schema is fixed for the server's life; trainargs may build its field list in a subprocess once.
    if not _SCHEMA_CACHE:
        _SCHEMA_CACHE.update(config_schema())
    return _SCHEMA_CACHE


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


class FigureHandler(_Base):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        since = self.get_argument("since", None)
        await self._reply(run_figure, run_id, since if since and len(since) <= 1000 else None)


class StopHandler(_Base):
    @tornado.web.authenticated
    async def post(self, run_id: str) -> None:
        body = self.get_json_body() or {}
        timeout = None  # none given (the sidebar): the step in progress and its checkpoint are waited for
        try:
            if body.get("timeout") is not None:
                timeout = float(body["timeout"])
        except (TypeError, ValueError, AttributeError):
            raise tornado.web.HTTPError(400, "timeout must be a number of seconds") from None
        if timeout is not None and not 0 < timeout <= 600:
            raise tornado.web.HTTPError(400, "timeout must be between 0 and 600 seconds")
        await self._reply(stop_run, run_id, timeout)


class CheckpointHandler(_Base):
    @tornado.web.authenticated
    async def post(self, run_id: str) -> None:
        await self._reply(checkpoint_run, run_id)


class ResumeHandler(_Base):
    @tornado.web.authenticated
    async def post(self, run_id: str) -> None:
        await self._reply(resume_run, run_id)


class DeleteHandler(_Base):
    @tornado.web.authenticated
    async def post(self, run_id: str) -> None:
        await self._reply(delete_run, run_id)


class ServerStopHandler(_Base):
    @tornado.web.authenticated
    async def post(self, run_id: str) -> None:
        await self._reply(stop_server, run_id)


class GpusHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        # latest() only waits for the sampler's first result; off the loop so that wait blocks no one.
        await self._reply(GPU_SAMPLER.latest)


class SchemaHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        await self._reply(cached_schema)


class ValidateHandler(_Base):
    @tornado.web.authenticated
    async def post(self) -> None:
        body = self.get_json_body() or {}
        text = body.get("config") if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise tornado.web.HTTPError(400, 'the body is {"config": "<the YAML text of a config>"}')
        await self._reply(validate_config, text)


def setup_handlers(web_app: Any) -> None:
    base = url_path_join(web_app.settings.get("base_url", "/"), "nbtrain")
    root = web_app.settings.get("server_root_dir")
    if root:
        given = Path(os.path.expanduser(root))
        _ROOT[:] = [given, given.resolve()]
    # [^/]+ lets an encoded slash (%2F) reach the handler, where the run id check refuses it with a 400.
    run = r"runs/(?P<run_id>[^/]+)"
    routes: list[tuple[str, type[_Base]]] = [
        ("runs", RunsHandler),
        (run, RunHandler),
        (run + "/metrics", MetricsHandler),
        (run + "/logs", LogsHandler),
        (run + "/figure", FigureHandler),
        (run + "/stop", StopHandler),
        (run + "/checkpoint", CheckpointHandler),
        (run + "/resume", ResumeHandler),
        (run + "/delete", DeleteHandler),
        (run + "/server/stop", ServerStopHandler),
        *sweeps.ROUTES,
        ("gpus", GpusHandler),
        ("schema", SchemaHandler),
        ("validate", ValidateHandler),
    ]
    web_app.add_handlers(".*$", [(url_path_join(base, path) + "/?$", h) for path, h in routes])
