"""Drawing checks of analysis.report's figures, from SYNTHETIC inputs: these PNGs are not results.

    python docs/measurements/report-figures/draw.py

Draws every figure the report draws (fig8_copy_lm_accuracy, fig7_scl_cosine, fig7cd_label_fractions,
fig1_cls_cosine) through the report's own functions, for 2, 5 and 13 variants, into this folder as
`<figure>-<count>.png`, so that a reader can see whether they stay readable (issue 28, item 6). The inputs
have the shapes build() passes: a long table of MLflow metric histories (run_id, key, step, value), labels
per run, label_fraction_table's rows and per-run frames of [CLS] cosines. Their values only look like real
ones: accuracies rising from about 0 over 2,000 steps logged every 50, [CLS] cosines near 1 with a tiny
spread, scores on a few fractions of the labels. No number here was measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repository root, to run as a plain script

from analysis.report import CURVE_FIGURES, curves_figure, label_fraction_figure  # noqa: E402
from jobs.studies.figures import representation_figure, run_styles  # noqa: E402

# Names of model/variants.py VARIANTS (not imported: that imports torch), in the order of a study.
COUNTS = {
    2: ["cocolm", "electra"],
    5: ["cocolm", "electra", "roberta_mlm", "rtd_only", "clm_only"],
    13: ["cocolm", "electra", "roberta_mlm", "rtd_only", "clm_only", "scl_rtd", "no_rel_pos", "electra_aux",
         "random_replace", "all_token_lm", "clm_no_copy", "clm_no_stopgrad", "converged_aux"],
}
NO_LM = {"rtd_only", "scl_rtd", "electra", "roberta_mlm"}  # no corrective-LM head: no lm_* curves
NO_COPY = {"roberta_mlm"}  # no copy head
NO_SCL = {"rtd_only", "clm_only", "electra", "roberta_mlm", "all_token_lm", "clm_no_copy", "clm_no_stopgrad"}
STEPS = np.arange(0, 2001, 50)


def rising(rng, top: float, rate: float, start: float = 0.0) -> np.ndarray:
    """A saturating pretraining curve from `start` towards `top`, with logging noise."""
    curve = start + (top - start) * (1 - np.exp(-STEPS / rate))
    return np.clip(curve + rng.normal(0, 0.01, len(STEPS)), 0, 1)


def histories(variants: list[str], rng) -> pd.DataFrame:
    rows = []
    for v in variants:
        scale = rng.uniform(0.8, 1.1)
        curves = {}
        if v not in NO_COPY:
            curves |= {"copy_accuracy_replaced": rising(rng, 0.6 * scale, 600), "copy_accuracy_original":
                       rising(rng, 0.97, 200, start=0.5)}
        if v not in NO_LM:
            curves |= {"lm_accuracy_replaced": rising(rng, 0.3 * scale, 800), "lm_accuracy_original":
                       rising(rng, 0.6 * scale, 500)}
        if v not in NO_COPY:  # [CLS] cosines of the two views, logged with cls_cosines on: near 1, tiny spread
            curves |= {"cls_positive_cosine": 1 - rng.uniform(2e-5, 2e-4) * np.exp(-STEPS / 900)
                       - np.abs(rng.normal(0, 5e-6, len(STEPS))),
                       "cls_negative_cosine": 1 - rng.uniform(1e-4, 6e-4) * np.exp(-STEPS / 1500)
                       - np.abs(rng.normal(0, 1e-5, len(STEPS)))}
        if v not in NO_SCL:
            curves |= {"scl_positive_cosine": rising(rng, rng.uniform(0.8, 0.95), rng.uniform(200, 600), start=0.3),
                       "scl_negative_cosine": np.clip(0.3 * np.exp(-STEPS / rng.uniform(200, 800))
                                                      + rng.normal(0, 0.01, len(STEPS)), -1, 1)}
        rows += [{"run_id": f"run-{v}", "key": k, "step": s, "value": x}
                 for k, values in curves.items() for s, x in zip(STEPS, values)]
    return pd.DataFrame(rows)


def fractions(variants: list[str], rng) -> pd.DataFrame:
    """label_fraction_table's rows: per run, task and fraction the median score and the seeds' min and max."""
    rows = []
    for v in variants:
        gain = rng.uniform(-0.03, 0.03)
        for task, full in (("MNLI-m", 0.80), ("SST-2", 0.90)):
            for fraction in (0.001, 0.01, 0.1, 1.0):
                score = full - 0.09 * -np.log10(fraction) + gain + rng.normal(0, 0.005)
                spread = 0.004 + 0.01 * -np.log10(fraction)
                rows.append({"preset": "small", "variant": v, "run_name": f"{v}-small", "run_id": f"run-{v}",
                             "task": task, "fraction": fraction, "score": score, "min": score - spread,
                             "max": score + spread * rng.uniform(0.5, 1), "seeds": 5})
    return pd.DataFrame(rows)


def cosines(variants: list[str], rng) -> dict[str, pd.DataFrame]:
    """Per label, per-pair [CLS] cosines: random corpus pairs and similar pairs, all near 1 as in an early model."""
    out = {}
    for v in variants:
        gap = 1 - rng.uniform(2e-5, 3e-4)
        random = gap - np.abs(rng.normal(0, rng.uniform(1e-5, 8e-5), 300))
        similar = 1 - (1 - gap) * 0.5 - np.abs(rng.normal(0, 2e-5, 300))
        out[f"{v} (small)"] = pd.DataFrame({"kind": ["random"] * 300 + ["similar"] * 300,
                                            "cosine": np.minimum(np.r_[random, similar], 1.0)})
    return out


def shrink(path: Path) -> None:
    """Re-save with a 128-colour palette (a third of the bytes: these PNGs are committed). Octree keeps each
    line's colour; median cut at 64 colours turned green into grey."""
    from PIL import Image

    Image.open(path).convert("RGB").quantize(colors=128, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)


def main() -> None:
    for count, variants in COUNTS.items():
        rng = np.random.default_rng(count)
        labels = {f"run-{v}": f"{v} (small)" for v in variants}
        styles = run_styles(list(labels))
        hist = histories(variants, rng)
        for panels, title, name, ylabel in CURVE_FIGURES:  # as build() draws them
            curves_figure(hist, labels, panels, title, HERE / f"{name}-{count}.png", ylabel, styles)
        label_fraction_figure(fractions(variants, rng), HERE / f"fig7cd_label_fractions-{count}.png", styles=styles)
        representation_figure(cosines(variants, rng), HERE / f"fig1_cls_cosine-{count}.png")
        for path in HERE.glob(f"*-{count}.png"):
            shrink(path)
        print(count, "variants drawn")


if __name__ == "__main__":
    main()
