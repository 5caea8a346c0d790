"""The calibration report: JSON for machines, Markdown for people, PNG diagrams.

    PackFit + scored rows --write_report--> <dir>/report.json, <dir>/report.md,
                                            <dir>/reliability-<category>.png

Every number is a held-out number (out-of-fold, see calibrate_fit); "before" is the pack
without calibration, "after" the pack as fitted.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from prompt_packs.calibration_fit import PackFit, ScoredRow
from prompt_packs.format import Pack
from prompt_packs.reliability import save_reliability_diagram

ECE_BAR = 0.05  # the project's must-show bar for every category after calibration
COLUMNS = ("accuracy", "auc", "ece", "brier", "log_loss")


def _choice_json(choice) -> dict:
    return {"method": choice.method, "params": choice.calibrator.params, "before": choice.before,
            "after": choice.after, "num_flipped": choice.num_flipped, "candidates": choice.candidates}


def report_json(pack: Pack, fit: PackFit, meta: dict) -> dict:
    categories = {c: _choice_json(choice) | {"reads": fit.category_inputs.get(c, "calibrated")}
                  for c, choice in fit.categories.items()}
    meets = {c: (v["after"]["ece"] <= ECE_BAR and v["after"]["accuracy"] >= v["before"]["accuracy"]
                 and not v["after"]["auc"] < v["before"]["auc"]) for c, v in categories.items()}
    return {"pack": pack.id, "version": pack.version, "meta": meta, "held_out": fit.held_out,
            "ece_bar": ECE_BAR, "meets_bar": meets,
            "questions": {q: _choice_json(choice) for q, choice in fit.questions.items()},
            "categories": categories, "multiclass": fit.multiclass, "orderings": fit.orderings}


def _row(name: str, method: str, before: dict, after: dict, flipped: int) -> str:
    cells = [f"{before[k]:.3f} → {after[k]:.3f}" for k in COLUMNS]
    return f"| {name} | {method} | {before['num_positive']}/{before['num_rows']} | " + " | ".join(cells) + f" | {flipped} |"


def report_markdown(pack: Pack, fit: PackFit, meta: dict) -> str:
    header = "| | method | positives | accuracy | AUC | ECE | Brier | log-loss | moved across 0.5 |\n|---|---|---|---|---|---|---|---|---|"
    lines = [
        f"# Calibration report: {pack.id} {pack.version}", "",
        f"Model `{meta['model']}` (fingerprint `{meta['system_fingerprint']}`), data `{meta['data']}`,"
        f" {meta['num_rows']} labelled rows, every one held out once: {fit.held_out}."
        f" Scoring took {meta.get('scoring_seconds', '?')} s on {meta.get('device', 'cpu')}.", "",
        "Each cell is before → after calibration, on held-out rows. ECE: 10 equal-width bins;"
        " accuracy at 0.5; AUC: mean of the per-fold AUCs (rows of one fold share one map);"
        " before = the pack without calibration (categories: the combine rule over raw question"
        " scores). The decision table pools all rows.", "",
        "## Categories", "", header,
    ]
    lines += [_row(c, f"{ch.method} ({fit.category_inputs.get(c, 'calibrated')} input)", ch.before, ch.after,
                   ch.num_flipped) for c, ch in fit.categories.items()]
    lines += ["", "## Questions", "", header]
    lines += [_row(q, ch.method, ch.before, ch.after, ch.num_flipped) for q, ch in fit.questions.items()]
    for decision, summary in fit.multiclass.items():
        b, a = summary["before"], summary["after"]
        lines += ["", f"## Decision `{decision}` (argmax of {', '.join(summary['classes'])})", "",
                  "| | accuracy | AUC (one-vs-rest) | ECE (top label) | Brier | log-loss |", "|---|---|---|---|---|---|",
                  f"| before | {b['accuracy']:.3f} | {b['auc_ovr']:.3f} | {b['ece']:.3f} | {b['brier']:.3f} | {b['log_loss']:.3f} |",
                  f"| after | {a['accuracy']:.3f} | {a['auc_ovr']:.3f} | {a['ece']:.3f} | {a['brier']:.3f} | {a['log_loss']:.3f} |"]
    for question, s in fit.orderings.items():
        lo, hi = s["accuracy_change_ci95"]
        lines += ["", f"## Order averaging: `{question}` ({s['num_orderings']} orderings, {s['num_rows']} rows)", "",
                  f"- accuracy, first ordering only: {s['accuracy_one_ordering']:.3f}",
                  f"- accuracy, averaged over orderings: {s['accuracy_averaged']:.3f}",
                  f"- change: {s['accuracy_change']:+.3f} (bootstrap 95% interval {lo:+.3f} to {hi:+.3f})",
                  f"- unanimous rows: {s['share_unanimous']:.1%}, their accuracy {_number(s['accuracy_unanimous'])}",
                  f"- split rows: accuracy {_number(s['accuracy_split'])}"]
    lines += ["", "Reliability diagrams: `reliability-<category>.png` beside this file.", ""]
    return "\n".join(lines)


def write_report(report_dir: Path, pack: Pack, fit: PackFit, scored: list[ScoredRow], meta: dict) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "report.json").write_text(json.dumps(report_json(pack, fit, meta), indent=2) + "\n")
    (report_dir / "report.md").write_text(report_markdown(pack, fit, meta))
    for category in pack.categories:
        choice = fit.categories[category.id]
        y = np.array([float(category.id in r.labels) for r in scored])
        raw = _raw_category(pack, category.id, scored)
        save_reliability_diagram(
            report_dir / f"reliability-{category.id}.png", f"{pack.id}: {category.id} (held-out rows)",
            [("before", raw, y), (f"after ({choice.method})", choice.held_out_p, y)],
        )


def _raw_category(pack: Pack, category_id: str, scored: list[ScoredRow]) -> np.ndarray:
    from prompt_packs.apply import combine_scores

    category = next(c for c in pack.categories if c.id == category_id)
    return np.array([combine_scores(category, pack, {**r.choices, **r.questions}) for r in scored])


def _number(value: float | None) -> str:
    return "n/a (no such rows)" if value is None else f"{value:.3f}"
