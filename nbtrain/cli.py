"""``nbtrain`` command line: the same verbs as ``%finetune``, over the same core.

nbtrain run CONFIG.yaml [--name N] [--dry-run] [--wait]
nbtrain ls | status RUN | logs RUN [-n N] | stop RUN | wait RUN | attach RUN
nbtrain eval RUN [--compare-base] [--tasks T ...] | export RUN --to DIR [--no-merge] [--dtype bf16]
nbtrain tiny-model DIR | example-data FILE
"""

from __future__ import annotations

import argparse
import sys
import time

from nbtrain import api
from nbtrain.errors import ConfigError, NbtrainError
from nbtrain.runs import Run, get_run
from nbtrain.ui.text import runs_table, status_text


def _follow(run: Run, timeout: float | None, quiet: bool = False) -> int:
    """Print progress until the run ends; exit code 0 for completed, 1 otherwise."""
    from nbtrain.ui.live import LiveView

    view = LiveView(run)
    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    while True:
        st = view.poll()
        line = view.text(st)
        if line != last and not quiet:
            print(line, flush=True)
            last = line
        if st.done:
            break
        if deadline is not None and time.monotonic() > deadline:
            print(f"timed out after {timeout} s; the run goes on", file=sys.stderr)
            return 3
        time.sleep(1.0)
    print(status_text(run, st))
    return 0 if st.state == "completed" else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="nbtrain", description="Fine-tune LLMs; runs live in run directories.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="validate, plan and start a run from a YAML config")
    p.add_argument("config")
    p.add_argument("--name")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--wait", action="store_true", help="follow the run until it ends")
    sub.add_parser("ls", aliases=["list"], help="list runs")
    for verb, text in (
        ("status", "a run's state"),
        ("attach", "follow a run until it ends"),
        ("wait", "wait for a run to end; exit 1 unless it completed"),
    ):
        q = sub.add_parser(verb, help=text)
        q.add_argument("run")
        if verb != "status":
            q.add_argument("--timeout", type=float, default=None)
    q = sub.add_parser("logs", help="the last lines of a run's log")
    q.add_argument("run")
    q.add_argument("-n", type=int, default=40)
    q = sub.add_parser("stop", help="stop a run after its current step")
    q.add_argument("run")
    q.add_argument("--timeout", type=float, default=60.0)
    q = sub.add_parser("estimate", help="will it fit? memory estimate of a config and the alternatives")
    q.add_argument("config")
    q = sub.add_parser("preview", help="the first examples as the model sees them, and token lengths")
    q.add_argument("config", help="a .yaml config, or a run (id, name, directory)")
    q.add_argument("-n", type=int, default=5)
    q.add_argument("--stats-rows", type=int, default=2000)
    q = sub.add_parser("probe", help="run a few real steps: measured peak memory and speed")
    q.add_argument("config")
    q.add_argument("--steps", type=int, default=5)
    q = sub.add_parser("checkpoint", help="save a checkpoint after the current step")
    q.add_argument("run")
    q = sub.add_parser("resume", help="continue a stopped or failed run from its last checkpoint")
    q.add_argument("run")
    q.add_argument("--wait", action="store_true")
    q = sub.add_parser("eval", help="held-out loss and perplexity of a run (and lm-eval tasks)")
    q.add_argument("run")
    q.add_argument("--compare-base", action="store_true")
    q.add_argument("--file", default=None)
    q.add_argument("--tasks", nargs="+", default=None)
    q.add_argument("--limit", type=float, default=None)
    q = sub.add_parser("export", help="save a run's model as a standalone directory (LoRA merged)")
    q.add_argument("run")
    q.add_argument("--to", required=True)
    q.add_argument("--merge", action=argparse.BooleanOptionalAction, default=True)
    q.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    q.add_argument("--overwrite", action="store_true")
    q.add_argument("--push-to-hub", default=None, metavar="REPO")
    q.add_argument("--public", action="store_true")
    q = sub.add_parser("tiny-model", help="build the tiny local test model")
    q.add_argument("dir")
    q = sub.add_parser("example-data", help="write the addition example dataset")
    q.add_argument("file")
    q.add_argument("--format", default="messages", choices=["messages", "alpaca", "sharegpt", "text"])
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "run":
            prep = api.prepare(args.config, name=args.name)
            if args.dry_run:
                print(prep.summary())
                return 0
            run = api.start(prep)
            print(f"started {run.id}\n  dir: {run.dir}")
            return _follow(run, None) if args.wait else 0
        if args.cmd in ("ls", "list"):
            df = runs_table(api.runs())
            print(df.to_string(index=False) if len(df) else "no runs yet")
            return 0
        if args.cmd == "status":
            print(status_text(get_run(args.run)))
            return 0
        if args.cmd == "logs":
            print(get_run(args.run).logs(args.n))
            return 0
        if args.cmd == "stop":
            run = get_run(args.run)
            print(f"run {run.id}: {run.stop(timeout=args.timeout).describe()}")
            return 0
        if args.cmd in ("wait", "attach"):
            return _follow(get_run(args.run), args.timeout, quiet=args.cmd == "wait")
        if args.cmd == "estimate":
            print(api.estimate(args.config).text())
            return 0
        if args.cmd == "preview":
            from nbtrain.datapreview import preview

            print(preview(args.config, n=args.n, stats_rows=args.stats_rows).text())
            return 0
        if args.cmd == "probe":
            print(api.probe(args.config, steps=args.steps).text())
            return 0
        if args.cmd == "checkpoint":
            get_run(args.run).checkpoint()
            print("checkpoint requested")
            return 0
        if args.cmd == "resume":
            run = api.resume(args.run)
            print(f"resumed {run.id}")
            return _follow(run, None) if args.wait else 0
        if args.cmd == "eval":
            from nbtrain.evaluate import evaluate

            report = evaluate(args.run, compare_base=args.compare_base, file=args.file, tasks=args.tasks,
                              limit=args.limit)  # fmt: skip
            print(f"{report.table().to_string()}\n(saved in {report.path})")
            return 0
        if args.cmd == "export":
            from nbtrain.export import export

            out = export(args.run, to=args.to, merge=args.merge, dtype=args.dtype, overwrite=args.overwrite,
                         push_to_hub=args.push_to_hub, private=not args.public)  # fmt: skip
            print(repr(out))
            return 0
        if args.cmd == "tiny-model":
            print(api.make_tiny_model(args.dir))
            return 0
        if args.cmd == "example-data":
            print(api.example_data(args.file, args.format))
            return 0
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    except NbtrainError as e:
        print(f"nbtrain: {e}", file=sys.stderr)
        return 1
    raise AssertionError(args.cmd)


if __name__ == "__main__":
    raise SystemExit(main())
