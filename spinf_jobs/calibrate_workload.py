"""`spinf-jobs calibrate --workload NAME --data decisions.jsonl`: fit a decision workload's temperature.

    decisions.jsonl: one labelled decision per line, a /v1/decide (or /v1/decide/shared
    decision) result with the right option added:
        {"option_ids": ["refund", "other"], "option_logits": [-0.4, -2.1], "label": "refund"}
      --prompt_packs.decision_calibration.workload_fit--> temperature + held-out metrics
      --> <reports dir>/workloads/<NAME>/report.json, and the SPINF_WORKLOADS value with NAME
          set (merged into --workloads-file when given, else into $SPINF_WORKLOADS)

No model is needed: the logits are the ones the server returned. /v1/decide's `calibrated`
block is softmax(option_logits / T) for the named workload.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from prompt_packs.decision_calibration import workload_fit


def read_decisions(path: Path) -> tuple[np.ndarray, np.ndarray]:
    logits, labels = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [k for k in ("option_ids", "option_logits", "label") if k not in row]
        if missing:
            raise SystemExit(f"{path}:{number}: a labelled decision needs {missing} (a /v1/decide result plus \"label\")")
        if row["label"] not in row["option_ids"]:
            raise SystemExit(f"{path}:{number}: label {row['label']!r} is not one of option_ids {row['option_ids']}")
        if logits and len(row["option_logits"]) != len(logits[0]):
            raise SystemExit(f"{path}:{number}: {len(row['option_logits'])} options; earlier rows have {len(logits[0])}")
        logits.append(row["option_logits"])
        labels.append(row["option_ids"].index(row["label"]))
    if len(labels) < 10:
        raise SystemExit(f"{path}: {len(labels)} labelled decisions; give at least 10")
    return np.array(logits, dtype=np.float64), np.array(labels)


def run_workload(name: str, data: Path, reports_dir: Path, workloads_file: Path | None, folds: int) -> int:
    logits, labels = read_decisions(data)
    fit = workload_fit(logits, labels, num_folds=folds)
    folder = reports_dir / "workloads" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(fit | {"workload": name, "data": str(data)}, indent=2) + "\n")
    current = json.loads(workloads_file.read_text()) if workloads_file and workloads_file.exists() else \
        json.loads(os.environ.get("SPINF_WORKLOADS") or "{}")
    current[name] = round(fit["temperature"], 6)
    if workloads_file:
        workloads_file.write_text(json.dumps(current, indent=2) + "\n")
    b, a, e = fit["before"], fit["after"], fit["ece"]
    print(f"workload {name}: temperature {fit['temperature']:.4f} on {fit['num_rows']} decisions; held out:"
          f" log-loss {b['log_loss']:.3f} -> {a['log_loss']:.3f}, top-label ECE {b['ece']:.3f} -> {a['ece']:.3f}"
          f" [{e['ece_lo']:.3f}, {e['ece_hi']:.3f}] (perfect-calibration q95 {e['perfect_q95']:.3f});"
          f" report in {folder}")
    print(f"SPINF_WORKLOADS='{json.dumps(current)}'")
    return 0
