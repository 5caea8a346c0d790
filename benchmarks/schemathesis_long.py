"""The long Schemathesis run: `st run --checks all` over every operation of the live service
(API + a worker on smollm2-135m, its own Redis, a valid key), at least `--min-requests`
generated requests; its summary is written to
benchmarks/results/schemathesis-smollm2-135m-instruct.json (the events to --events).

    python3 benchmarks/schemathesis_long.py --max-examples 25

Reports: requests made, responses >= 500 (must be 0), the failed checks by name (must be
none; the response-side ones — response_schema_conformance, content_type_conformance,
response_headers_conformance, status_code_conformance — are the schema violations).
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
from reliability.schemathesis_service import MODEL, live_service, run_schemathesis, summary  # noqa: E402

RESPONSE_CHECKS = ("response_schema_conformance", "content_type_conformance", "response_headers_conformance",
                   "status_code_conformance")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=25, help="examples per operation and phase")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-requests", type=int, default=5000)
    parser.add_argument("--events", type=Path, default=None, help="keep the NDJSON events here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "events.ndjson"
        started = time.monotonic()
        with live_service(Path(tmp)) as base_url:
            exit_code = run_schemathesis(base_url, args.max_examples, report, seed=args.seed, timeout_s=6 * 3600)
        result = summary(report)
        if args.events:
            args.events.write_bytes(report.read_bytes())
    failures = result["failures_by_check"]
    result = new_result(model=MODEL, max_examples=args.max_examples, seed=args.seed, exit_code=exit_code,
                        wall_s=round(time.monotonic() - started, 1), **result,
                        num_schema_violations=sum(failures.get(name, 0) for name in RESPONSE_CHECKS),
                        enough_requests=result["num_requests"] >= args.min_requests)
    path = write_json(result, "schemathesis", MODEL)
    print(json.dumps(result, indent=1))
    print(f"wrote {path}")
    if not result["enough_requests"]:
        sys.exit(f"only {result['num_requests']} requests (< {args.min_requests}): raise --max-examples")


if __name__ == "__main__":
    main()
