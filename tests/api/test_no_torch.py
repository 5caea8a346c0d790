"""The API and the shared contract never import torch (they run on machines without it)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_api_and_spinf_jobs_do_not_import_torch():
    code = ("import sys; import api.app, api.routes.jobs, jobstore.submit, jobstore.records, jobstore.datasets,"
            " jobstore.lifecycle, jobstore.chunks;"
            " api.app.create_app(__import__('contract.settings').settings.Settings(redis_url='redis://127.0.0.1:1'));"
            " print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_client_and_the_jobs_commands_load_neither_torch_nor_the_service():
    code = ("import sys; import client, client.async_client, spinf_jobs.jobs_commands, spinf_jobs.cli;"
            " print(sorted(m for m in ('torch', 'fastapi', 'redis', 'rq', 'boto3') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
