"""Medians over seeds, incomplete grid points, best-point selection and the task table, on synthetic trials."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jobs.finetuning.medians import (GLUE_AVG, GLUE_TARGETS, best_points, summarize, task_table, to_markdown,
                                     with_published)

SEEDS = [0, 1, 2, 3, 4]


def trials(task: str, lr: float, scores: dict[int, float], **extra) -> list[dict]:
    return [{"task": task, "lr": lr, "batch_size": 32, "epochs": 3, "warmup": 0.06, "seed": s, "score": v,
             **{k: v2[s] for k, v2 in extra.items()}} for s, v in scores.items()]


def test_statistics_over_seeds_by_hand():
    df = pd.DataFrame(trials("RTE", 2e-5, dict(zip(SEEDS, [0.6, 0.7, 0.8, 0.9, 0.5]))))
    row = summarize(df, SEEDS).iloc[0]
    assert row["complete"] and row["seeds_done"] == 5 and row["missing_seeds"] == ""
    assert row["score_median"] == pytest.approx(0.7)
    assert row["score_mean"] == pytest.approx(0.7)
    assert row["score_std"] == pytest.approx(np.sqrt(0.1 / 4))  # squares .01+0+.01+.04+.04 = .1, ddof 1
    assert (row["score_min"], row["score_max"]) == pytest.approx((0.5, 0.9))


def test_a_point_missing_seeds_is_incomplete_excluded_from_best_and_shown():
    good = trials("RTE", 1e-5, dict(zip(SEEDS, [0.60, 0.62, 0.64, 0.66, 0.68])))
    partial = trials("RTE", 3e-5, {0: 0.9, 1: 0.9, 2: 0.9, 3: float("nan"), 4: 0.9})  # seed 3 failed (NaN)
    lacking = trials("RTE", 5e-5, {0: 0.95, 1: 0.95, 2: 0.95})  # seeds 3 and 4 never reported
    summary = summarize(pd.DataFrame(good + partial + lacking), SEEDS)
    by_lr = summary.set_index("lr")
    assert by_lr.loc[3e-5, "missing_seeds"] == "3" and not by_lr.loc[3e-5, "complete"]
    assert by_lr.loc[5e-5, "missing_seeds"] == "3,4" and by_lr.loc[5e-5, "seeds_done"] == 3
    assert by_lr.loc[[3e-5, 5e-5], "score_median"].isna().all()  # never a median over fewer seeds
    best = best_points(summary).iloc[0]
    assert best["lr"] == 1e-5 and best["score_median"] == pytest.approx(0.64)
    assert (best["points_complete"], best["points_incomplete"]) == (1, 2)
    text = to_markdown(summary)
    assert "incomplete: 4/5 seeds (missing 3)" in text and "incomplete: 3/5 seeds (missing 3,4)" in text
    assert "| RTE | 1e-05 | 32 | 3 | 0.06 | 5/5 | 64.00 |" in text


def test_a_task_without_any_complete_point_has_no_score():
    summary = summarize(pd.DataFrame(trials("CoLA", 1e-5, {0: 0.5, 1: 0.4})), SEEDS)
    best = best_points(summary)
    assert not best.iloc[0]["complete"] and np.isnan(best.iloc[0]["score_median"])
    assert "no complete grid point" in to_markdown(best)


def test_mnli_m_and_mm_are_chosen_separately_and_ties_go_to_grid_order():
    rows = (trials("MNLI-m", 1e-5, dict.fromkeys(SEEDS, 0.80)) + trials("MNLI-m", 2e-5, dict.fromkeys(SEEDS, 0.82))
            + trials("MNLI-mm", 1e-5, dict.fromkeys(SEEDS, 0.83)) + trials("MNLI-mm", 2e-5, dict.fromkeys(SEEDS, 0.81))
            + trials("SST-2", 3e-5, dict.fromkeys(SEEDS, 0.9)) + trials("SST-2", 1e-5, dict.fromkeys(SEEDS, 0.9)))
    best = best_points(summarize(pd.DataFrame(rows), SEEDS)).set_index("task")
    assert best.loc["MNLI-m", "lr"] == 2e-5 and best.loc["MNLI-mm", "lr"] == 1e-5
    assert best.loc["SST-2", "lr"] == 1e-5  # equal medians: the first point in grid order


def test_extra_metrics_get_medians():
    df = pd.DataFrame(trials("MRPC", 2e-5, dict(zip(SEEDS, [0.8, 0.82, 0.84, 0.86, 0.88])),
                             f1=dict(zip(SEEDS, [0.85, 0.9, 0.87, 0.86, 0.88]))))
    row = summarize(df, SEEDS, extra=["f1"]).iloc[0]
    assert row["f1_median"] == pytest.approx(0.87)


def test_duplicate_or_unexpected_seeds_are_errors():
    df = pd.DataFrame(trials("RTE", 1e-5, {0: 0.5}) * 2)
    with pytest.raises(ValueError, match="more than one trial"):
        summarize(df, SEEDS)
    with pytest.raises(ValueError, match=r"seeds \[7\] outside"):
        summarize(pd.DataFrame(trials("RTE", 1e-5, {7: 0.5})), SEEDS)


def test_task_table_orders_like_the_paper_and_averages_the_eight_glue_scores():
    scores = dict(zip(GLUE_TARGETS, [0.885, 0.92, 0.931, 0.932, 0.639, 0.848, 0.914, 0.903]))
    rows = [r for t, v in scores.items() for r in trials(t, 2e-5, dict.fromkeys(SEEDS, v))]
    rows += trials("MNLI-mm", 2e-5, dict.fromkeys(SEEDS, 0.883))
    table = task_table(best_points(summarize(pd.DataFrame(rows[::-1]), SEEDS)))
    assert list(table["task"]) == ["MNLI-m", "MNLI-mm", *GLUE_TARGETS[1:], GLUE_AVG]
    assert table.iloc[-1]["score_median"] == pytest.approx(np.mean(list(scores.values())))  # MNLI-mm not in it
    assert table.iloc[-1]["score_median"] == pytest.approx(0.872, abs=5e-4)  # the paper's 87.2 for these scores
    partial = task_table(best_points(summarize(pd.DataFrame(rows[:10]), SEEDS)))
    assert GLUE_AVG not in set(partial["task"])


def tabled(rows: list[dict], metric: dict[str, str], extra=()) -> pd.DataFrame:
    """The task table of hand-made trials, each target's score metric named as `tables.tabulate` names it."""
    summary = summarize(pd.DataFrame(rows), SEEDS, extra=extra)
    summary.insert(1, "metric", summary["task"].map(metric))
    return task_table(best_points(summary))


def test_the_published_result_and_the_gap_sit_beside_the_dev_median():
    rows = (trials("RTE", 3e-5, dict(zip(SEEDS, [0.86, 0.87, 0.88, 0.89, 0.90])))
            + trials("SQuAD 2.0", 3e-5, dict(zip(SEEDS, [0.85, 0.86, 0.87, 0.88, 0.89])),
                     exact=dict(zip(SEEDS, [0.82, 0.83, 0.84, 0.85, 0.86])))
            + trials("CoLA", 2e-5, dict(zip(SEEDS, [0.6] * 5))))
    table = tabled(rows, {"RTE": "accuracy", "SQuAD 2.0": "f1", "CoLA": "matthews_corr"}, extra=["exact"])
    published = {"RTE": {"accuracy": 87.4}, "SQuAD 2.0": {"f1": 87.7, "exact": 84.9}, "QQP": {"accuracy": 92.3}}
    out = with_published(table, published).set_index("task")
    assert out.loc["RTE", "published"] == pytest.approx(0.874) and out.loc["RTE", "gap"] == pytest.approx(0.88 - 0.874)
    assert out.loc["SQuAD 2.0", "gap"] == pytest.approx(0.87 - 0.877)  # F1, its score
    assert out.loc["SQuAD 2.0", "published_exact"] == pytest.approx(0.849)
    assert out.loc["SQuAD 2.0", "gap_exact"] == pytest.approx(0.84 - 0.849)  # EM beside it
    assert np.isnan(out.loc["CoLA", "published"]) and np.isnan(out.loc["RTE", "gap_exact"])  # nothing published
    shown = to_markdown(out.reset_index()[["task", "score_median", "published", "gap", "exact_median",
                                           "published_exact", "gap_exact"]])
    assert "| RTE | 88.00 | 87.40 | +0.60 | - | - | - |" in shown
    assert "| SQuAD 2.0 | 87.00 | 87.70 | -0.70 | 84.00 | 84.90 | -0.90 |" in shown
    assert "| CoLA | 60.00 | - | - | - | - | - |" in shown
    assert with_published(table, {}).equals(table)  # without published results: the table as it was


def test_glue_avg_sets_the_mean_of_the_eight_published_scores_beside_its_own():
    scores = dict(zip(GLUE_TARGETS, [0.885, 0.92, 0.931, 0.932, 0.639, 0.848, 0.914, 0.903]))
    metric = {t: {"CoLA": "matthews_corr", "STS-B": "spearman"}.get(t, "accuracy") for t in GLUE_TARGETS}
    table = tabled([r for t, v in scores.items() for r in trials(t, 2e-5, dict.fromkeys(SEEDS, v))], metric)
    published = {t: {metric[t]: p} for t, p in zip(GLUE_TARGETS, [90.1, 92.3, 94.2, 95.1, 69.9, 87.4, 90.9, 91.8])}
    average = with_published(table, published).set_index("task").loc[GLUE_AVG]
    assert average["published"] == pytest.approx(0.8896, abs=1e-4)  # (90.1 + ... + 91.8) / 8
    assert average["gap"] == pytest.approx(np.mean(list(scores.values())) - 0.889625)
    del published["STS-B"]
    assert np.isnan(with_published(table, published).set_index("task").loc[GLUE_AVG, "published"])


def test_analysis_does_not_import_torch():
    code = "import sys, jobs.finetuning.medians; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
