"""`spinf-jobs worker --devices all|LIST`: one worker process per device, from one command.

    --devices all          -> cuda:0 .. cuda:{n-1} (every GPU this process sees)
    --devices cuda:0,cuda:2 (or cpu:0,cpu:1: CPU workers with distinct labels)
      -> for each device: `python -m spinf_jobs.cli worker --device D --name NAME-D <the other flags>`
    SIGTERM / SIGINT to this process -> passed to every child (each hands back or finishes
    its batch, workers.loop); exits when all have, non-zero if any child did

Processes, not threads: each loads its own engines on its own GPU (and CUDA is never forked:
the children are new interpreters).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import uuid

from contract.settings import DeviceName
from pydantic import TypeAdapter


def devices_of(spec: str) -> list[str]:
    """The device of each worker process; a bad entry is a ValueError naming it."""
    if spec == "all":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError("--devices all: no CUDA device is visible (set --devices cpu:0,cpu:1 for CPU workers)")
        return [f"cuda:{index}" for index in range(count)]
    devices = [part.strip() for part in spec.split(",") if part.strip()]
    adapter = TypeAdapter(DeviceName)
    for device in devices:
        if device in ("auto", "cpu", "cuda"):
            raise ValueError(f"--devices: {device!r} names no single device (use cuda:N or cpu:N)")
        adapter.validate_python(device)
    if len(set(devices)) != len(devices):
        raise ValueError(f"--devices: a device is named twice in {spec!r}")
    return devices


def child_commands(argv: list[str], devices: list[str], base_name: str | None) -> list[list[str]]:
    """The worker command line of each child: `argv` less --devices/--device/--name, plus its own."""
    rest, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--devices", "--device", "--name"):
            skip = True
            continue
        if arg.startswith(("--devices=", "--device=", "--name=")):
            continue
        rest.append(arg)
    base = base_name or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    return [[sys.executable, "-m", "spinf_jobs.cli", *rest, "--device", device, "--name", f"{base}-{device.replace(':', '')}"]
            for device in devices]


def run_fleet(commands: list[list[str]]) -> int:
    children = [subprocess.Popen(command) for command in commands]

    def forward(signum, _frame) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    codes = [child.wait() for child in children]
    return max((abs(code) for code in codes), default=0)
