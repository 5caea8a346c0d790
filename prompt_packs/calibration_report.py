"""The calibration report: JSON for machines, Markdown for people, PNG diagrams.

    PackFit + scored rows --write_report--> <dir>/report.json, <dir>/report.md,
                                            <dir>/reliability-<category>.png

Every number is a held-out number (nested out-of-fold, see calibration_choice and
decision_fit); "before" is the pack without calibration, "after" the pack as fitted: a
category covered by a joint decision map is served (and judged) by that map. Every ECE
comes with n, its bootstrap 95% interval and the perfect-calibration band at that n.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from prompt_packs.calibration_fit import PackFit, ScoredRow
from prompt_packs.format import Pack
from prompt_packs.reliability import save_reliability_diagram

ECE_BAR = 0.03  # an ECE this low passes; otherwise it must lie within the perfect-calibration band
COLUMNS = ("accuracy", "auc", "ece", "brier", "log_loss")


def meets_bar(before: dict, after: dict, ece: dict, auc_key: str = "auc") -> bool:
    """ECE <= ECE_BAR or within the band at this n; accuracy and AUC no lower than before."""
    ece_ok = ece["ece"] <= ECE_BAR or ece["within_band"]
    return bool(ece_ok and after["accuracy"] >= before["accuracy"] and not after[auc_key] < before[auc_key])


def _choice_json(choice) -> dict:
    return {"method": choice.method, "params": choice.calibrator.params, "before": choice.before,
            "after": choice.after, "num_flipped": choice.num_flipped, "candidates": choice.candidates,
            "fold_methods": choice.fold_methods}


def _joint_json(joint) -> dict:
    c = joint.choice
    return {"classes": joint.classes, "num_rows": len(joint.rows), "method": c.method, "reads": c.reads,
            "params": c.calibrator.params, "before": c.before, "one_vs_rest": joint.one_vs_rest, "after": c.after,
            "ece": joint.ece, "candidates": c.candidates, "fold_choices": c.fold_choices,
            "meets_bar": meets_bar(c.before, c.after, joint.ece, "auc_ovr")}


def report_json(pack: Pack, fit: PackFit, meta: dict) -> dict:
    categories = {}
    for c, choice in fit.categories.items():
        outcome = fit.outcomes[c]
        categories[c] = _choice_json(choice) | {
            "reads": fit.category_inputs.get(c, "calibrated"), "served_by": outcome.source,
            "before": outcome.before, "after": outcome.after, "ece": outcome.ece,
            "one_vs_rest_after": choice.after}
    meets = {c: meets_bar(v["before"], v["after"], v["ece"]) for c, v in categories.items()}
    thresholds = {k: {"metric": t.metric, "target": t.target, "at_least": t.at_least, "achieved": t.achieved,
                      "interval": list(t.interval), "successes": t.successes, "trials": t.trials, "other": t.other,
                      "num_pick_rows": t.num_pick_rows, "num_check_rows": t.num_check_rows}
                  for k, t in fit.thresholds.items()}
    return {"pack": pack.id, "version": pack.version, "meta": meta, "held_out": fit.held_out,
            "ece_bar": ECE_BAR, "meets_bar": meets,
            "questions": {q: _choice_json(choice) for q, choice in fit.questions.items()},
            "categories": categories, "decisions": {d: _joint_json(j) for d, j in fit.joint.items()},
            "thresholds": thresholds, "orderings": fit.orderings}


def _cells(before: dict, after: dict, keys=COLUMNS) -> str:
    return " | ".join(f"{before[k]:.3f} → {after[k]:.3f}" for k in keys)


def _ece_cell(ece: dict) -> str:
    return f"{ece['ece']:.3f} [{ece['ece_lo']:.3f}, {ece['ece_hi']:.3f}] | {ece['perfect_q95']:.3f}"


def _category_lines(fit: PackFit) -> list[str]:
    lines = ["## Categories", "",
             ("| | served by | method (input) | positives | accuracy | AUC | ECE | Brier | log-loss"
             " | ECE after [95% CI] | perfect band (q95) | moved across 0.5 |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, choice in fit.categories.items():
        o = fit.outcomes[c]
        lines.append(f"| {c} | {o.source} | {choice.method} ({fit.category_inputs.get(c, 'calibrated')}) |"
                     f" {o.before['num_positive']}/{o.before['num_rows']} | {_cells(o.before, o.after)} |"
                     f" {_ece_cell(o.ece)} | {o.num_flipped} |")
    return lines


def _question_lines(fit: PackFit) -> list[str]:
    lines = ["## Questions", "", "| | method | positives | accuracy | AUC | ECE | Brier | log-loss | moved across 0.5 |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {q} | {ch.method} | {ch.before['num_positive']}/{ch.before['num_rows']} |"
              f" {_cells(ch.before, ch.after)} | {ch.num_flipped} |" for q, ch in fit.questions.items()]
    return lines


def _multiclass_row(name: str, metrics: dict) -> str:
    keys = ("accuracy", "auc_ovr", "ece", "brier", "log_loss")
    return f"| {name} | " + " | ".join(f"{metrics[k]:.3f}" for k in keys) + " |"


def _decision_lines(fit: PackFit) -> list[str]:
    lines = []
    for decision, j in fit.joint.items():
        c = j.choice
        lines += ["", f"## Decision `{decision}` (argmax of {', '.join(j.classes)}; {len(j.rows)} rows)", "",
                  (f"Joint map kept: `{c.method}` on the {c.reads} category scores; the outer folds' nested"
                  f" choices: {', '.join(c.fold_choices)}. Top-label ECE after:"
                  f" {_ece_cell(j.ece).replace(' | ', ', perfect-calibration band q95 ')}."), "",
                  "| | accuracy | AUC (one-vs-rest) | ECE (top label) | Brier | log-loss |", "|---|---|---|---|---|---|",
                  _multiclass_row("before (raw)", c.before),
                  _multiclass_row("one-vs-rest maps, renormalised", j.one_vs_rest),
                  _multiclass_row(f"joint {c.method} ({c.reads})", c.after)]
    return lines


def _threshold_lines(fit: PackFit) -> list[str]:
    if not fit.thresholds:
        return []
    lines = ["", "## Thresholds by target", "",
             "Picked on half of the rows (stratified, seeded), judged on the other half.", "",
             "| rule | target | at_least | achieved on check rows | 95% interval (Clopper–Pearson) | other metric | rows pick/check |",
             "|---|---|---|---|---|---|---|"]
    for key, t in fit.thresholds.items():
        if t.at_least is None:
            lines.append(f"| {key} | {t.metric} ≥ {t.target} | none reaches it on the pick rows | | | | "
                         f"{t.num_pick_rows}/{t.num_check_rows} |")
            continue
        achieved = "n/a" if t.achieved is None else f"{t.achieved:.3f} ({t.successes}/{t.trials})"
        other = "n/a" if t.other is None else f"{t.other:.3f}"
        lines.append(f"| {key} | {t.metric} ≥ {t.target} | {t.at_least:.4f} | {achieved} |"
                     f" {t.interval[0]:.3f} – {t.interval[1]:.3f} | {other} | {t.num_pick_rows}/{t.num_check_rows} |")
    return lines


def _ordering_lines(fit: PackFit) -> list[str]:
    lines = []
    for question, s in fit.orderings.items():
        lo, hi = s["accuracy_change_ci95"]
        lines += ["", f"## Order averaging: `{question}` ({s['num_orderings']} orderings, {s['num_rows']} rows)", "",
                  f"- accuracy, first ordering only: {s['accuracy_one_ordering']:.3f}",
                  f"- accuracy, averaged over orderings: {s['accuracy_averaged']:.3f}",
                  f"- change: {s['accuracy_change']:+.3f} (bootstrap 95% interval {lo:+.3f} to {hi:+.3f})",
                  f"- unanimous rows: {s['share_unanimous']:.1%}, their accuracy {_number(s['accuracy_unanimous'])}",
                  f"- split rows: accuracy {_number(s['accuracy_split'])}"]
    return lines


def report_markdown(pack: Pack, fit: PackFit, meta: dict) -> str:
    lines = [
        f"# Calibration report: {pack.id} {pack.version}", "",
        (f"Model `{meta['model']}` (fingerprint `{meta['system_fingerprint']}`), data `{meta['data']}`,"
        f" {meta['num_rows']} labelled rows, every one held out once: nested {fit.held_out} (the method"
        f" reported for a row was chosen without it). Scoring took {meta.get('scoring_seconds', '?')} s on"
        f" {meta.get('device', 'cpu')}."), "",
        ("Each cell is before → after calibration, on held-out rows. ECE: 10 equal-width bins, with its"
        " bootstrap 95% interval and the 95th percentile of the ECE a perfectly calibrated predictor gets"
        " at this n (labels drawn from the predictions); accuracy at 0.5; AUC: mean of the per-fold AUCs"
        " (rows of one fold share one map); before = the pack without calibration (categories: the combine"
        " rule over raw question scores). A category served by a joint map reads its class probability."), "",
        *_category_lines(fit), "", *_question_lines(fit), *_decision_lines(fit), *_threshold_lines(fit),
        *_ordering_lines(fit), "", "Reliability diagrams: `reliability-<category>.png` beside this file.", ""]
    return "\n".join(lines)


def write_report(report_dir: Path, pack: Pack, fit: PackFit, scored: list[ScoredRow], meta: dict) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "report.json").write_text(json.dumps(report_json(pack, fit, meta), indent=2) + "\n")
    (report_dir / "report.md").write_text(report_markdown(pack, fit, meta))
    for category in pack.categories:
        outcome = fit.outcomes[category.id]
        y = np.array([float(category.id in r.labels) for r in scored])
        raw = _raw_category(pack, category.id, scored)
        save_reliability_diagram(
            report_dir / f"reliability-{category.id}.png", f"{pack.id}: {category.id} (held-out rows)",
            [("before", raw, y), (f"after ({outcome.source})", outcome.held_out_p, y)],
        )


def _raw_category(pack: Pack, category_id: str, scored: list[ScoredRow]) -> np.ndarray:
    from prompt_packs.apply import combine_scores

    category = next(c for c in pack.categories if c.id == category_id)
    return np.array([combine_scores(category, pack, {**r.choices, **r.questions}) for r in scored])


def _number(value: float | None) -> str:
    return "n/a (no such rows)" if value is None else f"{value:.3f}"
