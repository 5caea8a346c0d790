"""A job's batch columns, priors and labelled report, against numpy written here."""

from __future__ import annotations

import numpy as np
import pytest

from prompt_packs.job_calibration import (
    job_priors,
    job_report,
    with_batch_columns,
    write_job_report,
)


def _row(custom_id: str, yes: float, floor: float, other: list[float] | None = None) -> dict:
    results = [{"id": "spam", "combinations": [{"values": {}, "residual": 0.0, "options": [
        {"text": " yes", "logprob": np.log(yes), "p": yes, "floor_p": floor},
        {"text": " no", "logprob": np.log(1 - yes), "p": 1 - yes, "floor_p": 1 - floor}]}]}]
    if other:
        results.append({"id": "topic", "combinations": [{"values": {}, "residual": 0.0, "options": [
            {"text": t, "logprob": np.log(p), "p": p, "floor_p": 1 / 3} for t, p in zip(" abc", other, strict=False)]}]})
    return {"custom_id": custom_id, "response": {"results": results}}


def _job(num_rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows, labels = [], {}
    for i in range(num_rows):
        spam = rng.random() < 0.3
        yes = float(1 / (1 + np.exp(-(rng.normal(1.5 if spam else -1.0, 1.0) + 2.0))))  # leans to "yes"
        rows.append(_row(f"r{i}", yes, 0.8, other=list(rng.dirichlet(np.ones(3)))))
        labels[f"r{i}"] = ["spam"] if spam else []
    rows.append({"custom_id": "bad", "error": {"field": "messages", "message": "x"}})  # error rows carry no answer
    return rows, labels


def test_priors_are_the_mean_answer_and_batch_p_divides_by_them():
    rows, _ = _job(50)
    priors = job_priors(rows)
    answered = [r for r in rows if "response" in r]
    spam = np.array([[o["p"] for o in r["response"]["results"][0]["combinations"][0]["options"]] for r in answered])
    topic = np.array([[o["p"] for o in r["response"]["results"][1]["combinations"][0]["options"]] for r in answered])
    assert priors["spam/0"] == pytest.approx(spam.mean(axis=0).tolist())
    assert priors["topic/0"] == pytest.approx(topic.mean(axis=0).tolist())
    out = with_batch_columns(rows, {"spam/0": priors["spam/0"]})  # only the query that asked for it
    expected = (spam / spam.mean(axis=0)) / (spam / spam.mean(axis=0)).sum(axis=1, keepdims=True)
    got = np.array([[o["batch_p"] for o in r["response"]["results"][0]["combinations"][0]["options"]]
                    for r in out if "response" in r])
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert all("batch_p" not in o for r in out if "response" in r for o in r["response"]["results"][1]["combinations"][0]["options"])
    assert "batch_p" not in rows[0]["response"]["results"][0]["combinations"][0]["options"][0]  # inputs untouched
    assert job_priors(rows, {"topic"}).keys() == {"topic/0"}


def test_a_finished_jobs_priors_calibrate_another_response():
    rows, _ = _job(40)
    priors = job_priors(rows)
    one = with_batch_columns([_row("sync", 0.9, 0.5)], priors)[0]
    options = one["response"]["results"][0]["combinations"][0]["options"]
    ratio = np.array([0.9, 0.1]) / np.array(priors["spam/0"])
    assert [o["batch_p"] for o in options] == pytest.approx((ratio / ratio.sum()).tolist())


def test_labelled_job_report_compares_every_method(tmp_path):
    rows, labels = _job(300, seed=1)
    report = job_report(rows, labels)
    spam = report["queries"]["spam"]
    assert spam["num_rows"] == 300 and report["num_labelled_rows"] == 300
    methods = spam["methods"]
    assert {"raw", "contextual", "batch"} <= set(methods)
    labelled = next(m for m in methods if m.startswith("labelled"))
    assert methods[labelled]["metrics"]["ece"] < methods["raw"]["metrics"]["ece"] / 2
    y = np.array(spam["_positive"], dtype=float)
    raw = np.array(spam["_probabilities"]["raw"])
    bins = np.minimum((raw * 10).astype(int), 9)
    ece = sum((bins == b).mean() * abs(y[bins == b].mean() - raw[bins == b].mean()) for b in range(10) if (bins == b).any())
    assert methods["raw"]["metrics"]["ece"] == pytest.approx(ece)
    assert report["queries"]["topic"]["skipped"]  # three options: not a two-option query
    written = write_job_report(tmp_path, report)
    assert {p.name for p in written} == {"report.json", "report.md", "reliability-spam.png"}
    assert all(p.stat().st_size > 100 for p in written)
