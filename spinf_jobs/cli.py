"""`spinf-jobs` command line: one entry point, one subcommand per job.

    spinf-jobs score REQUEST.json|-   score one request on the engine, print the response JSON
    spinf-jobs parity --model NAME     the engine against an independent transformers reference
    spinf-jobs serve | api | worker | demo   the service (spinf_jobs/service_commands.py)
    spinf-jobs calibrate ...           fit a prompt pack's calibration (spinf_jobs/calibrate_command.py)
    spinf-jobs submit | jobs ...       submit a JSONL file, follow, fetch, cancel, list jobs (spinf_jobs/jobs_commands.py)

The engine (and torch) is imported inside the commands that need it, never at import time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from spinf_jobs.calibrate_command import add_calibrate_command
from spinf_jobs.jobs_commands import add_jobs_commands
from spinf_jobs.service_commands import add_service_commands
from spinf_jobs.setting_flags import add_setting_flag, settings_from_args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except Exception as error:  # settings from the environment that cannot be read: one line, no traceback
        line = settings_error_line(error)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2


def settings_error_line(error: Exception) -> str | None:
    """One line naming the bad setting, for a pydantic-settings error; None for anything else."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    if isinstance(error, SettingsError):
        return f"invalid settings: {error} (SPINF_* variables take JSON for lists and keys)"
    if isinstance(error, ValidationError) and error.title == "Settings":
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        return f"invalid settings: SPINF_{str(first['loc'][0]).upper()}: {field}: {first['msg']}"
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spinf-jobs", description=__doc__.split("\n\n")[0])
    subparsers = parser.add_subparsers(title="commands")
    _add_score(subparsers)
    _add_parity(subparsers)
    add_service_commands(subparsers)
    add_calibrate_command(subparsers)
    add_jobs_commands(subparsers)
    return parser


def _add_model_flag(parser: argparse.ArgumentParser, help: str) -> None:
    add_setting_flag(parser, "default_model", "--model", help=help, metavar="NAME")


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    _add_model_flag(parser, "served model name or local HF folder of a request without `model`")
    add_setting_flag(parser, "device")
    add_setting_flag(parser, "max_num_batched_tokens", metavar="N")


def _add_score(subparsers) -> None:
    parser = subparsers.add_parser("score", help="score one request (JSON file or - for stdin)")
    parser.add_argument("request", help="path to a request JSON file, or - for stdin")
    _add_engine_flags(parser)
    parser.set_defaults(handler=_score)


def _score(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from contract.protocol import ScoringRequest
    from engine import RequestError
    from workers.engines import engine_for

    raw = sys.stdin.buffer.read() if args.request == "-" else Path(args.request).read_bytes()
    try:
        request = ScoringRequest.model_validate_json(raw)
    except ValidationError as error:
        print(f"invalid request:\n{error}", file=sys.stderr)
        return 2
    settings = settings_from_args(args)
    engine = engine_for(request.model or settings.default_model, settings)
    [result] = engine.score_requests([request.model_copy(update={"model": engine.model_name})]).results
    if isinstance(result, RequestError):
        print(f"invalid request: {result.field}: {result.message}", file=sys.stderr)
        return 2
    sys.stdout.write(orjson.dumps(result.model_dump(exclude_none=True), option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def _add_parity(subparsers) -> None:
    parser = subparsers.add_parser("parity", help="compare the engine with an independent transformers reference")
    _add_model_flag(parser, "served model name or local HF folder to check")
    parser.add_argument("--contents", type=int, default=None, help="use only the first N contents")
    parser.add_argument("--leak-sibling", action="store_true", help="negative control: break the tree mask")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    parser.add_argument("--report", default=None, help="write every comparison row to this JSON file")
    parser.add_argument("--slots", action="store_true", help="extraction slots instead of option queries")
    parser.add_argument("--greedy", action="store_true", help="with --slots, negative control: a greedy decoder")
    parser.set_defaults(handler=_parity)


def _parity(args: argparse.Namespace) -> int:
    if args.slots:
        return _slot_parity(args)
    from engine.checks.parity import run_parity, summarize

    model = settings_from_args(args).default_model
    rows = run_parity(model, num_contents=args.contents, leak_sibling=args.leak_sibling)
    max_logprob, worst = summarize(rows)
    if args.report:
        with open(args.report, "wb") as file:
            file.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    print(f"max_abs_diff_any_field={worst:.3g} (logprob, p, floor_p, residual)")
    print(f"max_abs_logprob_diff={max_logprob:.3g} items={len(rows)}")
    return 0 if worst <= args.tolerance else 1


def _slot_parity(args: argparse.Namespace) -> int:
    from engine.checks.parity_slots import is_passing, run_slot_parity, summarize_slots
    from engine.extraction.decoder import BeamDecoder

    decoder = BeamDecoder(max_width=1) if args.greedy else None
    # the reference decodes over transformers' own KV cache (whole re-reads agree to ~4e-6)
    model = settings_from_args(args).default_model
    rows = run_slot_parity(model, decoder=decoder, num_contents=args.contents, whole=False)
    if args.report:
        with open(args.report, "wb") as file:
            file.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    print(summarize_slots(rows))
    return 0 if is_passing(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
