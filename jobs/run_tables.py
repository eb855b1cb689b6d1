"""Tracked runs -> pandas: pretraining runs, fine-tuning sweep parents, metric histories. No torch.

The tags read here are written by the jobs (jobs/pretraining/job.py, jobs/finetuning/sweep.py, jobs/studies/represent.py); their
names come from jobs.names, their one definition.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from jobs.cli import UserError
from jobs.names import (DEV_STAT, KIND_FEWSHOT, KIND_PRETRAINING, KIND_SWEEP, KIND_TAG, PRECISION_TAG,
                        PRETRAINING_SEED_TAG, PRETRAINING_TAG, SEED_STAT, STOP_TAG, best_task, best_task_metric,
                        dev_seed_scores, fewshot_metric, reported_split_tag, seed_scores, split_fraction)
from jobs.gate import GATE_PARAMS

# The params that say how much a pretraining run trained: two runs are compared only when these agree.
BUDGET_PARAMS = ("train.max_steps", "train.global_batch", "data.seq_len", "train.long_steps", "data.long_seq_len")
SEED_PARAMS = ("train.seed", "data.seed")  # a study's pretraining seed sets both (jobs.studies.ablate)


def experiment_ids(client, experiment: str | None) -> list[str]:
    """The named experiment (an error naming the known ones if absent), or every active experiment."""
    if experiment:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            known = sorted(e.name for e in client.search_experiments())
            raise UserError(f"no MLflow experiment {experiment!r}; this store has {known}")
        return [found.experiment_id]
    return [e.experiment_id for e in client.search_experiments()]


def search(client, experiments: Sequence[str], filter_string: str) -> list:
    """Every run matching the filter (MLflow pages at 1000; studies are small, but never silently cut)."""
    runs, token = [], None
    while experiments:
        page = client.search_runs(list(experiments), filter_string=filter_string, max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            break
    return runs


LIVE = ("RUNNING", "SCHEDULED")  # MLflow statuses of a run in progress


def ended_at(info) -> float | None:
    """When a run ended (ms since the epoch), or None while it is in progress: MLflow keeps the end time of a
    run that failed or was killed when its resume sets it RUNNING again."""
    return None if info.status in LIVE or not info.end_time else info.end_time


def pretraining_runs(client, experiments: Sequence[str]) -> pd.DataFrame:
    """One row per pretraining run: ids, preset, variant, its pretraining seed (`seed`: the study's tag, else
    the run's train.seed), status, times, its training budget (`params.<BUDGET_PARAMS>`), what the gate
    reads (`params.<GATE_PARAMS>`), why it stopped itself if it did (`stopped`), what its steps computed in
    (`precision`: bf16 or fp32, empty for runs older than the tag) and the last value of every metric.
    Sorted by start time, oldest first."""
    rows = []
    for run in search(client, experiments, f"tags.{KIND_TAG} = '{KIND_PRETRAINING}'"):
        tags, params = run.data.tags, run.data.params
        rows.append({"run_id": run.info.run_id, "run_name": run.info.run_name,
                     "experiment_id": run.info.experiment_id, "preset": tags.get("preset", ""),
                     "variant": tags.get("variant", ""),
                     "seed": str(tags.get(PRETRAINING_SEED_TAG, params.get("train.seed", ""))),
                     "status": run.info.status, "start_time": run.info.start_time, "end_time": ended_at(run.info),
                     "stopped": tags.get(STOP_TAG, ""), "precision": tags.get(PRECISION_TAG, ""),
                     **{f"params.{p}": params.get(p) for p in (*BUDGET_PARAMS, *SEED_PARAMS, *GATE_PARAMS)},
                     **{f"metrics.{k}": v for k, v in run.data.metrics.items()}})
    columns = ["run_id", "run_name", "experiment_id", "preset", "variant", "seed", "status", "start_time", "end_time"]
    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)
    return df.sort_values("start_time", kind="stable").reset_index(drop=True)


def latest_per_seed(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs a study reports: per (preset, variant, pretraining seed) the newest finished one, else the
    newest of any status. Every seed of a variant is kept: the pretraining run is the unit of replication."""
    if runs.empty:
        return runs
    keys = ["preset", "variant", "seed"] if "seed" in runs else ["preset", "variant"]
    ranked = runs.assign(_finished=runs["status"] == "FINISHED").sort_values(["_finished", "start_time"],
                                                                           kind="stable")
    return ranked.groupby(keys, sort=False).tail(1).drop(columns="_finished") \
        .sort_values("start_time", kind="stable").reset_index(drop=True)


def finished_run_ids(client, experiment: str | None, tracking_uri: str, newest_per_seed: bool = True) -> list[str]:
    """The finished pretraining runs of an experiment (per preset, variant and seed the newest, unless
    `newest_per_seed` is off): what a readout's `--from-experiment` reads; none is an error."""
    runs = pretraining_runs(client, experiment_ids(client, experiment))
    runs = latest_per_seed(runs) if newest_per_seed else runs
    run_ids = list(runs.loc[runs["status"] == "FINISHED", "run_id"]) if len(runs) else []
    if not run_ids:
        raise UserError(f"no finished pretraining run in experiment {experiment!r} of {tracking_uri}")
    return run_ids


def sweep_scores(client, experiments: Sequence[str]) -> pd.DataFrame:
    """One row per (pretraining run, task): the best grid point's median score of the newest finished sweep
    parent of that pretraining run that has the task. The point was chosen by its dev median; `split` says
    which split the reported columns come from (test where the task has one, else dev). Columns:
    pretraining_run, task, split, score (the reported median; its min and max over seeds), values (the
    reported score per seed, in seed order), dev_score and dev_values (the dev split's, which chose the
    point), exact (a span task's EM median), seeds, sweep_run, start_time, glue_avg."""
    rows = []
    for run in search(client, experiments, f"tags.{KIND_TAG} = '{KIND_SWEEP}' and attributes.status = 'FINISHED'"):
        pretraining = run.data.tags.get(PRETRAINING_TAG, "")
        for key, value in run.data.metrics.items():
            task = best_task(key)
            if task:
                metrics = run.data.metrics
                split = run.data.tags.get(reported_split_tag(task), "dev")  # older sweeps reported dev, untagged
                values = tuple(v for _, v in sorted(seed_scores(metrics, task).items()))
                dev_values = tuple(v for _, v in sorted(dev_seed_scores(metrics, task).items()))
                rows.append({"pretraining_run": pretraining, "task": task, "split": split, "score": value,
                             "min": metrics.get(best_task_metric(task, "min"), np.nan),
                             "max": metrics.get(best_task_metric(task, "max"), np.nan),
                             "values": values,
                             "dev_score": metrics.get(best_task_metric(task, DEV_STAT + "median"),
                                                      value if split == "dev" else np.nan),
                             "dev_values": dev_values or (values if split == "dev" else ()),
                             "exact": metrics.get(best_task_metric(task, "exact_median"), np.nan),  # SQuAD's EM
                             "seeds": len([s for s in run.data.params.get("seeds", "").split(",") if s.strip()]) or np.nan,
                             "sweep_run": run.info.run_id, "start_time": run.info.start_time,
                             "glue_avg": metrics.get("glue_avg", np.nan)})
    columns = ["pretraining_run", "task", "split", "score", "min", "max", "values", "dev_score", "dev_values", "exact",
               "seeds", "sweep_run", "start_time", "glue_avg"]
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows, columns=columns).sort_values("start_time", kind="stable")
    return df.groupby(["pretraining_run", "task"], sort=False).tail(1).reset_index(drop=True)


def with_fractions(scores: pd.DataFrame) -> pd.DataFrame:
    """`sweep_scores` with each task split into `base` (SNLI) and `fraction` of the labels (0.1; 1 for all)."""
    parsed = [split_fraction(t) for t in scores["task"]]
    return scores.assign(base=[b for b, _ in parsed], fraction=[f for _, f in parsed])


def histories(client, run_ids: Sequence[str], keys: Sequence[str]) -> pd.DataFrame:
    """Long table run_id, key, step, value of every logged value of `keys` (absent keys give no rows)."""
    rows = [{"run_id": run_id, "key": key, "step": m.step, "value": m.value}
            for run_id in run_ids for key in keys for m in client.get_metric_history(run_id, key)]
    df = pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])
    return df.sort_values(["run_id", "key", "step"], kind="stable").reset_index(drop=True)


def fewshot_scores(client, experiments: Sequence[str]) -> pd.DataFrame:
    """One row per (pretraining run, task, method) of the newest finished few-shot study of that run: the
    test accuracy per split at the chosen learning rate (`values`, in split order) and their mean."""
    rows = []
    for run in search(client, experiments, f"tags.{KIND_TAG} = '{KIND_FEWSHOT}' and attributes.status = 'FINISHED'"):
        metrics, found = run.data.metrics, {}
        for key, value in metrics.items():
            parts = key.split("/")
            if len(parts) == 4 and parts[0] == "fewshot" and parts[3].startswith(SEED_STAT):
                found.setdefault((parts[1], parts[2]), {})[int(parts[3].removeprefix(SEED_STAT))] = value
        for (task, method), by_split in found.items():
            rows.append({"pretraining_run": run.data.tags.get(PRETRAINING_TAG, ""), "task": task, "method": method,
                         "values": tuple(v for _, v in sorted(by_split.items())),
                         "mean": metrics.get(fewshot_metric(task, method, "mean"), np.nan),
                         "start_time": run.info.start_time})
    columns = ["pretraining_run", "task", "method", "values", "mean", "start_time"]
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows, columns=columns).sort_values("start_time", kind="stable")
    return df.groupby(["pretraining_run", "task", "method"], sort=False).tail(1).reset_index(drop=True)


TIMED_KINDS = (KIND_PRETRAINING, KIND_SWEEP, KIND_FEWSHOT)  # a study's top-level runs: its time is theirs


def timeline(client, experiments: Sequence[str]) -> pd.DataFrame:
    """Every top-level run of a study (pretraining runs with the random-init controls, fine-tuning sweep
    parents, few-shot studies) in the order it started: kind, name, variant and pretraining seed (a sweep's
    or few-shot study's from the pretraining run it reads, where that is in these experiments), status,
    start and end (ms since the epoch; end missing for a run that has not ended)."""
    rows = []
    for kind in TIMED_KINDS:
        for run in search(client, experiments, f"tags.{KIND_TAG} = '{kind}'"):
            tags = run.data.tags
            rows.append({"run_id": run.info.run_id, "run_name": run.info.run_name, "kind": kind,
                         "variant": tags.get("variant", ""),
                         "seed": str(tags.get(PRETRAINING_SEED_TAG, run.data.params.get("train.seed", ""))),
                         "pretraining_run": tags.get(PRETRAINING_TAG, ""), "status": run.info.status,
                         "start_time": run.info.start_time, "end_time": ended_at(run.info)})
    columns = ["run_id", "run_name", "kind", "variant", "seed", "status", "start_time", "end_time"]
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows)
    read = df[df["kind"] == KIND_PRETRAINING].set_index("run_id")
    for column in ("variant", "seed"):  # a readout of a pretraining run: that run's variant and seed
        inherited = df["pretraining_run"].map(read[column])
        df[column] = df[column].where((df["kind"] == KIND_PRETRAINING) | inherited.isna(), inherited)
    df["end_time"] = df["end_time"].astype(float)
    return df[columns].sort_values("start_time", kind="stable").reset_index(drop=True)
