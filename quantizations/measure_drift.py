"""fp8 drift of the real small checkpoints, emulated on the CPU (quantize-dequantize).

    python3 quantizations/measure_drift.py [NAME ...]   (needs `pip install 'spinf-jobs[models]'`)

Scores the first 3 news articles x 8 questions (benchmarks/ workloads) with the engine in
fp32, then again after `engine.loading.quantization.quantize_linears_fp8` (e4m3 weights per output
channel, activations per token, emulated in fp32 by `fp8_linear_reference`), and writes
quantizations/<name>/drift-cpu.json: mean / max |Δlogprob| and |Δp| against fp32.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from workloads import load_workload  # noqa: E402

from contract.protocol import ScoringRequest  # noqa: E402
from engine.engine import Engine, EngineConfig  # noqa: E402
from engine.loading.quantization import FP8_RECIPE, quantize_linears_fp8  # noqa: E402

MODELS = ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")


def scores(engine, requests) -> tuple[list[float], list[float]]:
    results = engine.score_requests(requests).results
    options = [o for r in results for q in r.results for c in q.combinations for o in c.options]
    return [o.logprob for o in options], [o.p for o in options]


def measure(name: str) -> dict:
    engine = Engine(EngineConfig(model=name, device="cpu", dtype="float32"))
    requests = [ScoringRequest.model_validate(r) for r in load_workload("news").requests(engine.model_name, 3, 8)]
    ref_lp, ref_p = scores(engine, requests)
    quantize_linears_fp8(engine.runner.model)
    engine.system_fingerprint += "-" + FP8_RECIPE
    engine.floors = type(engine.floors)(64)
    lp, p = scores(engine, requests)
    d_lp = [abs(a - b) for a, b in zip(lp, ref_lp, strict=True)]
    d_p = [abs(a - b) for a, b in zip(p, ref_p, strict=True)]
    return {"model": name, "recipe": FP8_RECIPE, "reference": "engine fp32 on CPU", "items": len(d_lp),
            "mean_abs_logprob": statistics.fmean(d_lp), "max_abs_logprob": max(d_lp),
            "mean_abs_p": statistics.fmean(d_p), "max_abs_p": max(d_p)}


def main() -> None:
    for name in sys.argv[1:] or MODELS:
        result = measure(name)
        folder = Path(__file__).resolve().parent / name
        folder.mkdir(exist_ok=True)
        (folder / "drift-cpu.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
