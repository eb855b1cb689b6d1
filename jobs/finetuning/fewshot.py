"""Few-shot fine-tuning (paper Table 4): prompt-based with the language-model head, and the standard [CLS] head,
on the same k-shot splits, on Ray Tune, tracked in MLflow (docs/method.md section 7.8).

    python -m jobs.finetuning.fewshot --from RUN|last|DIR --tasks snli [--shots 16] [--splits 5]
        [--lrs 1e-5,2e-5,5e-5] [--steps 1000] [--batch-size 8] [--eval-every 100] [--max-length 256]
        [--methods prompt,head] [--tracking-uri URI] [--experiment fewshot] [--storage DIR]
        [--cpus-per-trial C] [--gpus-per-trial G] [--max-failures N]

Per task, `--splits` k-shot splits (LM-BFF's data seeds 13, 21, 42, 87, 100): `--shots` training and
`--shots` dev examples per class from the training set; the test set is the task's test split, else its
(first) dev split, whole. One trial per (method, learning rate, split): `--steps` optimizer steps of
`--batch-size`, dev accuracy every `--eval-every` steps, the best evaluation's weights scored on test.
Per method the learning rate with the best mean dev accuracy over the splits is reported: the mean and
standard deviation over the splits of its test accuracy, as Table 4 does. A pretraining run without a
language-model head (rtd_only, scl_rtd, electra) gets "not applicable" for prompts, with the reason.
The trials run on Ray Tune as the sweep's do (`jobs/finetuning/tune.py`: 0.25 GPU each where the
cluster has GPUs), through the sweep's step engine (`jobs/finetuning/engine.py`); the trial itself is
`jobs/finetuning/fewshot_trial.py`.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from jobs import tracking
from jobs.cli import AT_LEAST_ONE, POSITIVE, Range, UserError, option, parse_options, run_main
from jobs.data.schemes import Scheme, load_scheme
from jobs.env import set_hermetic_env
from jobs.pretraining.encoders import resolve_encoder
from jobs.pretraining.pretrained import PretrainedEncoder
from jobs.finetuning.encoding import encode_split
from jobs.finetuning.fewshot_trial import SplitData, trial_name, tune_trial
from jobs.finetuning.prompts import SPLIT_SEEDS, Prompt, encode_prompts, few_shot_split, prompt_for
from jobs.finetuning.tasks import load_tasks
from jobs.finetuning.tasks.task import Split, Task
from jobs.finetuning.tune import CPUS_PER_TRIAL, GPUS_PER_TRIAL, MAX_FAILURES, ParentRun, run_trials
from jobs.names import FEWSHOT_EXPERIMENT, KIND_FEWSHOT, KIND_TAG, PRETRAINING_TAG, SEED_STAT, fewshot_metric

METHODS = ("prompt", "head")


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip())


def _methods(text: str) -> tuple[str, ...]:
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    if not methods or set(methods) - set(METHODS):
        raise UserError(f"--methods: expected a comma list of {METHODS}, got {text!r}")
    return methods


@dataclass(frozen=True)
class FewShotOptions:
    source: str = field(metadata=option("pretraining MLflow run id, `last`, exported encoder or checkpoint directory",
                                        flag="--from"))
    tasks: str = field(default="snli", metadata=option("snli | a GLUE task | comma list | a task file or folder "
                                                       "with a prompt.json"))
    shots: int = field(default=16, metadata=option("training and dev examples per class in each split", bounds=AT_LEAST_ONE))
    splits: int = field(default=5, metadata=option(f"k-shot splits, data seeds {SPLIT_SEEDS}", bounds=Range(1, len(SPLIT_SEEDS))))
    lrs: tuple[float, ...] = field(default=(1e-5, 2e-5, 5e-5), metadata=option(
        "learning rates (LM-BFF's grid for base-size models)", parse=_floats, bounds=POSITIVE))
    steps: int = field(default=1000, metadata=option("optimizer steps per trial (LM-BFF: 1000)", bounds=AT_LEAST_ONE))
    batch_size: int = field(default=8, metadata=option("examples per step (LM-BFF: 8)", bounds=AT_LEAST_ONE))
    eval_every: int = field(default=100, metadata=option("steps between dev evaluations", bounds=AT_LEAST_ONE))
    max_length: int = field(default=256, metadata=option("tokens of the prompt with its demonstrations", bounds=Range(8)))
    methods: tuple[str, ...] = field(default=METHODS, metadata=option("prompt, head, or both", parse=_methods))
    data_dir: str | None = field(default=None, metadata=option("folder with the GLUE task folders"))
    tracking_uri: str | None = field(default=None, metadata=option("MLflow tracking URI (default: $COCOLM_HOME)"))
    experiment: str = field(default=FEWSHOT_EXPERIMENT, metadata=option("MLflow experiment"))
    storage: str | None = field(default=None, metadata=option("Tune storage (default: $COCOLM_HOME/ray_results)"))
    cpus_per_trial: float = field(default=1.0, metadata=CPUS_PER_TRIAL)
    gpus_per_trial: float | None = field(default=None, metadata=GPUS_PER_TRIAL)
    max_failures: int = field(default=1, metadata=MAX_FAILURES)

    def __post_init__(self) -> None:
        if not self.lrs:
            raise UserError("--lrs: give at least one learning rate")


# ----------------------------------------------------------------------------- one split's data


def test_split(task: Task) -> Split:
    """The split Table 4 reports: the task's test split, else its first dev split, whole."""
    return task.test if task.test is not None else task.dev[task.spec.dev_splits[0]]


def forms(scheme: Scheme, task: Task, splits: dict[str, Split], max_length: int, prompt: Prompt | None):
    """Each split in both methods' forms: the [CLS] format, and prompt data when prompts apply (with the
    notes on label words), in the encoder's tokenizer scheme (the authors' too)."""
    head = {name: encode_split(scheme, split, max_length)[0] for name, split in splits.items()}
    if prompt is None:
        return head, None, ()
    encoded = {name: encode_prompts(scheme, prompt, task, split) for name, split in splits.items()}
    return head, {name: data for name, (data, _) in encoded.items()}, tuple(next(iter(encoded.values()))[1])


def split_data(task: Task, seed: int, shots: int, scheme: Scheme, max_length: int, prompt: Prompt | None,
               test: tuple) -> SplitData:
    """One data seed's k-shot train and dev sets, with `test` (`forms` of the test split, encoded once per
    task since every split shares it)."""
    train, dev = few_shot_split(task, shots, seed)
    head, prompts, notes = forms(scheme, task, {"train": task.train.take(train), "dev": task.train.take(dev)},
                                 max_length, prompt)
    test_head, test_prompts, _ = test
    return SplitData(task.spec.name, seed, None if prompts is None else {**prompts, **test_prompts},
                     {**head, **test_head}, scheme.pad_id, len(task.spec.labels), notes)


# ----------------------------------------------------------------------------- the job


@dataclass(frozen=True)
class FewShotResult:
    run_id: str
    trials: pd.DataFrame  # one row per trial
    table: pd.DataFrame  # per task and method: the chosen lr, test mean and std over the splits


def run(opts: FewShotOptions) -> FewShotResult:
    set_hermetic_env()
    tracking_uri = opts.tracking_uri or tracking.default_tracking_uri()
    tracking.check_tracking(tracking_uri)
    storage = opts.storage or tracking.default_storage()
    tracking.check_storage(storage)
    client = MlflowClient(tracking_uri)
    experiment_id = tracking.experiment_id(client, opts.experiment, tracking_uri)
    seeds = SPLIT_SEEDS[: opts.splits]
    tasks = load_tasks(opts.tasks, opts.data_dir)
    with tempfile.TemporaryDirectory(prefix="cocolm-fewshot-") as workdir:  # the downloaded encoder: read, then gone
        encoder = resolve_encoder(opts.source, tracking_uri, Path(workdir))
        not_applicable = "" if encoder.lm_head_state is not None else (
            f"not applicable: the pretraining variant ({encoder.variant or 'unknown'}) trains no language-model head")
        methods = [m for m in opts.methods if m == "head" or not not_applicable]
        scheme = load_scheme(encoder.tokenizer_dir)
        prompts = {t.spec.name: prompt_for(t, opts.tasks) if "prompt" in methods else None for t in tasks}
        tests = {t.spec.name: forms(scheme, t, {"test": test_split(t)}, opts.max_length, prompts[t.spec.name])
                 for t in tasks}
        data = {f"{t.spec.name}/{s}": split_data(t, s, opts.shots, scheme, opts.max_length, prompts[t.spec.name],
                                                 tests[t.spec.name])
                for t in tasks for s in seeds}
    configs = [{"task": t.spec.name, "method": m, "lr": lr, "split": s}
               for t in tasks for m in methods for lr in opts.lrs for s in seeds]
    parent = client.create_run(experiment_id, run_name=f"fewshot-{opts.tasks}"[:200], tags={
        KIND_TAG: KIND_FEWSHOT, PRETRAINING_TAG: encoder.pretraining_run, "variant": encoder.variant})
    run_id = parent.info.run_id
    with tracking.ending_run(client, run_id):
        tracking.log_params(client, run_id, {"from": opts.source, "tasks": opts.tasks, "shots": opts.shots,
                                             "splits": opts.splits, "lrs": ",".join(f"{v:g}" for v in opts.lrs),
                                             "steps": opts.steps, "batch_size": opts.batch_size,
                                             "methods": ",".join(methods), "trials": len(configs)})
        notes = sorted({note for d in data.values() for note in d.notes})
        if notes:
            print("\n".join(notes), flush=True)
            client.log_text(run_id, "\n".join(notes) + "\n", "data_notes.txt")
        print(f"MLflow parent run {run_id}: {len(configs)} trials ({', '.join(methods)} x {len(opts.lrs)} learning "
              f"rates x {len(seeds)} splits x {len(tasks)} task(s))" + (f"; prompts {not_applicable}"
                                                                           if not_applicable else ""), flush=True)
        results = _tune(opts, configs, data, encoder, ParentRun(tracking_uri, experiment_id, run_id), storage)
        trials = pd.DataFrame([{**r.config["trial"], "dev": (r.metrics or {}).get("best.dev.score", math.nan),
                                "test": (r.metrics or {}).get("test.accuracy", math.nan) if r.error is None
                                else math.nan} for r in results])
        table = summarize(trials, [t.spec.name for t in tasks], opts.methods, len(seeds), not_applicable)
        _log(client, run_id, trials, table, opts.shots)
    print(f"\n{markdown(table, opts.shots, len(seeds))}\nMLflow parent run id: {run_id}\n"
          + tracking.ui_links(tracking_uri, experiment_id, run_id))
    return FewShotResult(run_id, trials, table)


def _tune(opts: FewShotOptions, configs: list[dict[str, Any]], data: dict[str, SplitData],
          encoder: PretrainedEncoder, parent: ParentRun, storage: str):
    settings = {"steps": opts.steps, "batch_size": opts.batch_size, "eval_every": opts.eval_every,
                "max_length": opts.max_length}
    return run_trials(partial(tune_trial, settings=settings), data=data, encoder=encoder,
                      configs=[{"trial": config} for config in configs], name_of=trial_name,
                      params_of=lambda config: {**config["trial"], "pretraining_run": encoder.pretraining_run},
                      cpus_per_trial=opts.cpus_per_trial, gpus_per_trial=opts.gpus_per_trial,
                      max_failures=opts.max_failures, parent=parent, storage=storage,
                      run_name=f"fewshot-{parent.run_id}")


def summarize(trials: pd.DataFrame, tasks: list[str], methods: tuple[str, ...], splits: int,
              not_applicable: str) -> pd.DataFrame:
    """Per task and method: the learning rate whose splits all finished with the best mean dev accuracy,
    and its test accuracy's mean and standard deviation (ddof 1) over the splits."""
    rows = []
    for task in tasks:
        for method in methods:
            if method == "prompt" and not_applicable:
                rows.append({"task": task, "method": method, "status": not_applicable})
                continue
            mine = trials[(trials["task"] == task) & (trials["method"] == method)]
            by_lr = mine.groupby("lr").agg(dev=("dev", "mean"), test_mean=("test", "mean"), test_std=("test", "std"),
                                          done=("test", "count"))
            complete = by_lr[by_lr["done"] == splits]
            if complete.empty:
                rows.append({"task": task, "method": method, "status": "no learning rate finished every split"})
                continue
            lr = complete["dev"].idxmax()
            rows.append({"task": task, "method": method, "lr": lr, "dev_mean": complete.loc[lr, "dev"],
                         "score_mean": complete.loc[lr, "test_mean"], "score_std": complete.loc[lr, "test_std"],
                         "splits": splits, "status": "ok"})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, shots: int, splits: int) -> str:
    """Table 4's form: test accuracy x100 as mean (std) over the splits, with the chosen learning rate."""
    lines = [f"Few-shot: {shots} training and {shots} dev examples per class, {splits} splits; test accuracy x100, "
             f"mean (std) over the splits at the learning rate with the best mean dev accuracy\n",
             "| task | method | test accuracy | lr | dev accuracy (mean) | status |", "|---|---|---|---|---|---|"]
    for _, row in table.iterrows():
        ok = row.get("status") == "ok"
        score = f"{100 * row['score_mean']:.2f} ({100 * row['score_std']:.2f})" if ok else "-"
        lines.append(f"| {row['task']} | {row['method']} | {score} | {f'{row.lr:g}' if ok else '-'} | "
                     f"{f'{100 * row.dev_mean:.2f}' if ok else '-'} | {row['status']} |")
    return "\n".join(lines) + "\n"


def _log(client, run_id: str, trials: pd.DataFrame, table: pd.DataFrame, shots: int) -> None:
    now = int(time.time() * 1000)
    metrics = [Metric(fewshot_metric(row["task"], row["method"], stat), float(row[f"score_{stat}"]), now, 0)
               for _, row in table.iterrows() if row.get("status") == "ok" for stat in ("mean", "std")]
    # Each split's test accuracy at the chosen learning rate: what the claims' tests over splits read.
    for _, row in table.iterrows():
        if row.get("status") == "ok":
            chosen = trials[(trials["task"] == row["task"]) & (trials["method"] == row["method"])
                            & (trials["lr"] == row["lr"])]
            metrics += [Metric(fewshot_metric(row["task"], row["method"], f"{SEED_STAT}{int(split)}"), float(test),
                               now, 0) for split, test in zip(chosen["split"], chosen["test"]) if pd.notna(test)]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    client.log_text(run_id, trials.to_csv(index=False), "fewshot_trials.csv")
    client.log_text(run_id, table.to_csv(index=False), "fewshot_table.csv")
    client.log_text(run_id, markdown(table, shots, trials["split"].nunique()), "fewshot_table.md")


def main(argv: list[str] | None = None) -> FewShotResult:
    return run(parse_options("python -m jobs.finetuning.fewshot", __doc__, FewShotOptions, argv))


if __name__ == "__main__":
    run_main(main)
