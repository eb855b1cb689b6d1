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


# Qualitative colours, distinct enough for a study of 13 variants: tab10, then three that tab10 lacks. With
# markers cycled at a coprime length, (colour, marker) stays unique up to 13 x 7 lines, and a curve of one
# logged point still shows.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#000000", "#1a1a80", "#00796b")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def run_styles(names) -> dict[str, dict]:
    """Per run (in the given order) its colour and marker, to pass to every figure of a report so that a
    variant looks the same in every panel and figure."""
    return {name: {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)]}
            for i, name in enumerate(names)}


def legend_below(fig, handles: list, labels: list[str], columns: int = 4) -> float:
    """One legend for the whole figure, under the panels (a legend per panel covers the data once a study
    has many variants). The figure grows by the legend's height, so the panels keep theirs; returns the
    share of the figure's height the legend takes, for save(bottom=...)."""
    columns = min(columns, len(labels))
    height = 0.19 * -(-len(labels) // columns) + 0.1  # inches: a row of 8-point text each, and a margin
    fig.set_figheight(fig.get_figheight() + height)
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    return height / fig.get_figheight()


def representation_figure(cosines: dict[str, pd.DataFrame], path: Path) -> Path:
    """Paper Fig. 1/5: per variant histograms of [CLS] cosine similarity of random corpus pairs and of similar
    pairs, on one shared x range (so panels compare), as the share of each kind's pairs per bin. `cosines`
    maps a label to a frame with columns kind (random|similar), cosine. Readable at 13 variants: at most 4
    panels a row, few ticks, no offset notation; a range narrower than 0.01 is said in the title (the
    vectors are nearly parallel: a collapsed, early model)."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    values = np.concatenate([df["cosine"].to_numpy(dtype=float) for df in cosines.values()])
    low, high = float(values.min()), float(values.max())
    bins = np.linspace(low, max(high, low + 1e-6), 41)
    narrow = high - low < 0.01
    columns = min(4, len(cosines))
    rows = -(-len(cosines) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.0 * rows + 0.6), squeeze=False,
                             sharex=True, sharey=True)
    for ax, (label, df) in zip(axes.flat, cosines.items()):
        for kind, colour in (("random", "C0"), ("similar", "C3")):
            chosen = df.loc[df["kind"] == kind, "cosine"].to_numpy(dtype=float)
            if len(chosen):
                ax.hist(chosen, bins=bins, alpha=0.6, color=colour, weights=np.full(len(chosen), 1 / len(chosen)),
                        label=f"{kind} (mean {chosen.mean():.{5 if narrow else 3}f})")
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.ticklabel_format(axis="x", useOffset=False)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(cosines):]:
        ax.axis("off")
    axes[0, 0].set_ylim(0, 1.35 * axes[0, 0].get_ylim()[1])  # shared y: headroom for each panel's legend
    for i, ax in enumerate(list(axes.flat)[:len(cosines)]):
        ax.tick_params(labelbottom=True)  # shared x: every panel keeps its tick labels (a short last row too)
        if i + columns >= len(cosines):  # the lowest panel of its column
            ax.set_xlabel("cosine of the two [CLS] vectors")
    for ax in axes[:, 0]:
        ax.set_ylabel("share of the pairs")
    note = f"\nall within [{low:.4f}, {high:.4f}]: nearly parallel vectors" if narrow else ""
    return save(fig, "[CLS] cosine: random corpus pairs vs similar (SNLI entailment) pairs" + note, path)


def save(fig, title: str, path: Path, bottom: float = 0.0) -> Path:
    """Title, layout (leaving the lowest `bottom` of the figure to a figure legend), write and close a
    figure; its path."""
    fig.suptitle(title)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return path
