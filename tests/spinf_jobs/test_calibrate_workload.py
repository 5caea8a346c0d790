"""`spinf-jobs calibrate --workload` and `--queries` input errors (no model needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spinf_jobs.calibrate_command import main


def _decisions(path, num_rows: int, true_temperature: float, seed: int = 0) -> None:
    """Decisions whose logits are over-confident: the truth follows softmax(logits / T)."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(num_rows):
        logits = rng.normal(0.0, 3.0, 3)
        truth = np.exp(logits / true_temperature) / np.exp(logits / true_temperature).sum()
        label = ["refund", "bug", "other"][rng.choice(3, p=truth)]
        lines.append(json.dumps({"option_ids": ["refund", "bug", "other"], "option_logits": logits.tolist(),
                                 "label": label, "top": "refund"}))
    path.write_text("\n".join(lines) + "\n")


def test_workload_temperature_is_fitted_and_merged(tmp_path, capsys):
    data, workloads = tmp_path / "decisions.jsonl", tmp_path / "workloads.json"
    _decisions(data, 3000, 2.5)
    workloads.write_text(json.dumps({"triage": 1.3}))
    assert main(["calibrate", "--workload", "refunds", "--data", str(data), "--reports-dir", str(tmp_path),
                 "--workloads-file", str(workloads)]) == 0
    merged = json.loads(workloads.read_text())
    assert merged["triage"] == 1.3 and merged["refunds"] == pytest.approx(2.5, rel=0.08)
    report = json.loads((tmp_path / "workloads" / "refunds" / "report.json").read_text())
    assert report["after"]["log_loss"] < report["before"]["log_loss"]
    assert report["after"]["accuracy"] == report["before"]["accuracy"]  # a temperature keeps the argmax
    assert "SPINF_WORKLOADS='" in capsys.readouterr().out


def test_workload_rows_missing_a_field_are_named(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"option_ids": ["a", "b"], "option_logits": [0.0, -1.0]}) + "\n")
    with pytest.raises(SystemExit, match=r"d.jsonl:1: a labelled decision needs \['label'\]"):
        main(["calibrate", "--workload", "w", "--data", str(data), "--reports-dir", str(tmp_path)])


@pytest.mark.parametrize(("body", "message"), [
    ({"messages": [{"role": "user", "content": "x"}]}, r'give \{"queries": \[...\]\}'),
    ({"queries": [{"id": "q", "template": "Q?{?}", "options": [" yes"]}]}, r"queries.0: Value error, options: give at least 2"),
    ({"queries": [{"id": "q", "template": "Q?{?}", "options": [" a", " b", " c"]}]}, "two-option queries"),
])
def test_queries_file_errors_are_one_line(tmp_path, body, message):
    path = tmp_path / "q.json"
    path.write_text(json.dumps(body))
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"id": "1", "text": "t", "labels": []}) + "\n")
    with pytest.raises(SystemExit, match=message) as raised:
        main(["calibrate", "--queries", str(path), "--data", str(data), "--reports-dir", str(tmp_path), "--no-write"])
    assert "\n" not in str(raised.value)


def test_queries_without_messages_make_a_pack():
    from spinf_jobs.calibrate_command import pack_from_request

    pack = pack_from_request({"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]})
    assert [q.id for q in pack.questions] == ["refund"] and pack.questions[0].positive == [" yes"]


@pytest.mark.slow
@pytest.mark.parametrize("body", [
    {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]},
    {"scoring": {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]}},
])
def test_queries_without_messages_are_scored_fitted_and_written(tmp_path, service_model_dir, body):
    """The whole command on a real (tiny) model: a queries file, or a scoring request, with no
    `messages` field; the content is each labelled row's text."""
    queries, data = tmp_path / "q.json", tmp_path / "rows.jsonl"
    queries.write_text(json.dumps(body))
    data.write_text("".join(json.dumps({"id": str(i), "text": f"Order {i}: {'refund me' if i % 2 else 'thanks'}.",
                                        "labels": ["refund"] if i % 2 else []}) + "\n" for i in range(40)))
    assert main(["calibrate", "--queries", str(queries), "--data", str(data), "--model", str(service_model_dir),
                 "--device", "cpu", "--reports-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "request" / "queries" / "report.json").read_text())
    assert report["categories"]["refund"]["before"]["num_rows"] == 40
    assert report["categories"]["refund"]["before"]["num_positive"] == 20
    fitted = (tmp_path / "request" / "queries" / "pack.yaml").read_text()
    assert "calibration:" in fitted and "refund" in fitted
