"""A sweep's results as tables: one row per trial, statistics over seeds per grid point, the best point per
task and the task table (with GLUE AVG), printed, and logged on the parent run as metrics and artifacts.

The dev split selects, the test split reports: a task's best grid point is the one with the highest dev
median, and the numbers reported for it (`reported_<stat>` in the task table, `best/<task>/<stat>` and
`seed_<n>` on the parent run) are its trials' test scores wherever the task has a test split (SNLI, a
user folder's test file). Each trial scores test once, with the weights of its best dev evaluation.
Tasks without one (GLUE, SQuAD 2.0: their test labels are not public) report dev, and say so (`split`).
A grid with published results (the authors' settings for their released checkpoints) puts them beside the dev
medians with the gaps (`published`, `gap`; on the parent run `best/<task>/published`, `best/<task>/gap`)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from ray.tune import Result

from jobs.finetuning.encoding import EncodedTask
from jobs.finetuning.grid import data_key, trial_name
from jobs.finetuning.medians import (GAP, GLUE_AVG, GRID_COLUMNS, PUBLISHED, STATS, best_points, summarize,
                                     task_table, to_markdown, with_published)
from jobs.names import (DEV_STAT, SEED_STAT, best_point_tag, best_split_metric, best_task_metric, fraction_target,
                        reported_split_tag)


@dataclass(frozen=True)
class SweepTables:
    trials: pd.DataFrame  # one row per (target, grid point, seed)
    summary: pd.DataFrame  # statistics over seeds per grid point (jobs.finetuning.medians.summarize)
    best: pd.DataFrame  # the best complete grid point per task
    table: pd.DataFrame  # the task table (with GLUE AVG when GLUE)
    markdown: str  # what the sweep prints


def trial_records(results: Sequence[Result], encoded: dict[str, EncodedTask]) -> list[dict[str, Any]]:
    """One row per (target, trial): MNLI's trials give an MNLI-m and an MNLI-mm row, and a trial on a fraction
    of the labels is its own target (SNLI:0.1, `jobs.names.fraction_target`), chosen and tabled apart. A
    failed trial's rows have no score, so `summarize` counts their seeds as missing."""
    rows = []
    for result in results:
        config, metrics = result.config, result.metrics or {}
        ok = result.error is None and bool(metrics.get("done"))
        point, fraction = config["point"], config["point"].get("label_fraction", 1.0)
        task = encoded[data_key(point)]
        spec = task.spec
        for i, split in enumerate(spec.dev_splits):
            row = {"task": fraction_target(spec.target(split), fraction), **{k: point[k] for k in GRID_COLUMNS},
                   "seed": config["seed"],
                   "trial": trial_name(config), "metric": spec.score, "status": "ok" if ok else "failed",
                   "score": metrics.get(best_split_metric(split, "score"), math.nan) if ok else math.nan}
            for name in spec.metrics:
                if name != spec.score:
                    row[name] = metrics.get(best_split_metric(split, name), math.nan) if ok else math.nan
            if i == 0 and task.test is not None:  # test: the weights of the first dev set's best
                for name in spec.metrics:
                    row[f"test_{name}"] = metrics.get(f"test.{name}", math.nan) if ok else math.nan
            rows.append(row)
    return rows


def tabulate(results: Sequence[Result], encoded: dict[str, EncodedTask], seeds: Sequence[int],
             published: Mapping[str, Mapping[str, float]] = {}) -> SweepTables:
    """The sweep's tables; `published` (the grid's, percent by target and metric) adds the published
    results and the gaps to the task table (`medians.with_published`)."""
    trials = pd.DataFrame(trial_records(results, encoded))
    fixed = {"task", *GRID_COLUMNS, "seed", "trial", "metric", "status", "score"}
    extra = [c for c in trials.columns if c not in fixed]
    summary = summarize(trials, seeds, extra=extra)
    metric_of = dict(zip(trials["task"], trials["metric"]))
    summary.insert(1, "metric", summary["task"].map(metric_of))
    best = best_points(summary)
    table = with_published(with_reported(task_table(best), trials), published)
    shown = ["task", "metric", "split", "reported_median", "reported_min", "reported_max", "score_median",
             *published_columns(table), "score_mean", "score_std", "score_min", "score_max",
             *(f"{c}_median" for c in extra), *GRID_COLUMNS, "seeds_done", "seeds_expected", "missing_seeds",
             "complete"]
    compared = (f"; `{PUBLISHED}`: the grid's published dev result, `{GAP}`: `score_median` minus it, "
                f"`_<metric>` for the task's other metrics" if published_columns(table) else "")
    markdown = ("Task table (best grid point per task, chosen by the dev median `score_median`; reported: the "
                "median, min and max over seeds at that point on the split named in `split`, test where the task "
                f"has one{compared}; scores x100)\n\n" + to_markdown(table[shown]))
    if len(summary) <= 40:
        markdown = ("Grid points (statistics over seeds; scores x100)\n\n" + to_markdown(summary) + "\n" + markdown)
    return SweepTables(trials, summary, best, table, markdown)


def published_columns(table: pd.DataFrame) -> list[str]:
    """The task table's published results and gaps (`medians.with_published`), in the order they were added."""
    return [c for c in table.columns if c.startswith((PUBLISHED, GAP))]


def point_key(row) -> str:
    return f"lr_{row['lr']:g}.bs_{int(row['batch_size'])}.ep_{int(row['epochs'])}.wu_{row['warmup']:g}"


def best_point_seeds(trials: pd.DataFrame, best: pd.Series, column: str = "score") -> dict[int, float]:
    """{seed: value of `column`} of the trials at a task's best grid point (a complete point: every seed
    scored); `score` is the dev score, `test_<metric>` the test split's."""
    at = trials[(trials["task"] == best["task"]) & (trials["status"] == "ok")]
    for grid_column in GRID_COLUMNS:
        at = at[at[grid_column] == best[grid_column]]
    return {int(seed): float(value) for seed, value in zip(at["seed"], at[column]) if pd.notna(value)}


def reported_column(trials: pd.DataFrame, task: str) -> tuple[str, str]:
    """(split, trial-table column) of the values reported for `task`: the test score where its trials scored
    a test split, else the dev score that chose its grid point."""
    rows = trials[trials["task"] == task]
    column = f"test_{rows['metric'].iloc[0]}" if len(rows) else ""
    return ("test", column) if column in rows and rows[column].notna().any() else ("dev", "score")


def with_reported(table: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The task table with `split` and `reported_<stat>`: the statistics over seeds, at each task's best
    grid point, of the split that is reported (GLUE AVG averages dev scores: GLUE has no test labels)."""
    rows = []
    for _, row in table.iterrows():
        if row["task"] == GLUE_AVG:
            rows.append({"split": "dev", "reported_median": row["score_median"]})
            continue
        split, column = reported_column(trials, row["task"])
        values = pd.Series(list(best_point_seeds(trials, row, column).values()) if pd.notna(row["score_median"])
                           else [], dtype=float)
        rows.append({"split": split, **{f"reported_{stat}": getattr(values, stat)() for stat in STATS}})
    reported = pd.DataFrame(rows, columns=["split", *(f"reported_{stat}" for stat in STATS)])
    return pd.concat([table.reset_index(drop=True), reported], axis=1)


def log_tables(client: MlflowClient, run_id: str, out: SweepTables) -> None:
    """Per grid point and best point statistics as parent metrics; every table as CSV and markdown artifacts."""
    now, metrics = int(time.time() * 1000), []
    for _, row in out.summary.iterrows():
        key = f"{row['task']}/{point_key(row)}"
        metrics.append(Metric(f"{key}/seeds_done", float(row["seeds_done"]), now, 0))
        if row["complete"]:
            metrics += [Metric(f"{key}/{stat}", float(row[f"score_{stat}"]), now, 0) for stat in STATS]
    for _, row in out.table.iterrows():
        if row["task"] == GLUE_AVG:
            metrics.append(Metric("glue_avg", float(row["score_median"]), now, 0))
            metrics += [Metric(f"glue_avg_{name}", float(row[name]), now, 0)
                        for name in published_columns(out.table) if pd.notna(row[name])]
        elif pd.notna(row["score_median"]):
            task, (_, column) = row["task"], reported_column(out.trials, row["task"])
            # The reported split's statistics and per-seed values under the plain keys, dev's beside them.
            metrics += [Metric(best_task_metric(task, stat), float(row[f"reported_{stat}"]), now, 0) for stat in STATS]
            metrics += [Metric(best_task_metric(task, DEV_STAT + stat), float(row[f"score_{stat}"]), now, 0)
                        for stat in STATS]
            # The best point's other metrics (SQuAD's EM beside its F1, MRPC's F1, SNLI's test accuracy).
            metrics += [Metric(best_task_metric(task, name), float(row[name]), now, 0)
                        for name in out.table.columns
                        if name.endswith("_median") and name not in ("score_median", "reported_median")
                        and pd.notna(row[name])]
            # The grid's published results and the gaps to them (best/RTE/published, best/RTE/gap).
            metrics += [Metric(best_task_metric(task, name), float(row[name]), now, 0)
                        for name in published_columns(out.table) if pd.notna(row[name])]
            metrics += [Metric(best_task_metric(task, f"{SEED_STAT}{seed}"), value, now, 0)
                        for seed, value in best_point_seeds(out.trials, row, column).items()]
            metrics += [Metric(best_task_metric(task, f"{DEV_STAT}{SEED_STAT}{seed}"), value, now, 0)
                        for seed, value in best_point_seeds(out.trials, row).items()]
            client.set_tag(run_id, reported_split_tag(task), row["split"])
    metrics.append(Metric("trials_failed", float((out.trials.drop_duplicates("trial")["status"] == "failed").sum()), now, 0))
    metrics.append(Metric("points_incomplete", float((~out.summary["complete"]).sum()), now, 0))
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start : start + 1000])
    for _, row in out.best.iterrows():
        if bool(row["complete"]):
            client.set_tag(run_id, best_point_tag(row["task"]), point_key(row))
    for name, df in (("trials", out.trials), ("grid_points", out.summary), ("best_points", out.best),
                     ("task_table", out.table)):
        client.log_text(run_id, df.to_csv(index=False), f"{name}.csv")
        if name != "trials":
            client.log_text(run_id, to_markdown(df), f"{name}.md")
    client.log_text(run_id, out.markdown, "summary.md")
