"""Fine-tuning sweeps on Ray Tune: a grid x seeds, medians and best points tracked in MLflow.

    python -m jobs.finetuning --from RUN_ID_OR_DIR --tasks glue|snli|squad_v2|glue,squad_v2|rte,mrpc|FILE_OR_FOLDER
        [--grid paper|quick|GRID.yaml] [--seeds 5] [--tracking-uri URI] [--data-dir DIR]
        [--max-train N] [--max-dev N] [--max-length N] [--kind classification|regression]
        [--lr-set base|large++] [--cpus-per-trial C] [--gpus-per-trial G] [--max-failures N]
        [--label-fractions 0.01,0.1,0.2,1.0] [--experiment NAME] [--storage DIR] [--name NAME] [--dry-run]

Its first line is the plan: per task the grid points, the seeds and the trials; `--dry-run` prints it
(and the data notes) once the encoder, the data and the grid are checked, and runs nothing.

`--from` is a pretraining MLflow run id (its exported "encoder" artifact), an exported encoder
directory, or a pretraining checkpoint directory. Every (grid point, seed) is one Tune trial
(`jobs/finetuning/trial.py`, run by `jobs/finetuning/tune.py`); trials get 1 CPU each on a CPU cluster
and 0.25 GPU (+1 CPU) each where there are GPUs, as many at once as the cluster holds. A failed trial
is retried `--max-failures` times; a grid point still missing a seed after that is reported as
incomplete and is never medianed over fewer seeds (`jobs/finetuning/medians.py`).

MLflow: the driver creates the store, the experiment and the sweep's parent run before any trial
starts (several processes creating one sqlite store race), and logs every trial itself as a child
run (`mlflow.parentRunId`) from Tune callbacks (`tune.MlflowTrials`), so trials on other nodes need
no access to the store. The parent gets the statistics of every grid point, the best point per task (MNLI-m and
MNLI-mm chosen separately), and the task table with the GLUE average, as metrics and as CSV and
markdown artifacts; the task table is also printed, with the grid's published results and the gaps to them
where it has some (`--grid cocolm-base++`: the authors' settings and dev results for their checkpoint).
Every run is ended explicitly.

Resuming: the same command run again after a stop (Ctrl-C, a killed process, a lost driver) continues the
unfinished parent (RUNNING, FAILED or KILLED) of the same pretraining run with the same tasks, grid, seeds,
label fractions, sizes and lr set, says "resuming sweep parent X (STATUS): k of n trials already finished",
runs only the trials without a FINISHED child run, and tables all of them (the earlier ones read back from
their child runs); children a killed command left RUNNING are marked KILLED. A lock in --storage named by those
params (`tracking.holding_run`, as for pretraining runs) keeps a second command off a sweep that is live.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from ray.tune import Result

from jobs import tracking
from jobs.cli import NON_NEGATIVE, UserError, option, parse_options
from jobs.env import set_hermetic_env
from jobs.pretraining.encoders import resolve_encoder
from jobs.pretraining.pretrained import PretrainedEncoder
from jobs.finetuning.cost import gpu_hours_line
from jobs.finetuning.encoding import EncodedTask, encode_task
from jobs.finetuning.grid import MAX_LENGTH, Grid, available_grids, data_key, load_grid, trial_name
from jobs.finetuning.tables import SweepTables, log_tables, tabulate
from jobs.finetuning.tasks import load_tasks
from jobs.finetuning.tasks.subsets import label_subset, subsample
from jobs.finetuning.tasks.task import Task
from jobs.finetuning.trial import tune_trial
from jobs.finetuning.tune import CPUS_PER_TRIAL, GPUS_PER_TRIAL, MAX_FAILURES, ParentRun, run_trials
from jobs.names import (CHECKPOINT_TAG, FINETUNING_EXPERIMENT, KIND_SWEEP, KIND_TAG, PRETRAINING_TAG, STUDY_TAGS,
                        TRIAL_TAG, fraction_target, split_fraction)
from jobs.run_tables import search

# ----------------------------------------------------------------------------- options and result


def check_seeds(seeds: tuple[int, ...]) -> None:
    """At least one seed, each a distinct non-negative integer: checked before Ray or MLflow start."""
    if not seeds:
        raise UserError("no seeds: give a count (--seeds 5) or a comma list (--seeds 0,1,2)")
    if any(not isinstance(s, int) or s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise UserError(f"seeds must be distinct non-negative integers, got {list(seeds)}")


def parse_fractions(text: str) -> tuple[float, ...]:
    """'0.01,0.1,1.0' -> those fractions of the training labels, each in (0, 1], distinct. An argparse type."""
    try:
        fractions = tuple(float(f) for f in text.split(",") if f.strip())
    except ValueError:
        fractions = ()
    if not fractions or any(not 0 < f <= 1 for f in fractions) or len(set(fractions)) != len(fractions):
        raise argparse.ArgumentTypeError(f"expected distinct fractions in (0, 1] such as 0.01,0.1,1.0, got {text!r}")
    return fractions


def parse_seeds(text: str) -> tuple[int, ...]:
    """'5' -> seeds 0..4; '1,2,3' -> those seeds. An argparse type: a bad value is a usage error
    that names the flag, before anything starts."""
    usage = f"expected a seed count (5) or a comma list of seeds (0,1,2), got {text!r}"
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip()) if "," in text else tuple(range(int(text)))
        check_seeds(seeds)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{usage}: {error}" if "seeds" in str(error) else usage) from None
    return seeds


@dataclass(frozen=True)
class SweepOptions:
    source: str = field(metadata=option(
        "pretraining MLflow run id, `last` (the newest finished pretraining run), exported encoder directory, "
        "or pretraining checkpoint directory", flag="--from"))
    tasks: str = field(default="snli", metadata=option(
        "glue | snli | squad_v2 | comma list (rte,mrpc or glue,squad_v2) | a task file or folder"))
    grid: str = field(default="quick", metadata=option(f"one of {available_grids()} or a grid YAML file"))
    seeds: tuple[int, ...] = field(default=(0, 1, 2, 3, 4), metadata=option(
        "how many seeds (5 = seeds 0..4), or a comma list", parse=parse_seeds))
    tracking_uri: str | None = field(default=None, metadata=option(
        "MLflow tracking URI (default: sqlite store under $COCOLM_HOME)"))
    data_dir: str | None = field(default=None, metadata=option(
        "folder with the downloaded task data: GLUE task folders (MNLI/train.tsv, ...) and SQuAD 2.0's "
        "train-v2.0.json and dev-v2.0.json (default: GLUE from the Hugging Face hub; SQuAD needs it)"))
    max_train: int | None = field(default=None, metadata=option(
        "train examples per task, fixed-seed subset (0 = all; default: the grid's)", bounds=NON_NEGATIVE))
    max_dev: int | None = field(default=None, metadata=option("dev examples per dev set (0 = all; default: the grid's)", bounds=NON_NEGATIVE))
    max_length: int | None = field(default=None, metadata=option("tokens per example (default: the grid's)", bounds=MAX_LENGTH))
    label_fractions: tuple[float, ...] = field(default=(1.0,), metadata=option(
        "train on these fractions of the training labels, each a seeded class-balanced nested subset, every "
        "fraction its own target (SNLI:0.1) with its own best grid point (paper Fig. 7c/d), e.g. 0.01,0.1,0.2,1.0",
        parse=parse_fractions))
    kind: str | None = field(default=None, metadata=option(
        "a user task's kind (default: inferred from the labels)", choices=("classification", "regression")))
    lr_set: str | None = field(default=None, metadata=option(
        "learning-rate list of the grid to use, e.g. large++ (default: the pretraining preset's)"))
    cpus_per_trial: float = field(default=1.0, metadata=CPUS_PER_TRIAL)
    gpus_per_trial: float | None = field(default=None, metadata=GPUS_PER_TRIAL)
    max_failures: int = field(default=2, metadata=MAX_FAILURES)
    experiment: str = field(default=FINETUNING_EXPERIMENT, metadata=option("MLflow experiment"))
    storage: str | None = field(default=None, metadata=option(
        "Tune storage: local dir or URI (default: $COCOLM_HOME/ray_results)"))
    name: str | None = field(default=None, metadata=option("the sweep's MLflow parent run name"))
    dry_run: bool = field(default=False, metadata=option(
        "print the plan (tasks, grid points, seeds, trials) after checking the encoder, data and grid; run nothing"))

    def __post_init__(self) -> None:
        check_seeds(self.seeds)


@dataclass(frozen=True)
class SweepResult:
    run_id: str  # the parent MLflow run
    tables: SweepTables | None  # every trial, every grid point, the best points, the task table; None: a dry run
    trials_run: int = 0  # the trials this command ran (fewer than the tables hold when it resumed a parent)


# ----------------------------------------------------------------------------- the sweep


def run(opts: SweepOptions) -> SweepResult:
    """Read and encode the tasks, start the parent run (or resume an unfinished one), run the trials it
    lacks on Tune, table the medians over all its trials."""
    set_hermetic_env()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per encoder file otherwise
    grid = load_grid(opts.grid)
    tracking_uri = opts.tracking_uri or tracking.default_tracking_uri()
    tracking.check_tracking(tracking_uri)  # before any compute is spent
    storage = opts.storage or tracking.default_storage()
    tracking.check_storage(storage)
    client = MlflowClient(tracking_uri)
    with tempfile.TemporaryDirectory(prefix="cocolm-sweep-") as workdir:  # the downloaded encoder: read, then gone
        plan = _plan(opts, grid, client, tracking_uri, Path(workdir))
    print(plan_line(plan.points, opts.seeds, grid.name, plan.params["lr_set"]), flush=True)
    print(plan.notes, flush=True)
    if opts.dry_run:
        return SweepResult("", None, trials_run=0)
    experiment_id = tracking.experiment_id(client, opts.experiment, tracking_uri)  # the driver creates store + experiment
    configs = [{"point": p, "seed": s} for p in plan.points for s in opts.seeds]
    # One command per sweep, with the lock pretraining runs use: named by what the sweep is and taken before
    # its parent is looked up, so a second command never resumes a parent that a live one is running.
    with tracking.holding_run(storage, _lock_name(tracking_uri, experiment_id, plan.params)):
        found = _unfinished_parent(client, experiment_id, plan.params)
        run_id = found.info.run_id if found else _new_parent(client, experiment_id, opts, grid, plan)
        with tracking.ending_run(client, run_id):
            if found:
                earlier = _earlier_trials(client, experiment_id, run_id, configs)
                client.update_run(run_id, status="RUNNING")
                print(f"resuming sweep parent {run_id} ({found.info.status}): {len(earlier)} of {len(configs)} "
                      f"trials already finished", flush=True)
            else:
                earlier = []
                tracking.log_params(client, run_id, plan.params)
                client.log_text(run_id, plan.notes + "\n", "data_notes.txt")
            print(f"MLflow parent run {run_id} in experiment {opts.experiment!r} at {tracking_uri}: "
                  f"{len(plan.points)} grid point(s) x {len(opts.seeds)} seed(s) = {len(configs)} trials", flush=True)
            done = {trial_name(r.config) for r in earlier}
            missing = [c for c in configs if trial_name(c) not in done]
            results = _tune(opts, plan, missing, ParentRun(tracking_uri, experiment_id, run_id)) if missing else []
            by_name = {trial_name(r.config): r for r in [*earlier, *results]}
            out = tabulate([by_name[trial_name(c)] for c in configs], plan.encoded, opts.seeds, grid.published)
            log_tables(client, run_id, out)
    print(f"\n{out.markdown}\nMLflow parent run id: {run_id}\n"
          + tracking.ui_links(tracking_uri, experiment_id, run_id))
    return SweepResult(run_id, out, trials_run=len(missing))


def _new_parent(client: MlflowClient, experiment_id: str, opts: SweepOptions, grid: Grid, plan: _Plan) -> str:
    tasks = "-".join(dict.fromkeys(p["task"] for p in plan.points))
    return client.create_run(experiment_id, run_name=opts.name or f"sweep-{grid.name}-{tasks}"[:200],
                             tags={KIND_TAG: KIND_SWEEP, PRETRAINING_TAG: plan.pretraining_run,
                                   "git_commit": tracking.git_commit(),
                                   **_from_pretraining_run(client, plan.pretraining_run, opts.source)}).info.run_id


# ----------------------------------------------------------------------------- resuming a sweep

# The parent's params that say which trials a sweep holds and how they train: an unfinished parent is
# resumed only when all of them agree (and `from`, where no pretraining run names the encoder).
SAME_SWEEP = ("pretraining_run", "tasks", "grid", "seeds", "label_fractions", "max_train", "max_dev", "max_length",
              "lr_set")


def _identity(params: dict[str, Any]) -> dict[str, str]:
    keys = SAME_SWEEP if params["pretraining_run"] else (*SAME_SWEEP, "from")
    return {key: str(params[key]) for key in keys}


def _lock_name(tracking_uri: str, experiment_id: str, params: dict[str, Any]) -> str:
    """The sweep's lock (a folder under --storage that holds only it, beside the parents' Tune runs)."""
    key = json.dumps([tracking_uri, experiment_id, _identity(params)], sort_keys=True)
    return f"sweep-lock-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _unfinished_parent(client: MlflowClient, experiment_id: str, params: dict[str, Any]) -> Run | None:
    """The newest sweep parent in the experiment with these identifying params that did not finish: FAILED
    or KILLED, or RUNNING, which a killed command leaves (none is live: its lock is this command's)."""
    runs = search(client, [experiment_id], f"tags.{KIND_TAG} = '{KIND_SWEEP}' and attributes.status != 'FINISHED'")
    wanted = _identity(params)
    same = [r for r in runs if r.info.status in ("RUNNING", "FAILED", "KILLED")
            and all(r.data.params.get(k) == v for k, v in wanted.items())]
    return max(same, key=lambda r: r.info.start_time, default=None)


def _earlier_trials(client: MlflowClient, experiment_id: str, run_id: str,
                    configs: list[dict[str, Any]]) -> list[Result]:
    """The trials that earlier attempts of the parent finished, as the Tune results `tabulate` reads (config,
    the metrics the driver logged on the child, done); children a killed command left RUNNING are marked
    KILLED, and their trials run again.

    A child is matched by its trial name (the `cocolm.trial` tag): `trial_name` also names the Tune trials,
    so one function says what a trial is, where matching the child's params would compare floats as the
    strings MLflow keeps (an lr of 3e-05 logged by one version, 3.0e-05 by another)."""
    planned = {trial_name(c): c for c in configs}
    earlier = {}
    for child in search(client, [experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}'"):
        name = child.data.tags.get(TRIAL_TAG, "")
        if child.info.status == "RUNNING":
            client.set_terminated(child.info.run_id, status="KILLED")
        elif child.info.status == "FINISHED" and name in planned:
            earlier[name] = Result(metrics={**child.data.metrics, "done": 1, "config": planned[name]},
                                   checkpoint=None, error=None, path=child.info.artifact_uri)
    return list(earlier.values())


@dataclass(frozen=True)
class _Plan:
    encoder: PretrainedEncoder
    pretraining_run: str
    encoded: dict[str, EncodedTask]  # data key (task name, or snli:0.1 on a fraction of the labels) -> its splits
    points: list[dict[str, Any]]
    params: dict[str, Any]  # the parent run's params
    notes: str  # data sizes, holdouts, subsets, truncation, skipped rows


def _plan(opts: SweepOptions, grid: Grid, client: MlflowClient, tracking_uri: str, workdir: Path) -> _Plan:
    """Everything decided before Ray starts: the encoder, the encoded tasks, the grid points."""
    encoder = resolve_encoder(opts.source, tracking_uri, workdir)
    pretraining_run = encoder.pretraining_run or _run_of_checkpoint(client, opts.source)
    max_train, max_dev = _pick(opts.max_train, grid.max_train), _pick(opts.max_dev, grid.max_dev)
    tasks = [subsample(t, max_train, max_dev) for t in load_tasks(opts.tasks, opts.data_dir, opts.kind)]
    max_length = {t.spec.name: opts.max_length or grid.max_length_of(t.spec.name) for t in tasks}
    too_long = {task: n for task, n in max_length.items() if n > encoder.cfg.max_positions}
    if too_long:
        raise UserError(f"max length {too_long} exceeds the encoder's {encoder.cfg.max_positions} positions")
    lr_set = grid.lr_set(opts.lr_set, encoder.preset)
    points = [{**p, "label_fraction": f} for t in tasks for f in opts.label_fractions
              for p in grid.points(t.spec.name, lr_set)]
    trained = {fraction_target(t.spec.name, f): label_subset(t, f) for t in tasks for f in opts.label_fractions}
    encoded = {key: encode_task(t, encoder.tokenizer_dir, max_length[t.spec.name], grid.space(t.spec.name).doc_stride,
                                grid.space(t.spec.name).max_question_length)
               for key, t in trained.items()}
    params = {"pretraining_run": pretraining_run, "from": opts.source, "tasks": opts.tasks, "grid": grid.name,
              "seeds": ",".join(map(str, opts.seeds)), "max_length": ",".join(map(str, max_length.values())),
              "lr_set": lr_set, "label_fractions": ",".join(f"{f:g}" for f in opts.label_fractions),
              "max_train": max_train, "max_dev": max_dev, "max_failures": opts.max_failures,
              "grid_points": len(points), "trials": len(points) * len(opts.seeds)}
    estimate = gpu_hours_line(encoder.cfg, encoded, points, len(opts.seeds))
    return _Plan(encoder, pretraining_run, encoded, points, params, f"{_describe(trained, encoded)}\n{estimate}")


def plan_line(points: list[dict[str, Any]], seeds: tuple[int, ...], grid: str, lr_set: str) -> str:
    """The sweep in one line, its first: per target (task, or task:fraction) the grid points, then seeds and trials."""
    per_target: dict[str, int] = {}
    for point in points:
        target = fraction_target(point["task"], point["label_fraction"])
        per_target[target] = per_target.get(target, 0) + 1
    targets = ", ".join(f"{target} ({n} grid point{'s' * (n != 1)})" for target, n in per_target.items())
    return (f"plan: {targets} x {len(seeds)} seed{'s' * (len(seeds) != 1)} = {len(points) * len(seeds)} trials "
            f"(grid {grid}, learning rates {lr_set})")


def _pick(override: int | None, default: int) -> int:
    return default if override is None else override


def _describe(tasks: dict[str, Task], encoded: dict[str, EncodedTask]) -> str:
    lines = []
    for key, task in tasks.items():
        e = encoded[key]
        sizes = ", ".join(f"{k} {_size(v)}" for k, v in [("train", e.train), *e.dev.items(), ("test", e.test)]
                          if v is not None)
        cut = ", ".join(f"{k} {v}" for k, v in e.truncated.items() if v)
        what = "questions cut to their first tokens" if task.spec.kind == "span" else \
            f"examples truncated to {e.max_length} tokens"
        lines.append(f"{fraction_target(task.spec.display, split_fraction(key)[1])} ({task.spec.kind}, "
                     f"score: {task.spec.score}): {sizes}"
                     + (f"; {what}: {cut}" if cut else ""))
        lines += list(task.notes)
        if task.skipped:
            lines.append(task.skip_report())
    return "\n".join(lines)


def _size(split) -> str:
    """Examples, or for a span task questions and the windows they make."""
    return f"{len(split.spans.ids)} questions in {len(split)} windows" if split.spans is not None else str(len(split))


def _run_of_checkpoint(client: MlflowClient, source: str) -> str:
    """The pretraining run whose final checkpoint is `source` (its `cocolm.checkpoint` tag), if this store has it."""
    if not Path(source).is_dir():
        return ""
    experiments = [e.experiment_id for e in client.search_experiments()]
    wanted = str(Path(source).resolve()).replace("'", "\\'")
    runs = client.search_runs(experiments, filter_string=f"tags.`{CHECKPOINT_TAG}` = '{wanted}'", max_results=1) \
        if experiments else []
    return runs[0].info.run_id if runs else ""


def _from_pretraining_run(client: MlflowClient, pretraining_run: str, source: str) -> dict[str, str]:
    """Parent-run tags from the pretraining run: a note linking to it, and its study tags (preset, variant)
    so that sweeps line up with their pretraining runs in the UI's compare view."""
    note = "mlflow.note.content"
    if not pretraining_run:
        return {note: f"Fine-tuning sweep of `{source}` (no pretraining run in this store)."}
    try:
        run = client.get_run(pretraining_run)
    except Exception:  # the run lives in another store: name it, link nothing
        return {note: f"Fine-tuning sweep of pretraining run {pretraining_run}."}
    link = f"[{pretraining_run}](#/experiments/{run.info.experiment_id}/runs/{pretraining_run})"
    study = {k: run.data.tags[k] for k in STUDY_TAGS if k in run.data.tags}
    return {note: f"Fine-tuning sweep of pretraining run {link}.", **study}


def _tune(opts: SweepOptions, plan: _Plan, configs: list[dict[str, Any]], parent: ParentRun) -> list[Result]:
    def params_of(config: dict[str, Any]) -> dict[str, Any]:
        point = config["point"]
        return {"pretraining_run": plan.pretraining_run, "max_length": plan.encoded[data_key(point)].max_length,
                **point, "seed": config["seed"]}

    return list(run_trials(tune_trial, data=plan.encoded, encoder=plan.encoder, configs=configs,
                           name_of=trial_name, params_of=params_of,
                           cpus_per_trial=opts.cpus_per_trial, gpus_per_trial=opts.gpus_per_trial,
                           max_failures=opts.max_failures, parent=parent,
                           storage=opts.storage or tracking.default_storage(), run_name=f"sweep-{parent.run_id}"))


# ----------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> SweepResult:
    return run(parse_options("python -m jobs.finetuning", __doc__, SweepOptions, argv))
