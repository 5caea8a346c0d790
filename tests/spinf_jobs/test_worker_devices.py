"""`spinf-jobs worker --devices`: which devices a list names, the command line of each child,
and a bad list refused before any worker starts (exit 2, a message naming the entry). The fleet
itself (two children sharing a job) runs in tests/deploy/test_sentinel.py."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spinf_jobs.worker_devices import child_commands, devices_of

REPO = Path(__file__).resolve().parents[2]


def test_a_list_names_one_device_per_worker():
    assert devices_of("cuda:0, cuda:2") == ["cuda:0", "cuda:2"]
    assert devices_of("cpu:0,cpu:1") == ["cpu:0", "cpu:1"]


@pytest.mark.parametrize(("spec", "named"), [("cuda:0,cuda:0", "named twice"), ("cpu", "'cpu' names no single device"),
                                             ("cuda:0,gpu1", "gpu1"), ("auto", "'auto' names no single device")])
def test_a_bad_list_is_an_error_naming_what_to_fix(spec, named):
    with pytest.raises(ValueError, match=named):
        devices_of(spec)


def test_all_is_every_visible_gpu():
    if torch.cuda.device_count() == 0:
        with pytest.raises(ValueError, match="no CUDA device is visible"):
            devices_of("all")
    else:
        assert devices_of("all") == [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def test_each_child_gets_its_own_device_and_name_and_the_other_flags():
    argv = ["worker", "--model", "m", "--devices=cpu:0,cpu:1", "--name", "box", "--device", "cpu",
            "--max-num-batched-tokens", "128"]
    commands = child_commands(argv, ["cpu:0", "cpu:1"], "box")
    assert commands == [[sys.executable, "-m", "spinf_jobs.cli", "worker", "--model", "m", "--max-num-batched-tokens", "128",
                         "--device", f"cpu:{i}", "--name", f"box-cpu{i}"] for i in (0, 1)]
    unnamed = child_commands(["worker", "--model", "m"], ["cuda:0", "cuda:1"], None)
    names = [command[command.index("--name") + 1] for command in unnamed]
    assert names[0].endswith("-cuda0") and names[1] == names[0][:-1] + "1"  # one base name, per device


def test_the_cli_refuses_a_bad_list_before_starting_a_worker():
    result = subprocess.run([sys.executable, "-m", "spinf_jobs.cli", "worker", "--model", "m", "--devices", "cuda:0,cuda:0"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--devices: a device is named twice" in result.stderr
