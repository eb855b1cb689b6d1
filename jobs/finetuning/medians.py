"""Fine-tuning sweeps -> the paper's numbers (docs/method.md section 7.4). pandas only, no torch.

A sweep's trials arrive as one row per (task, grid point, seed): the task column is the *target*
being scored (MNLI gives two, MNLI-m and MNLI-mm, each chosen separately), `score` is the task's
metric at the trial's best half-epoch evaluation, NaN for a trial that failed. Then:

    summarize(trials, seeds)   per grid point: median, mean, std, min, max of the score over seeds;
                               a point missing any expected seed is *incomplete* and gets no
                               statistics at all (never a median over fewer seeds)
    best_points(summary)       per task the complete point with the highest median
    task_table(best)           the reported number per task, with the GLUE average when all eight
                               GLUE targets are there
    with_published(table, p)   a grid's published results beside the dev medians, and the gaps
    to_markdown(df)            scores as percentages with two decimals; incomplete points spelled out

`std` is the sample standard deviation (ddof=1), pandas' default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

GRID_COLUMNS = ("lr", "batch_size", "epochs", "warmup")
STATS = ("median", "mean", "std", "min", "max")
# GLUE AVG = mean of the eight task scores, MNLI-m standing for MNLI (docs/method.md section 8.2);
# MNLI-mm is tabled, not averaged.
GLUE_TARGETS = ("MNLI-m", "QQP", "QNLI", "SST-2", "CoLA", "RTE", "MRPC", "STS-B")
GLUE_AVG = "GLUE AVG"


def summarize(
    trials: pd.DataFrame, seeds: Sequence[int], grid_columns: Sequence[str] = GRID_COLUMNS,
    extra: Sequence[str] = (),
) -> pd.DataFrame:
    """One row per (task, grid point): seed count, missing seeds, completeness, the score's
    statistics over seeds, and the median of each `extra` metric column (e.g. f1, pearson, test_accuracy).

    A trial row with a NaN score counts as missing. Duplicate or unexpected seeds are errors:
    they would make the median mean something else than "over these seeds".
    """
    keys = ["task", *grid_columns]
    missing_columns = [c for c in [*keys, "seed", "score", *extra] if c not in trials.columns]
    if missing_columns:
        raise ValueError(f"trial table lacks column(s) {missing_columns}")
    expected = sorted(int(s) for s in seeds)
    unexpected = sorted(set(trials["seed"].astype(int)) - set(expected))
    if unexpected:
        raise ValueError(f"trials with seeds {unexpected} outside the sweep's seeds {expected}")
    duplicated = trials[trials.duplicated([*keys, "seed"], keep=False)]
    if len(duplicated):
        raise ValueError(f"more than one trial for the same task, grid point and seed:\n{duplicated[[*keys, 'seed']]}")
    rows = []
    for point, group in trials.groupby(keys, sort=True, dropna=False):
        done = group[group["score"].notna()]
        present = sorted(int(s) for s in done["seed"])
        missing = [s for s in expected if s not in present]
        row = dict(zip(keys, point))
        row.update(seeds_done=len(present), seeds_expected=len(expected),
                   missing_seeds=",".join(map(str, missing)), complete=not missing)
        scores = done["score"].astype(float)
        for stat in STATS:
            row[f"score_{stat}"] = getattr(scores, stat)() if not missing else np.nan
        for column in extra:
            row[f"{column}_median"] = done[column].astype(float).median() if not missing else np.nan
        rows.append(row)
    columns = [*keys, "seeds_done", "seeds_expected", "missing_seeds", "complete",
               *(f"score_{s}" for s in STATS), *(f"{c}_median" for c in extra)]
    return pd.DataFrame(rows, columns=columns)


def best_points(summary: pd.DataFrame, grid_columns: Sequence[str] = GRID_COLUMNS) -> pd.DataFrame:
    """Per task, the complete grid point with the highest median score; ties go to the first point in
    grid order. A task without any complete point keeps a row with no score, marked as such."""
    rows = []
    for task, group in summary.groupby("task", sort=False):
        complete = group[group["complete"]]
        incomplete = int((~group["complete"]).sum())
        if complete.empty:
            row = {"task": task, **{c: np.nan for c in summary.columns if c != "task"}}
            row.update(complete=False, points_complete=0, points_incomplete=incomplete)
        else:
            ordered = complete.sort_values(list(grid_columns), kind="stable")
            row = ordered.loc[ordered["score_median"].idxmax()].to_dict()
            row.update(points_complete=len(complete), points_incomplete=incomplete)
        rows.append(row)
    return pd.DataFrame(rows, columns=[*summary.columns, "points_complete", "points_incomplete"])


def task_table(best: pd.DataFrame, glue_targets: Sequence[str] = GLUE_TARGETS) -> pd.DataFrame:
    """The reported number per task (GLUE targets in the paper's column order first), plus a
    GLUE AVG row when every GLUE target has a score."""
    order = {t: i for i, t in enumerate([*glue_targets[:1], "MNLI-mm", *glue_targets[1:]])}
    table = best.assign(_order=best["task"].map(lambda t: order.get(t, len(order)))).sort_values(
        "_order", kind="stable").drop(columns="_order").reset_index(drop=True)
    scores = dict(zip(table["task"], table["score_median"]))
    if all(t in scores and pd.notna(scores[t]) for t in glue_targets):
        average = {"task": GLUE_AVG, "score_median": float(np.mean([scores[t] for t in glue_targets])),
                   "complete": True}
        table = pd.concat([table, pd.DataFrame([average])], ignore_index=True)
    return table


PUBLISHED, GAP = "published", "gap"  # the task table's columns for the score; `published_<metric>` for others


def with_published(table: pd.DataFrame, published: Mapping[str, Mapping[str, float]]) -> pd.DataFrame:
    """The task table with a grid's published results (percent, `jobs.finetuning.grid.Grid.published`) beside
    the platform's dev medians, as fractions like every score here: `published` and `gap` (median minus
    published) for the row's score metric (the `metric` column), `published_<metric>` and `gap_<metric>` for
    its others (SQuAD 2.0's exact beside its f1). Published numbers are dev results, so the gap is taken from
    the dev median, never a test split's. GLUE AVG's published value is the mean of the eight published GLUE
    scores, the platform's own rule, so both sides average the same eight. Without `published`: the table."""
    if not published:
        return table
    out = table.reset_index(drop=True)
    rows = pd.DataFrame([{_column(PUBLISHED, metric, row): value / 100
                          for metric, value in _published_of(row, published, out).items()}
                         for _, row in out.iterrows()], index=out.index)
    for name in rows.columns:
        metric = name.removeprefix(PUBLISHED).removeprefix("_")
        median = out["score_median"] if not metric else out.get(f"{metric}_median", np.nan)
        out = out.assign(**{name: rows[name], GAP + name.removeprefix(PUBLISHED): median - rows[name]})
    return out


def _published_of(row: pd.Series, published: Mapping[str, Mapping[str, float]], table: pd.DataFrame) -> dict:
    """{metric: percent} published for the row's target; for GLUE AVG the mean of the GLUE targets' scores."""
    if row["task"] != GLUE_AVG:
        return dict(published.get(row["task"], {}))
    metric_of = dict(zip(table["task"], table["metric"]))
    scores = [published.get(t, {}).get(metric_of.get(t)) for t in GLUE_TARGETS]
    return {} if None in scores else {"": float(np.mean(scores))}


def _column(prefix: str, metric: str, row: pd.Series) -> str:
    """`published` for the row's score metric (and GLUE AVG's, metric ""), else `published_<metric>`."""
    return prefix if metric in ("", row.get("metric")) else f"{prefix}_{metric}"


def status(row: pd.Series) -> str:
    """'ok', or what a grid point lacks: 'incomplete: 4/5 seeds (missing 3)'."""
    if bool(row.get("complete", False)) is True:
        return "ok"
    if pd.isna(row.get("seeds_done")):
        return "no complete grid point"
    return f"incomplete: {int(row['seeds_done'])}/{int(row['seeds_expected'])} seeds (missing {row['missing_seeds']})"


def display_table(df: pd.DataFrame) -> pd.DataFrame:
    """Strings for printing: scores x100 with two decimals, grid values compact, a status column, '-' for no value."""
    out = pd.DataFrame(index=df.index)
    for column in df.columns:
        if column in ("complete", "seeds_expected", "missing_seeds"):
            continue
        values = df[column]
        if column.startswith(("score_", "reported_", PUBLISHED)) or column.endswith("_median"):
            out[column] = [f"{100 * v:.2f}" if pd.notna(v) else "-" for v in values]
        elif column.startswith(GAP):
            out[column] = [f"{100 * v:+.2f}" if pd.notna(v) else "-" for v in values]
        elif column == "seeds_done":
            out["seeds"] = [f"{int(v)}/{int(e)}" if pd.notna(v) else "-" for v, e in zip(values, df["seeds_expected"])]
        else:
            out[column] = [_compact(v) for v in values]
    if "complete" in df.columns:
        out["status"] = [status(row) for _, row in df.iterrows()]
    return out


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub markdown table of `display_table(df)` (no tabulate dependency)."""
    shown = display_table(df)
    header = "| " + " | ".join(shown.columns) + " |"
    rule = "|" + "|".join("---" for _ in shown.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def _compact(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if isinstance(value, (float, np.floating)):
        return f"{value:g}"
    if isinstance(value, (np.integer,)):
        return str(int(value))
    return str(value)
