"""benchmarks/op_profiles.py (throughput.py --profile) keeps one profile file per (model,
workload), a section per system: writing one system's section replaces it and keeps the
others as they were."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import result_files  # noqa: E402
import op_profiles  # noqa: E402


def test_a_section_is_replaced_and_the_others_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(result_files, "RESULTS", tmp_path)
    result = {"model": "tiny-qwen3", "workload": "news"}
    op_profiles.write_profile(result, "spinf_bf16", "spinf_bf16: commit aaaaaaa\n\ntable one\n")
    op_profiles.write_profile(result, "spinf_fp8", "spinf_fp8: commit bbbbbbb\n\ntable two\n")
    op_profiles.write_profile(result, "spinf_bf16", "spinf_bf16: commit ccccccc\n\ntable three\n")
    text = (tmp_path / "profile-tiny-qwen3-news.txt").read_text()
    assert [line for line in text.splitlines() if line.startswith(op_profiles.SECTION)] == ["### spinf_bf16", "### spinf_fp8"]
    assert "table three" in text and "table two" in text and "table one" not in text
    assert "commit ccccccc" in text and "commit bbbbbbb" in text
