"""A bad SPINF_API_KEYS stops `api` and `serve` at startup with one line on stderr (no traceback)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BAD_KEYS = {"not JSON": "not json", "short sha256": '[{"name": "a", "sha256": "abc"}]',
            "non-hex sha256": '[{"name": "a", "sha256": "' + "z" * 64 + '"}]'}


@pytest.mark.parametrize("command", ["api", "serve"])
@pytest.mark.parametrize("case", sorted(BAD_KEYS))
def test_bad_api_keys_stop_startup_with_one_line(command, case, tmp_path):
    env = os.environ | {"SPINF_API_KEYS": BAD_KEYS[case], "SPINF_REDIS_URL": "redis://127.0.0.1:1/0",
                        "SPINF_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "spinf_jobs.cli", command], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("invalid settings:") and "api_keys" in lines[0].lower()
    assert "Traceback" not in done.stderr
