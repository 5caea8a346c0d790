"""The official packs' committed calibration, re-derived from the committed raw scores.

Every number is nested held out (the method reported for a row was chosen without it).
The bar: per category and per argmax decision, ECE after <= 0.03 or within the
perfect-calibration band at that n (every official set has < 1,000 rows); accuracy and AUC
no lower than uncalibrated, with no exception (every report's meets_bar is true). The
report, the pack's calibration section (one-vs-rest maps, joint decision maps, thresholds
by target) are what a refit of `packs/reports/<pack>/scores.jsonl` gives.

The raw scores come from `packs/data/calibrate_on_gpu.sh` (the default model on the GPU);
the labels are the committed labelled rows (moderation, support) or the ones the scores
file itself carries (news, reviews: their text is not redistributed)."""

import json
from pathlib import Path

import numpy as np
import pytest

from prompt_packs.calibration_fit import fit_pack
from prompt_packs.calibration_report import ECE_BAR
from prompt_packs.calibration_stats import ece_summary
from prompt_packs.registry import PackRegistry
from spinf_jobs.calibrate_command import read_scores

ROOT = Path(__file__).resolve().parents[2]
OFFICIAL = ["spinf/moderation", "spinf/support-triage", "spinf/product-reviews", "spinf/news-topics"]
MIN_NUM_ROWS = 300


@pytest.fixture(scope="module")
def registry():
    return PackRegistry.load([])


@pytest.fixture(scope="module")
def fits(registry):
    out = {}
    for pack_id in OFFICIAL:
        scored, meta = read_scores(ROOT / "packs" / "reports" / pack_id / "scores.jsonl")
        out[pack_id] = (scored, meta, fit_pack(registry.get(pack_id), scored))
    return out


def _within_bar(p, y) -> bool:
    summary = ece_summary(p, y)
    return summary["ece"] <= ECE_BAR or summary["ece"] <= summary["perfect_q95"]


@pytest.mark.parametrize("pack_id", OFFICIAL)
def test_every_category_meets_the_bar_on_held_out_rows(registry, fits, pack_id):
    pack = registry.get(pack_id)
    scored, meta, fit = fits[pack_id]
    assert len(scored) >= MIN_NUM_ROWS and meta["model"] == "qwen2.5-coder-1.5b-instruct"
    for category in pack.categories:
        outcome = fit.outcomes[category.id]
        y = np.array([float(category.id in r.labels) for r in scored])
        assert 0 < y.sum() < len(y)
        assert _within_bar(outcome.held_out_p, y), (category.id, outcome.ece)
        assert outcome.after["auc"] >= outcome.before["auc"], category.id
        assert outcome.after["accuracy"] >= outcome.before["accuracy"], category.id


@pytest.mark.parametrize("pack_id", ["spinf/support-triage", "spinf/news-topics"])
def test_every_argmax_decision_meets_the_bar(registry, fits, pack_id):
    pack = registry.get(pack_id)
    scored, _, fit = fits[pack_id]
    decision = next(d for d in pack.decisions if d.argmax_of)
    joint = fit.joint[decision.id]
    assert len(joint.rows) == len(scored)
    right = (joint.choice.held_out.argmax(axis=1) == joint.labels).astype(float)
    assert _within_bar(joint.choice.held_out.max(axis=1), right)
    assert joint.choice.after["accuracy"] >= joint.choice.before["accuracy"]
    assert joint.choice.after["auc_ovr"] >= joint.choice.before["auc_ovr"]
    assert joint.choice.after["ece"] < joint.one_vs_rest["ece"]  # the joint map beats one-vs-rest


@pytest.mark.parametrize("pack_id", OFFICIAL)
def test_committed_report_and_pack_are_what_the_scores_give(registry, fits, pack_id):
    pack = registry.get(pack_id)
    folder = ROOT / "packs" / "reports" / pack_id
    scored, meta, fit = fits[pack_id]
    report = json.loads((folder / "report.json").read_text())
    assert report["meets_bar"] and all(report["meets_bar"].values()), report["meets_bar"]
    assert all(decision["meets_bar"] for decision in report["decisions"].values())
    for category_id, choice in fit.categories.items():
        committed = report["categories"][category_id]
        assert committed["method"] == choice.method
        assert np.isclose(committed["after"]["ece"], fit.outcomes[category_id].after["ece"], atol=1e-9)
        assert (folder / f"reliability-{category_id}.png").stat().st_size > 1000
    for decision_id, joint in fit.joint.items():
        assert report["decisions"][decision_id]["method"] == joint.choice.method
        assert pack.calibration.decisions[decision_id].method == joint.choice.method
        assert np.isclose(report["decisions"][decision_id]["after"]["ece"], joint.choice.after["ece"], atol=1e-9)
    for key, threshold in fit.thresholds.items():
        if threshold.at_least is not None:
            assert pack.calibration.thresholds[key].at_least == pytest.approx(threshold.at_least, abs=1e-6)
    fitted = pack.calibration.categories
    assert set(fitted) == {c.id for c in pack.categories}
    assert {c.provenance.system_fingerprint for c in fitted.values()} == {meta["system_fingerprint"]}
    assert {c.provenance.num_rows for c in fitted.values()} == {len(scored)}


def _arrow(before: float, after: float) -> str:
    return f"{before:.3f} → {after:.3f}"


@pytest.mark.parametrize("pack_id", OFFICIAL)
def test_the_docs_quote_the_committed_reports(pack_id):
    """docs/prompt-packs.md's table row per category and the decisions' figures in it and in
    docs/calibration.md are the committed report's numbers, rounded."""
    report = json.loads((ROOT / "packs" / "reports" / pack_id / "report.json").read_text())
    table = (ROOT / "docs" / "prompt-packs.md").read_text()
    guide = " ".join((ROOT / "docs" / "calibration.md").read_text().split())
    for category_id, c in report["categories"].items():
        b, a, e = c["before"], c["after"], c["ece"]
        served = f"{c['method']} ({c['reads']})" if c["served_by"] == "one-vs-rest" else f"joint `{c['served_by'].split()[1]}`"
        row = (f"| `{pack_id}` | {b['num_rows']} | {category_id} | {served} | {_arrow(b['accuracy'], a['accuracy'])} | "
               f"{_arrow(b['auc'], a['auc'])} | {_arrow(b['ece'], a['ece'])} [{e['ece_lo']:.3f}, {e['ece_hi']:.3f}] | "
               f"{e['perfect_q95']:.3f} |")
        assert row in table, row
    flat = " ".join(table.split())
    for decision_id, d in report["decisions"].items():
        accuracy = f"`{decision_id}` accuracy {_arrow(d['before']['accuracy'], d['after']['accuracy'])}"
        assert accuracy in flat and f"{d['ece']['ece']:.3f} [{d['ece']['ece_lo']:.3f}, {d['ece']['ece_hi']:.3f}]" in flat
        assert f"{d['before']['ece']:.3f} → {d['one_vs_rest']['ece']:.3f}" in guide
        assert f"band {d['ece']['perfect_q95']:.3f}" in flat and f"band {d['ece']['perfect_q95']:.3f}" in guide
