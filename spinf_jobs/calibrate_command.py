"""`spinf-jobs calibrate`: score a labelled set with a pack, fit, write the fit and a report.

    PACK (id or file) + labelled JSONL
      --score_rows (engine, imported lazily: spinf_jobs never imports torch at import time)-->
        scores.jsonl (raw scores per row, kept in the report folder: refits need no model)
      --calibrate_fit.fit_pack--> PackFit
      --write_calibration--> the pack file's `calibration` section
      --calibrate_report--> packs/reports/<pack id>/{report.json, report.md, *.png}

`--queries QUERIES.json` calibrates a request's own queries instead: the file holds
`{"queries": [...]}` (or a whole scoring request; its `messages`, if any, are not used: the
content is each labelled row's text). Each two-option query becomes a question (its first
option positive) and a category of the same id, and the labelled rows name the query ids
that are positive. The fit then goes to <report dir>/pack.yaml (there is no pack file to
write into).

`--workload NAME` fits a /v1/decide workload temperature from labelled decisions
(spinf_jobs/calibrate_workload.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import yaml
from pydantic import ValidationError

from contract.protocol import ScoringRequest, ScoringSpec
from contract.settings import Settings
from prompt_packs.apply import apply_pack, expand_pack
from prompt_packs.calibration_fit import ScoredRow, fit_pack, to_pack_calibration
from prompt_packs.calibration_report import write_report
from prompt_packs.format import Category, Pack, PackQuestion
from prompt_packs.registry import (
    OFFICIAL_PACKS_DIR,
    PackRegistry,
    load_pack,
    write_calibration,
)
from spinf_jobs.setting_flags import add_setting_flag, settings_from_args

REPO_ROOT = OFFICIAL_PACKS_DIR.parent
DEFAULT_REPORTS_DIR = OFFICIAL_PACKS_DIR / "reports"


def add_calibrate_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("calibrate", help="fit a pack's calibration on labelled JSONL",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--pack", help="pack id (official or under --packs) or a pack file")
    source.add_argument("--queries", type=Path, help='{"queries": [...]} (or a scoring request) to calibrate')
    source.add_argument("--workload", help="fit this /v1/decide workload's temperature from labelled decisions")
    parser.add_argument("--workloads-file", type=Path, default=None,
                        help="--workload: JSON object of SPINF_WORKLOADS to merge the fitted temperature into")
    parser.add_argument("--data", type=Path, required=True, help='labelled JSONL: {"id", "text", "labels": [...]}')
    add_setting_flag(parser, "pack_dirs", "--packs", metavar="DIR")
    add_setting_flag(parser, "default_model", "--model", help="served model name or HF folder to score with",
                     metavar="NAME")
    parser.add_argument("--max-rows", type=int, default=None, help="score only the first N rows")
    parser.add_argument("--batch-size", type=int, default=8, help="requests per engine call")
    add_setting_flag(parser, "device", help="where to score (cuda: bfloat16, the GPU workers' numerics;"
                                            " recorded in the report)")
    parser.add_argument("--folds", type=int, default=5, help="cross-fit folds for held-out metrics")
    parser.add_argument("--reports-dir", type=Path, default=DEFAULT_REPORTS_DIR)
    parser.add_argument("--scores", type=Path, default=None,
                        help="fit from this scores.jsonl (rows of --data found in it) without scoring;"
                             " without it, rows already in <report dir>/scores.jsonl are not rescored")
    parser.add_argument("--no-write", action="store_true", help="report only; leave the pack file as it is")
    parser.set_defaults(handler=run_calibrate)  # spinf_jobs.cli calls args.handler(args)
    return parser


def run_calibrate(args: argparse.Namespace) -> int:
    if args.workload:
        from spinf_jobs.calibrate_workload import run_workload

        return run_workload(args.workload, args.data, args.reports_dir, args.workloads_file, args.folds)
    settings = settings_from_args(args)
    pack, pack_path = _resolve_pack(args, settings)
    rows = read_labelled(args.data, args.max_rows)
    report_dir = args.reports_dir / pack.id
    report_dir.mkdir(parents=True, exist_ok=True)
    scores_path = report_dir / "scores.jsonl"
    if args.scores:
        by_id = {s.id: s for s in read_scores(args.scores)[0]}
        scored, meta = [by_id[r["id"]] for r in rows if r["id"] in by_id], read_scores(args.scores)[1]
    else:
        scored, meta = score_rows(pack, rows, settings, batch_size=args.batch_size, scores_path=scores_path)
    fit = fit_pack(pack, scored, num_folds=args.folds)
    data_name = _relative(args.data)
    calibration = to_pack_calibration(
        fit, data=data_name, data_sha256=_sha256(args.data), model=meta["model"],
        fingerprint=meta["system_fingerprint"], report=_relative(report_dir),
    )
    write_report(report_dir, pack, fit, scored, meta | {"data": data_name, "num_rows": len(scored)})
    if args.no_write:
        print(f"fit not written (--no-write); report in {report_dir}")
    elif pack_path is None:
        target = report_dir / "pack.yaml"
        body = pack.model_dump(mode="json", exclude={"calibration"})
        target.write_text(yaml.safe_dump(body, sort_keys=False, allow_unicode=True), encoding="utf-8")
        write_calibration(target, calibration)
        print(f"fit written to {target}; report in {report_dir}")
    else:
        write_calibration(pack_path, calibration)
        print(f"fit written into {pack_path}; report in {report_dir}")
    return 0


def _resolve_pack(args: argparse.Namespace, settings: Settings) -> tuple[Pack, Path | None]:
    if args.queries:
        return pack_from_request(json.loads(args.queries.read_text()), str(args.queries)), None
    candidate = Path(args.pack)
    if candidate.is_file():
        return load_pack(candidate), candidate
    registry = PackRegistry.load(settings.pack_dirs)
    return registry.get(args.pack), registry.sources[args.pack]


def pack_from_request(request: dict, source: str = "--queries") -> Pack:
    """A throwaway pack whose questions are the file's two-option queries: `{"queries": [...]}`
    or a scoring request (`scoring.queries`; its messages are not needed)."""
    queries = request.get("queries", request.get("scoring", {}).get("queries")) if isinstance(request, dict) else None
    if not isinstance(queries, list) or not queries:
        raise SystemExit(f'{source}: give {{"queries": [...]}} (or a scoring request with scoring.queries)')
    try:
        spec = ScoringSpec.model_validate({"queries": queries})
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise SystemExit(f"{source}: queries.{where.removeprefix('queries.')}: {first['msg']}") from None
    questions, categories = [], []
    for query in spec.queries:
        if len(query.options) != 2 or query.values:
            raise SystemExit(f"{source}: queries.{query.id}: calibrate takes two-option queries without values")
        qid = query.id.replace(":", "-").replace("/", "-").lower()
        questions.append(PackQuestion(id=qid, template=query.template, options=query.options,
                                      positive=[query.options[0]], answer_in=query.answer_in))
        categories.append(Category(id=qid, questions=[qid]))
    return Pack(id="request/queries", version="0.0.0", questions=questions, categories=categories)


def read_labelled(path: Path, max_rows: int | None) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("text"), str) or not isinstance(row.get("labels"), list):
            raise ValueError(f"{path}:{number}: a row needs \"text\" (string) and \"labels\" (list)")
        rows.append({"id": str(row.get("id", number)), "text": row["text"], "labels": row["labels"]})
    return rows[:max_rows] if max_rows else rows


def build_requests(pack: Pack, rows: list[dict], model: str | None) -> list[ScoringRequest]:
    queries = expand_pack(pack)
    return [ScoringRequest(model=model, messages=pack.presentation.messages(r["text"]),
                           scoring=ScoringSpec(queries=queries)) for r in rows]


def scored_row(pack: Pack, row: dict, applied: dict) -> ScoredRow:
    questions = {q: e["p"] for q, e in applied["questions"].items() if e["p"] is not None}
    choices = {f"{q}/{c}": p for q, e in applied["questions"].items() for c, p in e.get("choices", {}).items()}
    orderings = {q: [o["probabilities"] for o in e["combined"]["orderings"]]
                 for q, e in applied["questions"].items() if "combined" in e}
    return ScoredRow(id=row["id"], labels=row["labels"], questions=questions, choices=choices, orderings=orderings)


def score_rows(pack: Pack, rows: list[dict], settings: Settings, *, batch_size: int,
               scores_path: Path) -> tuple[list[ScoredRow], dict]:
    """Score the rows not yet in `scores_path` on `settings`' default model and device,
    appending each batch as it is done, so an interrupted run resumes where it stopped (the
    file's model must match)."""
    from workers.engines import engine_for  # lazy: torch only when scoring

    done, meta = read_scores(scores_path) if scores_path.exists() else ([], None)
    done_ids = {s.id for s in done}
    todo = [r for r in rows if r["id"] not in done_ids]
    if todo:
        engine = engine_for(settings.default_model, settings)
        if meta and meta["system_fingerprint"] != engine.system_fingerprint:
            raise RuntimeError(
                f"{scores_path} was scored by {meta['model']} with fingerprint {meta['system_fingerprint']};"
                f" this engine is {engine.system_fingerprint}: refit with --scores {scores_path}, or move it"
                " away to rescore every row")
        meta = meta or {"model": engine.model_name, "system_fingerprint": engine.system_fingerprint,
                        "device": f"{engine.runner.device.type} ({engine.dtype_name})", "scoring_seconds": 0.0,
                        "num_content_tokens": 0}
        if not scores_path.exists():
            scores_path.write_text(json.dumps({"meta": meta}) + "\n", encoding="utf-8")
        _score_into(engine, pack, todo, batch_size, scores_path)
    by_id = {s.id: s for s in read_scores(scores_path)[0]}
    meta = read_scores(scores_path)[1]
    return [by_id[r["id"]] for r in rows if r["id"] in by_id], meta


def _score_into(engine, pack: Pack, rows: list[dict], batch_size: int, scores_path: Path) -> None:
    raw_pack = pack.model_copy(update={"calibration": type(pack.calibration)()})
    requests = build_requests(pack, rows, None)
    started = time.time()
    for start in range(0, len(rows), batch_size):
        batch_started = time.time()
        output = engine.score_requests(requests[start : start + batch_size])
        lines = []
        num_content_tokens = 0
        for row, response in zip(rows[start : start + batch_size], output.results, strict=True):
            if not hasattr(response, "results"):
                raise RuntimeError(f"row {row['id']}: {response.field}: {response.message}")
            num_content_tokens += response.usage.content_tokens
            lines.append(_score_line(scored_row(pack, row, apply_pack(raw_pack, response.results))))
        with scores_path.open("a", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))
        _add_to_meta(scores_path, time.time() - batch_started, num_content_tokens)
        print(f"scored {start + len(lines)}/{len(rows)} rows in {time.time() - started:.0f}s",
              file=sys.stderr, flush=True)


def _add_to_meta(scores_path: Path, seconds: float, num_content_tokens: int) -> None:
    lines = scores_path.read_text(encoding="utf-8").splitlines(keepends=True)
    meta = json.loads(lines[0])["meta"]
    meta["scoring_seconds"] = round(meta["scoring_seconds"] + seconds, 1)
    meta["num_content_tokens"] += num_content_tokens
    lines[0] = json.dumps({"meta": meta}) + "\n"
    scores_path.write_text("".join(lines), encoding="utf-8")


def _score_line(s: ScoredRow) -> str:
    return json.dumps({"id": s.id, "labels": s.labels, "questions": s.questions, "choices": s.choices,
                       "orderings": s.orderings})


def write_scores(path: Path, scored: list[ScoredRow], meta: dict) -> None:
    path.write_text("\n".join([json.dumps({"meta": meta})] + [_score_line(s) for s in scored]) + "\n",
                    encoding="utf-8")


def read_scores(path: Path) -> tuple[list[ScoredRow], dict]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    meta, rows = lines[0]["meta"], lines[1:]
    return [ScoredRow(**row) for row in rows], meta


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _relative(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    """`python -m spinf_jobs.calibrate_command ...`: the calibrate command without the top-level CLI."""
    parser = argparse.ArgumentParser(prog="spinf-jobs")
    add_calibrate_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
