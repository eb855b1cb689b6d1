"""The paper's tables and figures from tracked MLflow runs, written to a folder and logged on an "analysis" run.

    python -m analysis.report [--experiment NAME] [--tracking-uri URI] --out DIR

Reads (all experiments, or the one named) the pretraining runs (tag kind=pretraining; per preset, variant and
pretraining seed the newest finished run) and the fine-tuning sweep parents (tag cocolm.pretraining_run; per task the newest
finished sweep) and writes:

    finetuning_table.{csv,md}   Table 1 style: best-point median per task per pretraining run (SQuAD 2.0 as
                                EM and F1 columns), and AVG
    ablation_table.{csv,md}     Table 3 style: variants as rows, each score with its difference to `cocolm`
    fig8_copy_lm_accuracy.png   copy and LM accuracy on replaced vs original tokens during pretraining
    fig7_scl_cosine.png         mean cosine of positive (7a) and negative (7b) SCL pairs during pretraining
    fig1_cls_cosine.png         [CLS] cosine histograms, random vs similar pairs (when jobs.studies.represent ran)
    fig7cd_label_fractions.png  score against the fraction of training labels per task, a line per run, min-max
    label_fractions.{csv,md}    its numbers (when a sweep ran with --label-fractions)
    representation.{csv,md}     the representation summary metrics per variant (idem)
    claims.md                   the gate table (runs that trained), the rules, and the paper's directional
                                claims judged over pretraining runs (analysis/claims.py); also printed
    runs.{csv,md}               one row per pretraining run: seed, minutes, gate verdict, metrics, readouts
    timeline.{csv,md}           the study's time: every pretraining run, control, sweep and few-shot study in
                                the order it started, minutes each, first start to last end
    pretraining_metrics.{csv,md} last pretraining metrics per variant: the ones comparable across
                                variants first (jobs.names.COMPARABLE_METRICS), `loss` last

A value that was never measured is missing ("-" in markdown, empty in CSV), never 0; a difference is
missing when either side is. AVG is the GLUE average (MNLI-m for MNLI, MNLI-mm not averaged) when the
table has all eight GLUE tasks, else the mean of its other tasks (SQuAD 2.0 is never averaged, as in the
paper); missing whenever one of them is. No torch here.
"""

from __future__ import annotations

import os
import tempfile
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from mlflow.tracking import MlflowClient

from analysis.claims import Claim, claims_markdown, judge, run_gate, with_gate
from jobs import tracking
from jobs.cli import option, parse_options, run_main
from jobs.env import set_hermetic_env
from jobs.finetuning.medians import GLUE_TARGETS
from jobs.finetuning.tasks.specs import SQUAD_V2
from jobs.names import (ANALYSIS_EXPERIMENT, COMPARABLE_METRICS, KIND_ANALYSIS, KIND_TAG, NOT_COMPARABLE,
                        PROBE_METRICS, REPRESENT_ARTIFACT, REPRESENT_METRICS)
from jobs.run_tables import (experiment_ids, fewshot_scores, histories, latest_per_seed, pretraining_runs, sweep_scores,
                       timeline, with_fractions)
from jobs.studies.figures import PALETTE, legend_below, pyplot, representation_figure, run_styles, save
from jobs.gate import CRITERIA, TRAINED

BASELINE = "cocolm"
AVG = "AVG"
RUN_COLUMNS = ["preset", "variant", "seed", "run_name", "run_id"]
FIG8 = (("Copy accuracy", "copy_accuracy_replaced", "copy_accuracy_original"),
        ("LM accuracy", "lm_accuracy_replaced", "lm_accuracy_original"))
# [CLS] cosines of an early model sit within 1e-3 of 1 while the SCL head's spread over [-1, 1]: on one axis
# the [CLS] lines are flat, so each gets its own panel (top row [CLS], bottom row SCL head).
FIG7 = (("(a) positive pairs: [CLS]", "cls_positive_cosine"),
        ("(b) negative pairs: [CLS]", "cls_negative_cosine"),
        ("(a) positive pairs: SCL head", "scl_positive_cosine"),
        ("(b) negative pairs: SCL head", "scl_negative_cosine"))
CURVE_FIGURES = ((FIG8, "Fig. 8: replaced (solid) vs original (dashed) tokens", "fig8_copy_lm_accuracy", "accuracy"),
                 (FIG7, "Fig. 7a/b: cosine of SCL's pairs during pretraining", "fig7_scl_cosine",
                  "mean cosine of the pairs"))  # (panels, title, file name, y label)
CLAIM_CURVES = ("loss",)  # read by the claims besides the figures' curves (the stop-gradient's stability)
# The gate's curves: the accuracies it reads (the [CLS] cosine is measured once, after pretraining). Solid: the
# auxiliary's or the MLM's, dashed: the copy (RTD) head's on replaced tokens.
GATE_CURVES = {c.name: c for c in CRITERIA if c.above}
GATE_LINESTYLE = {c.name: "--" if c.needs_param else "-" for c in GATE_CURVES.values()}


# ----------------------------------------------------------------------------- tables


def task_order(tasks: Sequence[str]) -> list[str]:
    """The paper's GLUE column order first (MNLI-mm after MNLI-m), other tasks after, alphabetically."""
    order = [*GLUE_TARGETS[:1], "MNLI-mm", *GLUE_TARGETS[1:]]
    return [t for t in order if t in tasks] + sorted(t for t in tasks if t not in order)


def finetuning_table(runs: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """Table 1: one row per pretraining run, one column per task (best-point median, 0..1), SQuAD 2.0 as
    two columns (EM and F1, the F1-best point's medians), and AVG over the GLUE-style tasks."""
    tasks = task_order(sorted(set(scores["task"])))
    table = runs.reindex(columns=RUN_COLUMNS)  # a run without a seed tag has an empty seed
    for task in tasks:
        if task == SQUAD_V2.display:
            table[f"{task} EM"] = _by_run(table, scores, task, "exact")
            table[f"{task} F1"] = _by_run(table, scores, task, "score")
        else:
            table[task] = _by_run(table, scores, task, "score")
    # A table with all eight GLUE columns averages those (a row lacking one has no average), else every
    # sentence(-pair) task; SQuAD is never in the average, as in the paper.
    averaged = list(GLUE_TARGETS) if set(GLUE_TARGETS) <= set(tasks) else \
        [t for t in tasks if t not in ("MNLI-mm", SQUAD_V2.display)]
    table[AVG] = table.reindex(columns=averaged).astype(float).mean(axis=1, skipna=False) if averaged else np.nan
    return table


def _by_run(table: pd.DataFrame, scores: pd.DataFrame, task: str, column: str) -> pd.Series:
    """Per row of `table`, the task's `column` in `scores` for that pretraining run (NaN when absent)."""
    mine = scores[scores["task"] == task].drop_duplicates("pretraining_run", keep="last")
    return table["run_id"].map(mine.set_index("pretraining_run")[column]).astype(float)


def ablation_table(table: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Table 3: the fine-tuning table with, per score column, `<col> diff` = score - the baseline variant's
    score of the same preset (missing if either is missing, or if the preset has no baseline run)."""
    scores = [c for c in table.columns if c not in RUN_COLUMNS]
    out = table.copy()
    # With several pretraining seeds the baseline is the mean of its runs (claims.md has the tests over runs).
    base = table[table["variant"] == baseline].groupby("preset")[scores].agg(lambda c: c.astype(float).mean())
    for column in scores:
        reference = out["preset"].map(base[column]) if len(base) else np.nan
        out[f"{column} diff"] = out[column].astype(float) - pd.Series(reference, index=out.index).astype(float)
    is_base = (out["variant"] == baseline).astype(int)
    return out.assign(_base=-is_base).sort_values(["preset", "_base"], kind="stable").drop(columns="_base") \
        .reset_index(drop=True)


def score_markdown(table: pd.DataFrame, with_diffs: bool = False) -> str:
    """Scores x100 with two decimals, differences signed in parentheses, '-' for a missing value."""
    scores = [c for c in table.columns if c not in RUN_COLUMNS and not c.endswith(" diff")]
    shown = ["preset", "variant", "seed", "run_name", *scores]
    lines = ["| " + " | ".join(shown) + " |", "|" + "|".join("---" for _ in shown) + "|"]
    for _, row in table.iterrows():
        cells = ["" if pd.isna(row.get(c)) else str(row.get(c)) for c in ("preset", "variant", "seed", "run_name")]
        for column in scores:
            cell = "-" if pd.isna(row[column]) else f"{100 * row[column]:.2f}"
            if with_diffs and row["variant"] != BASELINE:
                diff = row.get(f"{column} diff", np.nan)
                cell += " (-)" if pd.isna(diff) else f" ({100 * diff:+.2f})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- figures


def curves_figure(hist: pd.DataFrame, labels: dict[str, str], panels: Sequence[tuple[str, ...]], title: str,
                  path: Path, ylabel: str = "value", styles: dict[str, dict] | None = None) -> Path | None:
    """One panel per (title, key, [second key]): a line per run (its colour and marker from `styles`, the
    same in every panel) and key (solid: first, dashed: second), one legend under the panels. None when no
    run logged any of the keys."""
    keys = {k for panel in panels for k in panel[1:]}
    hist = hist[hist["key"].isin(keys)]
    if hist.empty:
        return None
    plt = pyplot()
    styles = styles or run_styles(labels)
    columns = int(np.ceil(np.sqrt(len(panels))))  # 2 panels side by side, 4 as 2 x 2
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.6 * rows + 0.4), squeeze=False)
    for ax, (name, *panel_keys) in zip(axes.flat, panels):
        _curve_panel(ax, hist, labels, panel_keys, styles)
        ax.set(title=name, xlabel="pretraining step", ylabel=ylabel)
    drawn = [run_id for run_id in labels if run_id in set(hist["run_id"])]
    handles = [plt.Line2D([], [], **styles[r]) for r in drawn]
    names = [labels[r] for r in drawn]
    two = next((k for _, *k in panels if len(k) == 2), None)
    if two:  # what solid and dashed stand for: the words in which the two keys differ
        handles += [plt.Line2D([], [], color="black", linestyle=s) for s in ("-", "--")]
        names += [f"{s}: {w}" for s, w in zip(("solid", "dashed"), _differing_words(*two))]
    missing = [labels[r] for r in labels if r not in drawn]
    # wrapped to the figure's width (about 10 title characters an inch): a 4-seed study's runs without
    # these curves (MLM baselines, controls) otherwise make one title line wider than the figure
    note = "\n" + textwrap.fill(f"not logged by {', '.join(missing)}", int(10 * fig.get_figwidth())) if missing else ""
    return save(fig, title + note, path, bottom=legend_below(fig, handles, names))


def _curve_panel(ax, hist: pd.DataFrame, labels: dict[str, str], panel_keys: Sequence[str], styles) -> None:
    from matplotlib.ticker import MaxNLocator  # after pyplot(): matplotlib is optional

    for run_id in labels:
        for key, style in zip(panel_keys, ("-", "--")):
            points = hist[(hist["run_id"] == run_id) & (hist["key"] == key)]
            if len(points):  # markers on about 8 points a line: lines stay apart, a one-point curve shows
                ax.plot(points["step"], points["value"], style, markevery=max(1, len(points) // 8), markersize=4,
                        linewidth=1.2, label=labels[run_id], **styles[run_id])
    ax.grid(alpha=0.3)
    ax.ticklabel_format(axis="y", useOffset=False)  # cosines near 1 as 0.9998, never 1e-4+9.997e-1
    ax.yaxis.set_major_locator(MaxNLocator(6, steps=[1, 2, 2.5, 5, 10]))
    if not ax.has_data():
        ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=ax.transAxes)


def gate_curves_figure(runs: pd.DataFrame, hist: pd.DataFrame, path: Path) -> Path | None:
    """Whether a recipe trains every seed, as curves: a panel per variant (and preset), a line per pretraining
    run and accuracy the gate checked on it (colour: the run's seed, the same in every panel; solid: the
    auxiliary's or MLM's accuracy, dashed: replaced tokens found), each bound dotted, and how many of the
    variant's runs trained in the panel's title. None when no run logged a curve the gate reads."""
    gates = {row["run_id"]: run_gate(row) for _, row in runs.iterrows()}  # once a run: checked and verdict
    curves = {key: points.sort_values("step") for key, points in hist.groupby(["run_id", "key"])}
    lines = [(row, GATE_CURVES[name]) for _, row in runs.iterrows() for name in gates[row["run_id"]].checked
             if name in GATE_CURVES and (row["run_id"], GATE_CURVES[name].metric) in curves]
    if not lines:
        return None
    plt = pyplot()
    groups = list(dict.fromkeys((row["preset"], row["variant"]) for row, _ in lines))
    seeds = sorted({str(row.get("seed", "")) for row, _ in lines}, key=lambda s: (len(s), s))  # 2 before 10
    colour = {seed: PALETTE[i % len(PALETTE)] for i, seed in enumerate(seeds)}
    columns = min(4, len(groups))
    rows = -(-len(groups) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    for ax, (preset, variant) in zip(axes.flat, groups):
        mine = [(row, c) for row, c in lines if (row["preset"], row["variant"]) == (preset, variant)]
        for row, c in mine:
            points = curves[(row["run_id"], c.metric)]
            ax.plot(points["step"], points["value"], GATE_LINESTYLE[c.name], color=colour[str(row.get("seed", ""))],
                    linewidth=1.2)
        for bound in {c.bound for _, c in mine}:
            ax.axhline(bound, color="black", linestyle=":", linewidth=1)
        of_variant = runs.loc[(runs["preset"] == preset) & (runs["variant"] == variant), "run_id"]
        trained = sum(gates[run_id].verdict == TRAINED for run_id in of_variant)
        ax.set(title=f"{variant} ({preset}): {trained} of {len(of_variant)} trained", xlabel="pretraining step",
               ylabel="accuracy")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], color=colour[s]) for s in seeds]
    names = [f"seed {s}" if s else "no seed tag" for s in seeds]
    handles += [plt.Line2D([], [], color="black", linestyle=style) for style in ("-", "--", ":")]
    names += ["auxiliary / MLM accuracy", "replaced tokens found", "the gate's bound"]
    return save(fig, "The gate's curves: each pretraining run, the bounds it must pass at its last interval", path,
                bottom=legend_below(fig, handles, names))


def _differing_words(first: str, second: str) -> list[str]:
    """'copy_accuracy_replaced', 'copy_accuracy_original' -> ['replaced', 'original']."""
    a, b = first.split("_"), second.split("_")
    return [" ".join(w for w in a if w not in b), " ".join(w for w in b if w not in a)]


def label_fraction_table(runs: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """Fig. 7c/d's numbers: per pretraining run and task fine-tuned on fractions of its labels, one row per
    fraction (1 = all the labels, when that sweep ran too) with the best point's median, min and max."""
    points = with_fractions(scores)
    curved = set(points.loc[points["fraction"] < 1, "base"])
    points = points[points["base"].isin(curved)].merge(runs[RUN_COLUMNS], left_on="pretraining_run", right_on="run_id")
    columns = [*RUN_COLUMNS, "base", "fraction", "score", "min", "max", "seeds"]
    return points[columns].rename(columns={"base": "task"}).sort_values(
        ["task", "preset", "variant", "fraction"], kind="stable").reset_index(drop=True)


def label_fraction_figure(table: pd.DataFrame, path: Path, styles: dict[str, dict] | None = None) -> Path:
    """Paper Fig. 7c/d: a panel per task, score (median over seeds, x100) against the fraction of training
    labels on a log axis, a line per pretraining run (its colour and marker from `styles`), error bars from
    the seeds' min to max, one legend under the panels."""
    plt = pyplot()
    tasks = list(dict.fromkeys(table["task"]))
    run_ids = list(dict.fromkeys(table["run_id"]))
    styles = styles or run_styles(run_ids)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for run_id, line in table[table["task"] == task].groupby("run_id", sort=False):
            y = 100 * line["score"].to_numpy()
            error = [y - 100 * line["min"].to_numpy(), 100 * line["max"].to_numpy() - y]
            # each run a little to the side (in log x) so that its error bars do not hide the others'
            nudge = 10 ** (0.01 * (run_ids.index(run_id) - (len(run_ids) - 1) / 2))
            ax.errorbar(line["fraction"] * nudge, y, yerr=error, capsize=2, markersize=4, linewidth=1.2, elinewidth=0.8,
                        **styles[run_id])
        fractions = sorted(set(table["fraction"]))
        ax.set_xscale("log")
        ax.set_xticks(fractions, [f"{f:g}" for f in fractions])  # 0.01 rather than 10^-2
        ax.minorticks_off()
        ax.set(title=task, xlabel="fraction of the training labels", ylabel="dev score x100")
        ax.grid(alpha=0.3)
    rows = table.drop_duplicates("run_id")
    handles = [plt.Line2D([], [], **styles[r]) for r in rows["run_id"]]
    bottom = legend_below(fig, handles, [_label(row) for _, row in rows.iterrows()])
    return save(fig, "Fig. 7c/d: fine-tuning on fractions of the labels (median over seeds, bars: min-max)", path,
                bottom=bottom)


# ----------------------------------------------------------------------------- the report


@dataclass
class Report:
    out: Path
    finetuning: pd.DataFrame
    ablation: pd.DataFrame
    files: list[Path] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    analysis_run: str = ""


def _label(row) -> str:
    seed = row.get("seed", "")
    return f"{row['variant']}{f' s{seed}' if seed not in ('', None) else ''} ({row['preset']})"


def build(client, experiment: str | None, out: Path) -> Report:
    """Every table and figure into `out`; nothing is logged here."""
    out.mkdir(parents=True, exist_ok=True)
    experiments = experiment_ids(client, experiment)
    runs = latest_per_seed(pretraining_runs(client, experiments))
    for column in RUN_COLUMNS:  # a store without runs still has the table's columns
        runs = runs if column in runs else runs.assign(**{column: pd.Series(dtype=object)})
    scores = sweep_scores(client, experiments)
    table = finetuning_table(runs, scores[with_fractions(scores)["fraction"] >= 1])
    ablation = ablation_table(table)
    files = []
    reported = reported_splits(scores)
    for name, df, diffs in (("finetuning_table", table, False), ("ablation_table", ablation, True)):
        df.to_csv(out / f"{name}.csv", index=False)  # missing values are empty cells
        title = (f"Fine-tuning (Table 1 style): the grid point with the best dev median, median over seeds of "
                 f"{reported}, x100" if not diffs else
                 f"Ablation (Table 3 style): x100 ({reported}), (difference to {BASELINE} of the same preset)")
        (out / f"{name}.md").write_text(f"{title}\n\n" + score_markdown(df, with_diffs=diffs))
        files += [out / f"{name}.csv", out / f"{name}.md"]
    labels = {row["run_id"]: _label(row) for _, row in runs.iterrows()}
    keys = [*(k for panel in (*FIG8, *FIG7) for k in panel[1:]), *CLAIM_CURVES,  # every curve the claims read too
            *(c.metric for c in GATE_CURVES.values())]
    hist = histories(client, list(labels), keys)
    styles = run_styles(labels)  # one colour and marker per run, in every figure
    for panels, title, name, ylabel in CURVE_FIGURES:
        made = curves_figure(hist, labels, panels, title, out / f"{name}.png", ylabel, styles)
        files += [made] if made else []
    made = gate_curves_figure(runs, hist, out / "gate_curves.png")
    files += [made] if made else []
    pairs = represent_pairs(client, runs)
    files += _representation(runs, pairs, out)
    files += _label_fractions(runs, scores, out, styles)
    files += pretraining_table(runs, out)
    # Few-shot studies go to their own experiment by default: read them from the whole store, for these runs.
    fewshot = fewshot_scores(client, experiment_ids(client, None))
    claims = judge(runs, hist, scores, fewshot[fewshot["pretraining_run"].isin(runs["run_id"])])
    (out / "claims.md").write_text(claims_markdown(claims, runs))
    files.append(out / "claims.md")
    files += runs_table(runs, table, out)
    files += timeline_table(timeline(client, experiments), out)
    return Report(out, table, ablation, files, claims=claims)


def reported_splits(scores: pd.DataFrame) -> str:
    """Which split each task's numbers come from (dev chose the grid point; test reports where it exists)."""
    if scores.empty or "split" not in scores:
        return "the dev split"
    by_task = scores.groupby("task")["split"].agg(lambda s: "/".join(sorted(set(s))))
    return "the reported split: " + ", ".join(f"{task} {split}" for task, split in by_task.items())


def _label_fractions(runs: pd.DataFrame, scores: pd.DataFrame, out: Path, styles: dict[str, dict]) -> list[Path]:
    """The label-fraction table and figure, when a sweep ran with --label-fractions."""
    table = label_fraction_table(runs, scores)
    if table.empty:
        return []
    table.to_csv(out / "label_fractions.csv", index=False)
    shown = table.assign(**{c: [f"{100 * v:.2f}" if pd.notna(v) else "-" for v in table[c].astype(float)]
                            for c in ("score", "min", "max")})
    (out / "label_fractions.md").write_text("Fine-tuning on fractions of the labels (Fig. 7c/d): best grid point per "
                                            "fraction: median, min and max over seeds, x100 as every score table\n\n"
                                            + plain_markdown(shown))
    return [out / "label_fractions.csv", out / "label_fractions.md",
            label_fraction_figure(table, out / "fig7cd_label_fractions.png", styles)]


def pretraining_table(runs: pd.DataFrame, out: Path) -> list[Path]:
    """The last value of each pretraining metric per variant: the ones comparable across variants
    first, `loss` last with a note (each variant sums different terms). A metric a variant does not
    compute is missing, never 0."""
    if runs.empty:
        return []
    keys = [k for k in (*COMPARABLE_METRICS, *NOT_COMPARABLE) if f"metrics.{k}" in runs]
    table = runs[["variant", *[f"metrics.{k}" for k in keys]]].rename(columns=lambda c: c.removeprefix("metrics."))
    table.to_csv(out / "pretraining_metrics.csv", index=False)
    shown = table.rename(columns={k: f"{k} (not comparable)" for k in NOT_COMPARABLE})
    note = ("Pretraining, last logged value per variant. Compare accuracies, loss parts and representation "
            "metrics across variants; `loss` is each variant's own weighted sum of different terms.\n\n")
    (out / "pretraining_metrics.md").write_text(note + plain_markdown(shown))
    return [out / "pretraining_metrics.csv", out / "pretraining_metrics.md"]


RUN_METRICS = ("aux_mlm_accuracy", "mlm_accuracy", "copy_accuracy_replaced", "lm_accuracy_replaced",
               REPRESENT_METRICS[0], *PROBE_METRICS)  # the per-run table's pretraining and readout columns


def runs_table(runs: pd.DataFrame, finetuning: pd.DataFrame, out: Path) -> list[Path]:
    """One row per pretraining run: its seed, the gate's verdict, what the gate and the probes read, and its
    fine-tuning scores (median over fine-tuning seeds): every number the claims rest on, run by run."""
    if runs.empty:
        return []
    gated = with_gate(runs)
    table = gated[["preset", "variant", "seed", "run_id", "status", "gate"]].copy()
    # minutes from the run's start to its end in the store; missing (NaN) for a run not ended
    table.insert(5, "minutes", (gated["end_time"].astype(float) - gated["start_time"].astype(float)) / 60_000)
    # what its steps computed in (model.step.step_precision): a CPU without native bf16 runs fp32 where the
    # preset asks for bf16, so a study run on two machines shows it
    table.insert(6, "precision", gated["precision"] if "precision" in gated else "")
    for key in RUN_METRICS:
        if f"metrics.{key}" in gated:
            table[key] = gated[f"metrics.{key}"].astype(float)
    tasks = [c for c in finetuning.columns if c not in RUN_COLUMNS and c != AVG]
    table = table.merge(finetuning[["run_id", *tasks]], on="run_id", how="left")
    table = table.sort_values(["preset", "variant", "seed"], kind="stable")
    table.to_csv(out / "runs.csv", index=False)
    (out / "runs.md").write_text("Pretraining runs, one row each (the unit of replication): minutes from the "
                                 "run's first start to its end (a resumed run counts the pause), what its steps "
                                 "computed in, the gate's verdict (jobs/gate.py), last logged metrics, readouts, fine-tuning medians over "
                                 "seeds (x1)\n\n" + plain_markdown(table))
    return [out / "runs.csv", out / "runs.md"]


def timeline_table(runs: pd.DataFrame, out: Path) -> list[Path]:
    """The time a study took: its runs in the order they started, minutes from the first start, and the span
    from the first start to the last end (jobs.run_tables.timeline). MLflow keeps a resumed run's first start, so
    a run stopped and resumed later counts the pause, and a study run over several sittings spans them; the
    readouts logged on a finished pretraining run (probes, [CLS] cosines) fall between its rows."""
    if runs.empty:
        return []
    first = runs["start_time"].min()
    table = pd.DataFrame({
        "start (min)": (runs["start_time"] - first) / 60_000,
        "minutes": (runs["end_time"] - runs["start_time"]) / 60_000,  # missing for a run not ended
        "status": runs["status"], "kind": runs["kind"], "run": runs["run_name"], "variant": runs["variant"],
        "seed": runs["seed"]})
    table.to_csv(out / "timeline.csv", index=False)
    ended, live = runs["end_time"].dropna(), int(runs["end_time"].isna().sum())
    span = (f"{(ended.max() - first) / 60_000:.1f} minutes from the first start ({_utc(first)}) to the last end "
            f"({_utc(ended.max())})" if len(ended) else f"started {_utc(first)}, no run ended yet")
    (out / "timeline.md").write_text(
        f"The study's runs in the order they started: {len(runs)} runs, {span}"
        + (f"; {live} not ended" if live else "") + ". A resumed run counts its pause, and a study run over "
        "several sittings spans them; readouts logged on a finished pretraining run fall between rows.\n\n"
        + plain_markdown(table))
    return [out / "timeline.csv", out / "timeline.md"]


def _utc(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def plain_markdown(df: pd.DataFrame) -> str:
    """A markdown table with 4 decimals, missing values as '-'."""
    def cell(value) -> str:
        if isinstance(value, float):
            return "-" if np.isnan(value) else f"{value:.4f}"
        return str(value)

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def represent_pairs(client, runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per run that jobs.studies.represent analysed, its per-pair [CLS] cosines (kind, cosine)."""
    present = [f"metrics.{m}" for m in REPRESENT_METRICS if f"metrics.{m}" in runs.columns]
    if not present:
        return {}
    pairs = {}
    with tempfile.TemporaryDirectory(prefix="cocolm-report-") as tmp:
        for _, row in runs[runs[present].notna().any(axis=1)].iterrows():
            try:
                local = client.download_artifacts(row["run_id"], REPRESENT_ARTIFACT, tmp)
            except Exception:  # an older run with metrics but no per-pair file: table only
                continue
            pairs[row["run_id"]] = pd.read_csv(local)
    return pairs


def _representation(runs: pd.DataFrame, pairs: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """The summary metrics table and the histogram figure of the runs that jobs.studies.represent analysed."""
    columns = [f"metrics.{m}" for m in REPRESENT_METRICS]
    present = [c for c in columns if c in runs.columns]
    if not present:
        return []
    done = runs[runs[present].notna().any(axis=1)]
    summary = done[RUN_COLUMNS].assign(**{c.split("/")[-1]: done.get(c, np.nan) for c in columns})
    summary.to_csv(out / "representation.csv", index=False)
    body = "\n".join(f"| {r.variant} | {r.seed} | {r.preset} | {r.random_cosine_mean:.3f} | {r.similar_cosine_mean:.3f} | "
                     f"{r.cosine_gap:.3f} |" for r in summary.itertuples())
    (out / "representation.md").write_text("Mean [CLS] cosine (Fig. 1/5)\n\n| variant | seed | preset | random pairs | "
                                           "similar pairs | gap |\n|---|---|---|---|---|---|\n" + body + "\n")
    files = [out / "representation.csv", out / "representation.md"]
    cosines = {_label(row): pairs[row["run_id"]] for _, row in done.iterrows() if row["run_id"] in pairs}
    if cosines:
        files.append(representation_figure(cosines, out / "fig1_cls_cosine.png"))
    return files


def log_report(client, tracking_uri: str, report: Report, experiment: str | None) -> str:
    """An "analysis" run (in the study's experiment, else in "analysis") holding every file as an artifact."""
    experiment_id = tracking.experiment_id(client, experiment or ANALYSIS_EXPERIMENT, tracking_uri)
    run = client.create_run(experiment_id, run_name="analysis-report", tags={
        KIND_TAG: KIND_ANALYSIS, "git_commit": tracking.git_commit(),
        "mlflow.note.content": "Tables and figures of `python -m analysis.report`: see Artifacts."})
    try:
        for path in report.files:
            client.log_artifact(run.info.run_id, str(path))
    except BaseException:
        tracking.end_run(client, run.info.run_id, ok=False)
        raise
    tracking.end_run(client, run.info.run_id, ok=True)
    return run.info.run_id


@dataclass(frozen=True)
class ReportOptions:
    out: str = field(metadata=option("folder for the tables and figures"))
    experiment: str | None = field(default=None, metadata=option(
        "only this MLflow experiment (default: all); the analysis run goes there"))
    tracking_uri: str | None = field(default=None, metadata=option(
        "MLflow tracking URI (default: sqlite store under $COCOLM_HOME)"))
    log: bool = field(default=True, metadata=option("log the files on an analysis run (--no-log: write them only)"))


def run(opts: ReportOptions) -> Report:
    set_hermetic_env()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    tracking_uri = opts.tracking_uri or tracking.default_tracking_uri()
    tracking.check_sqlite(tracking_uri)  # a store that only is read: never made here
    client = MlflowClient(tracking_uri)
    out = Path(opts.out)
    report = build(client, opts.experiment, out)
    if opts.log:
        report.analysis_run = log_report(client, tracking_uri, report, opts.experiment)
    print((out / "finetuning_table.md").read_text())
    print((out / "ablation_table.md").read_text())
    print((out / "claims.md").read_text())
    print("wrote:\n" + "\n".join(f"  {p}" for p in report.files))
    if report.analysis_run:
        print(f"MLflow analysis run: {report.analysis_run}")
    return report


def main(argv: list[str] | None = None) -> Report:
    return run(parse_options("python -m analysis.report", __doc__, ReportOptions, argv))


if __name__ == "__main__":
    run_main(main)
