"""A CPU pass gives its large tensors back: in a fresh process, a request of four full
16,384-token passes (64 long questions and their floors) adds under 300 MiB to the peak RSS.
Attention's score blocks (engine/layers/attention.py CPU_SCORES_PER_BLOCK) hold at most 64 MiB
of float32 each, less when a block's rows see few keys; glibc's malloc maps a buffer above its
mmap threshold (adapting up to 32 MiB) and unmaps it when freed, and keeps smaller ones in the
heap, where they may stay after the pass. The bound is asserted at the block size the engine
uses (`_added_mib` takes another, to compare)."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

MEASURE = textwrap.dedent("""
    import json, random, sys, tempfile
    from pathlib import Path
    import engine.layers.attention as attention
    from contract.protocol import ScoringRequest
    from engine.engine import Engine, EngineConfig
    from engine.testing.tiny import make_tiny_checkpoint
    attention.CPU_SCORES_PER_BLOCK = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = make_tiny_checkpoint("llama", Path(folder) / "llama")
        config = checkpoint / "config.json"
        config.write_text(json.dumps(json.loads(config.read_text()) | {"max_position_embeddings": 8192}))
        engine = Engine(EngineConfig(model=str(checkpoint), device="cpu", dtype="float32", max_num_batched_tokens=16384))
    words = ("refund", "order", "billing", "charged", "twice", "account", "delivery", "late")
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


def _added_mib(scores_per_block: int) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, str(scores_per_block)],
                          capture_output=True, text=True, timeout=900, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cpu_request_of_four_passes_adds_little_memory():
    from engine.layers.attention import CPU_SCORES_PER_BLOCK

    measured = _added_mib(CPU_SCORES_PER_BLOCK)
    print(f"peak RSS added: {measured['added_mib']:.0f} MiB ({measured['read']} question tokens)")
    assert measured["read"] > 2 * 16384, measured  # more than two full passes of questions (and as many floor tokens)
    assert measured["added_mib"] < 300, measured
