"""A job's calibration once its rows are scored: batch columns, priors, the labelled report.

    result rows [{custom_id, response: ScoringResponse dict} | {custom_id, error}]
      --job_priors(rows, queries)--> {"<query id>/<combination>": [mean p per option]}
      --with_batch_columns(rows, priors)--> the same rows, each option of those queries with
                                           batch_p = p / prior renormalised beside its p
    a sync response + a finished job's priors --with_batch_columns([row], priors)--> batch_p
    result rows + labels {custom_id: [positive query ids]}
      --job_report--> JSON: per two-option query, raw / contextual / batch / labelled
                      (nested 5-fold) side by side (method_comparison), and the diagrams

Pure (numpy; matplotlib only inside `write_job_report`): the workers call these when a job
or batch ends (workers/job_calibration.py); the API calls them on a cancelled job's finished
rows each time it returns them (api/cancelled_results.py); rows of a running job carry raw
values only. A prior is the mean of p over the rows that answered (error rows count not).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from prompt_packs.calibration_choice import choose_method
from prompt_packs.method_comparison import compare_methods, method_probabilities

MIN_LABELLED_ROWS = 20  # fewer labelled rows (or one class only) give no report for a query


def _combinations(row: dict, batch_only: bool = False):
    response = row.get("response")
    for result in (response or {}).get("results", []):
        if batch_only and result.get("calibrate") != "batch":
            continue
        for index, combination in enumerate(result["combinations"]):
            if combination.get("options"):
                yield f"{result['id']}/{index}", combination["options"]


class PriorSums:
    """The running sums behind `job_priors`, for rows read a chunk at a time (a job's results
    from Redis or S3). `queries`: only these query ids; `batch_only`: only the results whose
    query asked for calibrate "batch"."""

    def __init__(self, queries: set[str] | None = None, *, batch_only: bool = False) -> None:
        self.queries, self.batch_only = queries, batch_only
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}

    def add(self, rows: Iterable[dict]) -> None:
        for row in rows:
            for key, options in _combinations(row, self.batch_only):
                if self.queries is not None and key.rsplit("/", 1)[0] not in self.queries:
                    continue
                p = np.array([o["p"] for o in options], dtype=np.float64)
                if key in self.sums and len(self.sums[key]) != len(p):
                    raise ValueError(f"{key}: rows answer with {len(p)} and {len(self.sums[key])} options")
                self.sums[key] = self.sums.get(key, 0.0) + p
                self.counts[key] = self.counts.get(key, 0) + 1

    def priors(self) -> dict[str, list[float]]:
        return {key: (total / self.counts[key]).tolist() for key, total in self.sums.items()}


def job_priors(rows: list[dict], queries: set[str] | None = None, *, batch_only: bool = False) -> dict[str, list[float]]:
    """Mean p per option over the rows that answered, per (query, combination)."""
    sums = PriorSums(queries, batch_only=batch_only)
    sums.add(rows)
    return sums.priors()


def with_batch_columns(rows: list[dict], priors: dict[str, list[float]]) -> list[dict]:
    """Copies of the rows whose options of the primed queries carry batch_p beside p."""
    out = []
    for row in rows:
        row = json.loads(json.dumps(row))  # a deep copy of plain JSON
        for key, options in _combinations(row):
            prior = priors.get(key)
            if prior is None:
                continue
            scaled = [o["p"] / max(q, 1e-12) for o, q in zip(options, prior, strict=True)]
            total = sum(scaled)
            for option, value in zip(options, scaled, strict=True):
                option["batch_p"] = value / total
        out.append(row)
    return out


def _labelled_query(rows: list[dict], labels: dict[str, list[str]], query_id: str):
    p, floor_p, y = [], [], []
    for row in rows:
        if row.get("custom_id") not in labels:
            continue
        for key, options in _combinations(row):
            if key == f"{query_id}/0" and len(options) == 2:
                p.append([o["p"] for o in options])
                floor_p.append([o["floor_p"] for o in options])
                y.append(0 if query_id in labels[row["custom_id"]] else 1)  # class 0: the first option
    return np.array(p), np.array(floor_p), np.array(y)


def job_report(rows: list[dict], labels: dict[str, list[str]], priors: dict[str, list[float]] | None = None,
               *, seed: int = 0) -> dict:
    """Per two-option query of the labelled rows: every method side by side. The batch prior
    is the job's own (all its rows, labelled or not) unless `priors` is given."""
    priors = job_priors(rows) if priors is None else priors
    query_ids = sorted({key.rsplit("/", 1)[0] for row in rows for key, _ in _combinations(row)})
    out = {"num_labelled_rows": sum(1 for r in rows if r.get("custom_id") in labels and r.get("response")),
           "queries": {}}
    for query_id in query_ids:
        p, floor_p, y = _labelled_query(rows, labels, query_id)
        if len(y) < MIN_LABELLED_ROWS or len(set(y.tolist())) < 2:
            out["queries"][query_id] = {"skipped": f"{len(y)} labelled rows, classes {sorted(set(y.tolist()))}"}
            continue
        prior = np.asarray(priors[f"{query_id}/0"]) if f"{query_id}/0" in priors else None
        methods = method_probabilities(p, floor_p, prior)
        fitted = choose_method(p[:, 0] / p.sum(axis=1), (y == 0).astype(np.float64), seed=seed)
        methods[f"labelled {fitted.method} (nested 5-fold)"] = np.stack([fitted.held_out_p, 1 - fitted.held_out_p], 1)
        out["queries"][query_id] = {"num_rows": len(y), "num_positive": int((y == 0).sum()),
                                    "methods": compare_methods(methods, y, seed=seed),
                                    "_probabilities": {m: q[:, 0].tolist() for m, q in methods.items()},
                                    "_positive": (y == 0).astype(int).tolist()}
    return out


def report_markdown(report: dict) -> str:
    lines = ["# Calibration report of a labelled job", "",
             (f"{report['num_labelled_rows']} labelled rows. Per two-option query (positive: the first option),"
             " each method on the labelled rows; ECE with its bootstrap 95% interval and the perfect-calibration"
             " band (q95) at that n; changes against raw with a paired bootstrap 95% interval"
             " (docs/calibration.md)."), ""]
    for query_id, entry in report["queries"].items():
        if "skipped" in entry:
            lines += [f"## {query_id}: skipped ({entry['skipped']})", ""]
            continue
        lines += [f"## {query_id}: {entry['num_rows']} rows, {entry['num_positive']} positive", "",
                  "| method | accuracy | AUC | ECE [95% CI] | band | Brier | log-loss | ECE change vs raw |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, m in entry["methods"].items():
            x = m["metrics"]
            change = m.get("ece_change")
            delta = f"{change['delta']:+.3f} [{change['lo']:+.3f}, {change['hi']:+.3f}]" if change else ""
            lines.append(f"| {name} | {x['accuracy']:.3f} | {x['auc']:.3f} | {x['ece']:.3f} [{x['ece_lo']:.3f},"
                         f" {x['ece_hi']:.3f}] | {x['perfect_q95']:.3f} | {x['brier']:.3f} | {x['log_loss']:.3f} | {delta} |")
        lines.append("")
    return "\n".join(lines)


def write_job_report(folder: Path, report: dict) -> list[Path]:
    """report.json, report.md and one reliability-<query>.png per reported query."""
    from prompt_packs.reliability import save_reliability_diagram

    folder.mkdir(parents=True, exist_ok=True)
    public = {"num_labelled_rows": report["num_labelled_rows"],
              "queries": {q: {k: v for k, v in e.items() if not k.startswith("_")} for q, e in report["queries"].items()}}
    written = [folder / "report.json", folder / "report.md"]
    written[0].write_text(json.dumps(public, indent=2) + "\n")
    written[1].write_text(report_markdown(report))
    for query_id, entry in report["queries"].items():
        if "_probabilities" not in entry:
            continue
        y = np.array(entry["_positive"], dtype=np.float64)
        name = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in query_id)
        curves = [(method, np.array(p), y) for method, p in entry["_probabilities"].items()]
        written.append(save_reliability_diagram(folder / f"reliability-{name}.png", f"{query_id} (labelled rows)", curves))
    return written
