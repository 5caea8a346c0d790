"""The official packs' committed calibration (issue 5, must show 1), re-derived from the
committed raw scores: every category of every official pack, on >= 300 held-out rows, has
ECE after <= 0.05 with accuracy and AUC no lower than before; the report and the pack's
calibration section are what a refit of `packs/reports/<pack>/scores.jsonl` gives.

The raw scores come from `packs/data/calibrate_on_gpu.sh` (the default model on the GPU);
the labels are the committed labelled rows (moderation, support) or the ones the scores
file itself carries (news, reviews: their text is not redistributed)."""

import json
from pathlib import Path

import numpy as np
import pytest

from prompt_packs.calibration_fit import fit_pack
from prompt_packs.registry import PackRegistry
from spinf_jobs.calibrate_command import read_scores

ROOT = Path(__file__).resolve().parents[2]
OFFICIAL = ["spinf/moderation", "spinf/support-triage", "spinf/product-reviews", "spinf/news-topics"]
MIN_NUM_ROWS = 300
ECE_BAR = 0.05


@pytest.fixture(scope="module")
def registry():
    return PackRegistry.load([])


@pytest.mark.parametrize("pack_id", OFFICIAL)
def test_official_fit_meets_the_bar_on_held_out_rows(registry, pack_id):
    pack = registry.get(pack_id)
    scored, meta = read_scores(ROOT / "packs" / "reports" / pack_id / "scores.jsonl")
    assert len(scored) >= MIN_NUM_ROWS
    assert meta["model"] == "qwen2.5-coder-1.5b-instruct"
    fit = fit_pack(pack, scored)
    for category in pack.categories:
        choice = fit.categories[category.id]
        assert choice.after["num_rows"] >= MIN_NUM_ROWS
        assert choice.after["ece"] <= ECE_BAR, (category.id, choice.after["ece"])
        assert choice.after["accuracy"] >= choice.before["accuracy"], category.id
        assert choice.after["auc"] >= choice.before["auc"], category.id
        assert 0 < choice.before["num_positive"] < choice.before["num_rows"]  # both classes present


@pytest.mark.parametrize("pack_id", OFFICIAL)
def test_committed_report_and_pack_are_what_the_scores_give(registry, pack_id):
    pack = registry.get(pack_id)
    folder = ROOT / "packs" / "reports" / pack_id
    scored, meta = read_scores(folder / "scores.jsonl")
    fit = fit_pack(pack, scored)
    report = json.loads((folder / "report.json").read_text())
    assert all(report["meets_bar"].values())
    for category_id, choice in fit.categories.items():
        committed = report["categories"][category_id]
        assert committed["method"] == choice.method
        assert np.isclose(committed["after"]["ece"], choice.after["ece"], atol=1e-9)
        assert (folder / f"reliability-{category_id}.png").stat().st_size > 1000
    fitted = pack.calibration.categories
    assert set(fitted) == {c.id for c in pack.categories}
    assert {c.provenance.system_fingerprint for c in fitted.values()} == {meta["system_fingerprint"]}
    assert {c.provenance.num_rows for c in fitted.values()} == {len(scored)}
