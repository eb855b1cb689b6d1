"""Figures a job logs on its runs, which analysis.report draws again for a whole study."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the figures themselves need numpy and matplotlib only (jobs.studies.curves runs without pandas)
    import pandas as pd


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported here: matplotlib is optional)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def representation_figure(cosines: dict[str, pd.DataFrame], path: Path) -> Path:
    """Paper Fig. 1/5: per variant (side by side) histograms of [CLS] cosine similarity of random corpus
    pairs and of similar pairs. `cosines` maps a label to a frame with columns kind (random|similar), cosine."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(cosines), figsize=(4 * len(cosines), 3.5), squeeze=False, sharey=False)
    for ax, (label, df) in zip(axes[0], cosines.items()):
        # Bins over the panel's own range: on [-1, 1] a collapsed (early, tiny) model is one bar at 1.0.
        low, high = float(df["cosine"].min()), float(df["cosine"].max())
        bins = np.linspace(low, max(high, low + 1e-6), 41)
        for kind, colour in (("random", "C0"), ("similar", "C3")):
            values = df.loc[df["kind"] == kind, "cosine"]
            ax.hist(values, bins=bins, alpha=0.6, color=colour, density=True,
                    label=f"{kind} pairs (mean {values.mean():.4f})")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("cosine similarity of [CLS]")
        ax.legend(fontsize=7)
    return save(fig, "[CLS] cosine similarity: random corpus pairs vs similar (SNLI entailment) pairs", path)


def save(fig, title: str, path: Path, bottom: float = 0.0) -> Path:
    """Title, layout (leaving the lowest `bottom` of the figure to a figure legend), write and close a
    figure; its path."""
    fig.suptitle(title)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
