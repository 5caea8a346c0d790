"""Fitting a whole pack from scored rows (synthetic scores; no model needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prompt_packs.apply import apply_pack
from prompt_packs.calibration_fit import ScoredRow, fit_pack, to_pack_calibration
from prompt_packs.registry import load_pack, write_calibration
from spinf_jobs.calibrate_command import main, read_scores, write_scores


def _synthetic_rows(num_rows: int, seed: int = 0) -> list[ScoredRow]:
    """Rows for the MINI pack: `hostile` rows make rude/mean say yes, but the raw
    probabilities are biased upwards (the model says "yes" too easily)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_rows):
        hostile = rng.random() < 0.3
        chilly = rng.random() < 0.5
        def biased(signal: bool) -> float:
            z = rng.normal(1.5 if signal else -1.0, 1.0) + 1.5
            return float(1 / (1 + np.exp(-z)))
        cold = float(np.clip(rng.normal(0.7 if chilly else 0.3, 0.15), 0.01, 0.99))
        per_ordering = [[1 - cold, cold], [1 - cold + 0.05, cold - 0.05]]
        labels = (["hostile", "harsh"] if hostile else []) + (["chilly", "cold"] if chilly else ["warm"])
        rows.append(ScoredRow(id=str(i), labels=labels, questions={"rude": biased(hostile), "mean": biased(hostile), "kind": cold},
                              choices={"kind/warm": 1 - cold, "kind/cold": cold}, orderings={"kind": per_ordering}))
    return rows


def test_fit_pack_reaches_the_bar_on_biased_scores(mini):
    pack = load_pack(mini)
    fit = fit_pack(pack, _synthetic_rows(600))
    assert set(fit.questions) == {"rude", "mean"}  # kind is only used through kind/cold
    hostile = fit.categories["hostile"]
    assert hostile.before["ece"] > 0.15
    assert hostile.after["ece"] < 0.05
    assert hostile.after["accuracy"] >= hostile.before["accuracy"]
    assert fit.orderings["kind"]["num_orderings"] == 2
    lo, hi = fit.orderings["kind"]["accuracy_change_ci95"]
    assert lo <= fit.orderings["kind"]["accuracy_change"] <= hi


def test_fit_written_into_the_pack_is_applied(mini, mini_results):
    pack = load_pack(mini)
    fit = fit_pack(pack, _synthetic_rows(300))
    calibration = to_pack_calibration(fit, data="x.jsonl", data_sha256="0" * 64, model="m", fingerprint="f")
    fitted = write_calibration(mini, calibration)
    assert fitted.calibration.questions["rude"].provenance.num_rows == 300
    out = apply_pack(fitted, mini_results)
    assert out["questions"]["rude"]["p"] == pytest.approx(0.8)  # raw value kept
    assert out["questions"]["rude"]["calibrated_p"] < 0.8  # the bias towards "yes" is taken out
    assert out["categories"]["hostile"]["calibrated_score"] is not None


def test_calibrate_command_refits_from_saved_scores(mini, tmp_path):
    rows = _synthetic_rows(300)
    scores = tmp_path / "scores.jsonl"
    write_scores(scores, rows, {"model": "m", "system_fingerprint": "f"})
    assert read_scores(scores)[0][5] == rows[5]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": r.id, "text": "t", "labels": r.labels}) + "\n" for r in rows))
    reports = tmp_path / "reports"
    assert main(["calibrate", "--pack", str(mini), "--data", str(data), "--scores", str(scores),
                 "--reports-dir", str(reports)]) == 0
    report = json.loads((reports / "test/mini/report.json").read_text())
    assert report["categories"]["hostile"]["after"]["ece"] < report["categories"]["hostile"]["before"]["ece"]
    assert (reports / "test/mini/reliability-hostile.png").exists()
    assert "hostile" in (reports / "test/mini/report.md").read_text()
    assert load_pack(mini).calibration.categories["hostile"].method in ("temperature", "platt", "isotonic")


def test_the_calibrate_command_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, spinf_jobs.calibrate_command, prompt_packs.registry;"
            " print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
