"""The long Schemathesis run: `st run --checks all` over every operation of the live service
(API + a worker on smollm2-135m, its own Redis, a valid key), at least `--min-requests`
generated requests; its summary is written to
benchmarks/results/schemathesis-smollm2-135m-instruct.json (the events to --events).

    python3 benchmarks/schemathesis_long.py --max-examples 200

Reports: requests made, responses >= 500 (must be 0), the failed checks by name, the schema
violations (the response-side checks — response_schema_conformance, content_type_conformance,
response_headers_conformance, status_code_conformance —: must be 0), and the refusals of
schema-valid bodies that are none of CROSS_FIELD_RULES (must be none).
`--from-events FILE` summarises the events of a run cut short (run_complete: false).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from result_files import new_result, write_json  # noqa: E402
from reliability.schemathesis_service import (  # noqa: E402
    MODEL, live_service, rejections, run_schemathesis, summary, unexplained)

RESPONSE_CHECKS = ("response_schema_conformance", "content_type_conformance", "response_headers_conformance",
                   "status_code_conformance")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=200,
                        help="examples per operation in the fuzzing phase (the coverage phase makes ~1,650 requests whatever it is)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-requests", type=int, default=5000)
    parser.add_argument("--events", type=Path, default=None, help="keep the NDJSON events here")
    parser.add_argument("--from-events", type=Path, default=None,
                        help="summarise the events of a run already made (e.g. one cut short) instead of running")
    args = parser.parse_args()
    if args.from_events:
        write(summary(args.from_events), rejections(args.from_events), args, exit_code=None, wall_s=None,
              complete=False)
        return
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "events.ndjson"
        started = time.monotonic()
        with live_service(Path(tmp)) as base_url:
            exit_code = run_schemathesis(base_url, args.max_examples, report, seed=args.seed, timeout_s=6 * 3600)
        result, refused = summary(report), rejections(report)
        if args.events:
            args.events.write_bytes(report.read_bytes())
    write(result, refused, args, exit_code=exit_code, wall_s=round(time.monotonic() - started, 1), complete=True)


def write(result: dict, refused: list[dict], args, exit_code: int | None, wall_s: float | None,
          complete: bool) -> None:
    failures = result["failures_by_check"]
    result = new_result(model=MODEL, max_examples=args.max_examples, seed=args.seed, exit_code=exit_code,
                        wall_s=wall_s, run_complete=complete, **result,
                        num_schema_violations=sum(failures.get(name, 0) for name in RESPONSE_CHECKS),
                        num_refusals_by_named_rules=len(refused) - len(unexplained(refused)),
                        unexplained_refusals=unexplained(refused)[:20],
                        enough_requests=result["num_requests"] >= args.min_requests)
    path = write_json(result, "schemathesis", MODEL)
    print(json.dumps(result, indent=1))
    print(f"wrote {path}")
    if not result["enough_requests"]:
        sys.exit(f"only {result['num_requests']} requests (< {args.min_requests}): raise --max-examples")


if __name__ == "__main__":
    main()
