"""Reliability diagrams (PNG) for calibration reports.

    [(label, p, y), ...] --reliability_bins--> points --matplotlib (Agg)--> PNG file

matplotlib is imported inside the function: the rest of prompt_packs never needs it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prompt_packs.calibration import NUM_ECE_BINS, ece, reliability_bins


def save_reliability_diagram(
    path: Path, title: str, curves: list[tuple[str, np.ndarray, np.ndarray]]
) -> Path:
    """One panel: the diagonal, one line per (label, p, y) curve, ECE in the legend,
    and a histogram of the predictions underneath."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(5, 6), gridspec_kw={"height_ratios": [3, 1]}, sharex=True
    )
    top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect")
    edges = np.linspace(0.0, 1.0, NUM_ECE_BINS + 1)
    for label, p, y in curves:
        points = reliability_bins(p, y)
        top.plot([b["mean_p"] for b in points], [b["observed"] for b in points], marker="o",
                 label=f"{label} (ECE {ece(p, y):.3f})")
        bottom.hist(np.asarray(p), bins=edges, alpha=0.5, label=label)
    top.set_ylabel("observed frequency")
    top.set_title(title, fontsize=9)
    top.legend(fontsize=8, loc="upper left")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    bottom.set_xlabel(f"predicted probability ({NUM_ECE_BINS} equal-width bins)")
    bottom.set_ylabel("rows")
    bottom.set_yscale("log")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
