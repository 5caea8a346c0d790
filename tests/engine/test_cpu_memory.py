"""A CPU engine gives a pass's freed tensors back (engine/cpu_memory.py): in a fresh process,
a request of four full 16,384-token passes (64 long questions and their floors) adds little to
the peak RSS; with glibc left to raise its mmap threshold it adds several times more."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

MEASURE = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    import engine.engine as engine_module
    from contract.protocol import ScoringRequest
    from engine.engine import Engine, EngineConfig
    from engine.testing.tiny import make_tiny_checkpoint
    if sys.argv[1] == "unbounded":
        engine_module.bound_freed_memory = lambda: False
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = make_tiny_checkpoint("llama", Path(folder) / "llama")
        config = checkpoint / "config.json"
        config.write_text(json.dumps(json.loads(config.read_text()) | {"max_position_embeddings": 8192}))
        engine = Engine(EngineConfig(model=str(checkpoint), device="cpu", dtype="float32", max_num_batched_tokens=16384))
    words = ("refund", "order", "billing", "charged", "twice", "account", "delivery", "late")
    import random
    rng = random.Random(0)
    queries = [{"id": f"q{i}", "template": f"\\nQuestion {i}: " + " ".join(rng.choice(words) for _ in range(540)) + "{?}",
                "options": [" yes", " no"]} for i in range(64)]
    message = {"role": "user", "content": "I was charged twice for September, please refund me."}
    engine.score(ScoringRequest.model_validate({"messages": [message], "scoring": {"queries": queries[:1]}}))
    def kib(field):
        return int(next(l for l in open("/proc/self/status") if l.startswith(field + ":")).split()[1])
    before = kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    response = engine.score(ScoringRequest.model_validate({"messages": [message], "scoring": {"queries": queries}}))
    print(json.dumps({"added_mib": (kib("VmHWM") - before) / 1024, "read": response.usage.question_tokens}))
""")


def _added_mib(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, mode], capture_output=True, text=True, timeout=900, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cpu_engine_gives_freed_pass_memory_back():
    bounded, unbounded = _added_mib("bounded"), _added_mib("unbounded")
    assert bounded["read"] > 2 * 16384, bounded  # more than two full passes of questions (and as many floor tokens)
    assert bounded["added_mib"] < 300, (bounded, unbounded)
    assert unbounded["added_mib"] > 2 * bounded["added_mib"], (bounded, unbounded)
