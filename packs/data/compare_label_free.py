"""Raw vs contextual vs batch calibration (and a labelled reference) on the four public sets.

    packs/reports/public/<set>/scores.jsonl (packs/data/public_sets.py: p and floor_p per option)
      --prompt_packs.method_comparison.compare_methods--> per set: accuracy, AUC, ECE (n,
        bootstrap 95% interval, perfect-calibration band), Brier, log-loss per method, and
        each method's accuracy / ECE change against raw with a paired bootstrap 95% interval
      --transfer--> a map fitted on one set, reported on the rows of another set only
      --> packs/reports/public/report.json, report.md

No model: a re-run over the committed scores (a few minutes on the CPU, for the bootstraps).
    python3 packs/data/compare_label_free.py
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from prompt_packs.calibration_choice import choose_method
from prompt_packs.joint_choice import choose_joint
from prompt_packs.method_comparison import (
    compare_methods,
    method_probabilities,
    transfer,
)

REPORTS_DIR = Path(__file__).resolve().parents[1] / "reports" / "public"
SETS = ("rotten-tomatoes", "amazon-food", "convention-speeches", "bbc-news")
TRANSFER = ("rotten-tomatoes", "amazon-food")  # fit on the first, report on the second
COLUMNS = ("accuracy", "auc", "ece", "brier", "log_loss")


def read_set(name: str, reports_dir: Path = REPORTS_DIR) -> tuple[dict, list[str], np.ndarray, np.ndarray, np.ndarray]:
    lines = [json.loads(line) for line in (reports_dir / name / "scores.jsonl").read_text().splitlines() if line]
    rows = lines[1:]
    return (lines[0]["meta"], [r["id"] for r in rows], np.array([r["p"] for r in rows]),
            np.array([r["floor_p"] for r in rows]), np.array([r["label"] for r in rows]))


def labelled_reference(p: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The best a labelled fit does on the same rows, nested 5-fold held out."""
    if p.shape[1] == 2:
        q = choose_method(p[:, 0] / p.sum(axis=1), (labels == 0).astype(float)).held_out_p
        return np.stack([q, 1.0 - q], axis=1)
    return choose_joint({"raw": p}, labels).held_out


def compare_set(name: str, reports_dir: Path = REPORTS_DIR) -> dict:
    meta, ids, p, floor_p, labels = read_set(name, reports_dir)
    methods = method_probabilities(p, floor_p) | {"labelled (nested 5-fold)": labelled_reference(p, labels)}
    return {"meta": meta, "num_rows": len(ids), "class_share": (np.bincount(labels, minlength=p.shape[1]) / len(ids)).tolist(),
            "methods": compare_methods(methods, labels)}


def compare_transfer(reports_dir: Path = REPORTS_DIR) -> dict:
    source, target = TRANSFER
    _, fit_ids, fit_p, _, fit_labels = read_set(source, reports_dir)
    _, eval_ids, eval_p, eval_floor, eval_labels = read_set(target, reports_dir)
    result = transfer(fit_p, fit_labels, eval_p, eval_floor, eval_labels)
    digest = hashlib.sha256("\n".join(eval_ids).encode()).hexdigest()
    return {"fit_set": source, "eval_set": target, "num_fit_rows": len(fit_ids), "num_eval_rows": len(eval_ids),
            "eval_ids_sha256": digest, **result}


def _row(name: str, entry: dict) -> str:
    m = entry["metrics"]
    cells = [f"{m[k]:.3f}" for k in COLUMNS]
    ece = f"{m['ece']:.3f} [{m['ece_lo']:.3f}, {m['ece_hi']:.3f}]"
    changes = []
    for key, label in (("accuracy_change", "acc"), ("ece_change", "ECE")):
        if key in entry:
            c = entry[key]
            verdict = " helpful" if c["helpful"] else (" harmful" if c["harmful"] else "")
            changes.append(f"{label} {c['delta']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}]{verdict}")
    return f"| {name} | {' | '.join(cells[:2])} | {ece} | {m['perfect_q95']:.3f} | {' | '.join(cells[3:])} | {'; '.join(changes)} |"


def markdown(report: dict) -> str:
    lines = ["# Label-free calibration on four public labelled sets", "",
             ("Model `qwen2.5-coder-1.5b-instruct` (bfloat16 on the GPU machine, `packs/data/score_public_on_gpu.sh`),"
             " scores in `<set>/scores.jsonl`; this file is written by `python3 packs/data/compare_label_free.py`."),
             ("ECE: 10 equal-width bins (two options: on the first option's p; more: top label), with its bootstrap"
             " 95% interval and the 95th percentile of a perfectly calibrated predictor's ECE at this n (`band`)."
             " Changes are against raw, with a paired bootstrap 95% interval (2,000 resamples); a method is"
             " `helpful` only where the interval excludes zero on the good side (`harmful`: on the bad side)."), ""]
    for name, s in report["sets"].items():
        meta = s["meta"]
        lines += [f"## {name}: {s['num_rows']} rows, `{meta['package']}` ({meta['licence']})", "",
                  (f"Classes {', '.join(meta['classes'])} (share {', '.join(f'{x:.2f}' for x in s['class_share'])}),"
                  f" options {', '.join(repr(o) for o in meta['options'])}; texts cut to {meta['max_num_words']} words."), "",
                  "| method | accuracy | AUC | ECE [95% CI] | band | Brier | log-loss | change vs raw [95% CI] |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [_row(method, entry) for method, entry in s["methods"].items()]
        lines.append("")
    t = report["transfer"]
    lines += [(f"## Generalisation: fitted on {t['fit_set']} ({t['num_fit_rows']} rows), reported on {t['eval_set']}"
              f" ({t['num_eval_rows']} rows only; ids sha256 `{t['eval_ids_sha256'][:16]}`)"), "",
              "| method | accuracy | AUC | ECE [95% CI] | band | Brier | log-loss | change vs raw [95% CI] |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [_row(method, entry) for method, entry in t["methods"].items()]
    lines += ["", (f"Fitted on {t['fit_set']}: {t['fitted']['method']} {t['fitted']['params']}; batch priors"
              f" {[round(x, 4) for x in t['fitted']['priors']]}."), ""]
    return "\n".join(lines)


def main() -> None:
    report = {"sets": {name: compare_set(name) for name in SETS}, "transfer": compare_transfer()}
    (REPORTS_DIR / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (REPORTS_DIR / "report.md").write_text(markdown(report))
    print(f"wrote {REPORTS_DIR / 'report.md'}")


if __name__ == "__main__":
    main()
