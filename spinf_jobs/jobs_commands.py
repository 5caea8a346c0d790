"""`spinf-jobs submit` and `spinf-jobs jobs status|results|cancel|list`: jobs from the command line.

    submit DATA.jsonl (--queries Q.json | --pack ID ...) [--wait] [--output PATH]
      rows {custom_id, text | messages} --client.Client.submit--> job id
      --wait: a progress bar (rows done, rows/s, ETA) until the job ends, then its rows -> PATH;
              Ctrl-C leaves the job running and prints how to pick it up again
    jobs status ID | results ID [--output PATH] | cancel ID | list [--limit N]

The service is SPINF_BASE_URL (default http://127.0.0.1:8000) with SPINF_API_KEY, else the key
`spinf-jobs serve` wrote to SPINF_DATA_DIR/api-key. `add_jobs_commands(subparsers)` is wired
into spinf_jobs/cli.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson
from tqdm import tqdm

from client import Client, SpinfError
from contract.payloads import JobView

INTERRUPTED = 130  # the exit status of a command stopped by SIGINT


def add_jobs_commands(subparsers) -> None:
    submit = subparsers.add_parser("submit", help="submit a JSONL file of rows as a job (and follow it with --wait)")
    submit.add_argument("data", type=Path, help="JSONL: {custom_id, text | messages} per line")
    submit.add_argument("--queries", type=Path, help="scoring JSON: {\"queries\": [...]} or a list of queries")
    submit.add_argument("--pack", action="append", default=[], metavar="ID", help="a prompt pack (repeatable)")
    submit.add_argument("--model", default=None, help="served model (default: the service's)")
    submit.add_argument("--wait", action="store_true", help="show progress until the job ends, then write its rows")
    submit.add_argument("--output", type=Path, default=None, help="results file (default: <job id>.results.jsonl)")
    _add_service_flags(submit)
    submit.set_defaults(handler=_submit)

    jobs = subparsers.add_parser("jobs", help="a job's status, results or cancel; or list your jobs")
    actions = jobs.add_subparsers(title="actions", required=True)
    for name, handler, text in (("status", _status, "the job's status and progress (JSON)"),
                                ("results", _results, "the ended job's rows (JSONL)"),
                                ("cancel", _cancel, "stop the job's remaining rows")):
        action = actions.add_parser(name, help=text)
        action.add_argument("job_id")
        if name == "results":
            action.add_argument("--output", type=Path, default=None, help="write to this file instead of stdout")
        _add_service_flags(action)
        action.set_defaults(handler=handler)
    listing = actions.add_parser("list", help="your jobs, newest first")
    listing.add_argument("--limit", type=int, default=20, help="at most this many")
    _add_service_flags(listing)
    listing.set_defaults(handler=_list)


def _add_service_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default=None, help="the service (default: SPINF_BASE_URL or 127.0.0.1:8000)")


def _client(args: argparse.Namespace) -> Client:
    return Client(args.base_url, os.environ.get("SPINF_API_KEY") or _local_key())


def _local_key() -> str | None:
    """The key `spinf-jobs serve` made for this machine, if there is one."""
    data_dir = Path(os.environ.get("SPINF_DATA_DIR") or Path.home() / ".spinf-jobs")
    path = data_dir / "api-key"
    return path.read_text().strip() if path.exists() else None


def _scoring(path: Path | None) -> dict:
    if path is None:
        return {}
    spec = orjson.loads(path.read_bytes())
    return {"queries": spec} if isinstance(spec, list) else spec


def _submit(args: argparse.Namespace) -> int:
    if args.queries is None and not args.pack:
        print("spinf-jobs submit: give --queries Q.json or --pack ID", file=sys.stderr)
        return 2
    with _client(args) as spinf:
        try:
            job = spinf.submit_file(args.data, _scoring(args.queries), args.pack, args.model)
        except (SpinfError, ValueError) as error:
            print(f"not submitted: {error}", file=sys.stderr)
            return 1
        print(job.id)
        if not args.wait:
            print(f"follow it: spinf-jobs jobs status {job.id}", file=sys.stderr)
            return 0
        try:
            ended = _follow(spinf, job)
        except KeyboardInterrupt:
            print(resume_hint(job.id), file=sys.stderr)
            return INTERRUPTED
        return _write_results(spinf, ended, args.output or Path(f"{job.id}.results.jsonl"))


def _follow(spinf: Client, job: JobView) -> JobView:
    """A bar of rows done (tqdm shows rows/s and the ETA) until the job ends."""
    with tqdm(total=job.progress.total, unit="row", desc=job.id, file=sys.stderr) as bar:

        def show(view: JobView) -> None:
            bar.total = view.progress.total
            bar.update(view.progress.done - bar.n)

        return spinf.wait(job.id, progress=show, poll_s=0.25)


def resume_hint(job_id: str) -> str:
    return (f"\nstopped following {job_id}; the job keeps running. Pick it up again with:\n"
            f"  spinf-jobs jobs status {job_id}\n  spinf-jobs jobs results {job_id}\n"
            f"  spinf-jobs jobs cancel {job_id}\n  spinf-jobs jobs list")


def _write_results(spinf: Client, job: JobView, path: Path) -> int:
    if job.status.value != "succeeded":
        print(f"job {job.id} ended {job.status.value}: {job.error or ''}", file=sys.stderr)
        return 1
    with path.open("wb") as file:
        for row in spinf.results(job.id):
            file.write(orjson.dumps(row) + b"\n")
    print(f"{job.progress.done} rows ({job.progress.failed} errors) -> {path}", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    return _print_view(args, lambda spinf: spinf.job(args.job_id))


def _cancel(args: argparse.Namespace) -> int:
    return _print_view(args, lambda spinf: spinf.cancel(args.job_id))


def _print_view(args: argparse.Namespace, call) -> int:
    with _client(args) as spinf:
        try:
            view = call(spinf)
        except SpinfError as error:
            print(error, file=sys.stderr)
            return 1
    sys.stdout.write(view.model_dump_json(indent=2) + "\n")
    return 0


def _results(args: argparse.Namespace) -> int:
    with _client(args) as spinf:
        try:
            rows = [orjson.dumps(row) + b"\n" for row in spinf.results(args.job_id)]
        except SpinfError as error:
            print(error, file=sys.stderr)
            return 1
    if args.output is None:
        sys.stdout.buffer.write(b"".join(rows))
    else:
        args.output.write_bytes(b"".join(rows))
    return 0


def _list(args: argparse.Namespace) -> int:
    with _client(args) as spinf:
        try:
            for index, view in enumerate(spinf.jobs(page_size=min(args.limit, 100))):
                if index >= args.limit:
                    break
                progress = view.progress
                print(f"{view.id}  {view.status.value:<9}  {progress.done}/{progress.total}  {view.model}")
        except SpinfError as error:
            print(error, file=sys.stderr)
            return 1
    return 0
