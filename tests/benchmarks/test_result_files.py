"""Benchmark results are named by what they measure and carry the commit they measured."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import result_files


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(result_files, "RESULTS", tmp_path / "results")
    return tmp_path / "results"


def test_a_result_is_named_by_what_it_measures(results):
    path = result_files.write_pair({"commit": "abc1234", "date": "2026-12-02"}, "# md\n",
                                   "throughput", "gemma-3-12b", "news", "", "slots")
    assert sorted(p.name for p in results.iterdir()) == ["throughput-gemma-3-12b-news-slots.json",
                                                         "throughput-gemma-3-12b-news-slots.md"]
    assert json.loads(path.read_text())["commit"] == "abc1234"
    again = result_files.write_pair({"commit": "def5678"}, "# md\n", "throughput", "gemma-3-12b", "news", "slots")
    assert again == path and json.loads(path.read_text())["commit"] == "def5678"  # a new run replaces the file


def test_a_result_without_its_commit_is_refused(results):
    with pytest.raises(ValueError, match="commit"):
        result_files.write_json({"date": "2026-12-02"}, "kernels")
    with pytest.raises(ValueError, match="not a path"):
        result_files.result_path("tokenize-speed", ".tok/qwen3")
    assert not results.exists() or not any(results.iterdir())


def test_outside_git_the_commit_is_the_callers(monkeypatch, tmp_path):
    monkeypatch.setattr(result_files, "RESULTS", tmp_path / "results")  # tmp_path is no git checkout
    monkeypatch.setenv("COMMIT", "e492850")
    assert result_files.new_result(gpu="x")["commit"] == "e492850"
    monkeypatch.delenv("COMMIT")
    assert result_files.git_commit() == "unknown"


def test_the_callers_commit_wins_inside_a_checkout_too(monkeypatch):
    """The GPU machine's copy of a working tree may carry a .git at another commit: $COMMIT names
    the tree that ran."""
    monkeypatch.delenv("COMMIT", raising=False)
    head = result_files.git_commit()
    assert head != "unknown"
    monkeypatch.setenv("COMMIT", "0123abc")
    assert result_files.git_commit() == "0123abc" != head
