"""An ablation study: pretrain every variant, fine-tune each, all in one MLflow experiment.

    python -m jobs.studies.ablate --preset P --variants cocolm,rtd_only,clm_only,... [--pretraining-seeds 4] [--first-seed K]
        [--set key.sub=value ...] [--tasks snli|glue|squad_v2|rte,mrpc] [--data-dir DIR] [--grid quick] [--seeds 5] [--max-train N] [--max-dev N]
        [--label-fractions 0.01,0.1,0.2,1.0]
        [--represent-pairs 500] [--probe-pairs 10000] [--no-control] [--concurrent-runs K] [--tracking-uri URI] [--storage URI]
        [--experiment NAME] [--dry-run]

Its first lines are the plan (the pretraining runs and controls; with --tasks, each run's sweep and the
trials in all); `--dry-run` prints them once the configs, the corpus and the task names are checked, and runs
nothing.

The pretraining run is the unit of replication: `--pretraining-seeds N` pretrains every variant N times,
with seeds 0..N-1 for initialisation, corruption and data order together (`train.seed` and `data.seed`),
or K..K+N-1 with `--first-seed K` (a replication on seeds no earlier study used), each run tagged with
its seed (`pretraining_seed`) and, once read out, with the gate's verdict
(`cocolm.gate`: "trained", or which criterion failed; jobs/gate.py). Seeds are the outer loop:
an interrupted study has whole seeds done.

Every run is read out the same way: the [CLS] cosines of `jobs.studies.represent`, linear probes on the
frozen encoder (`jobs.studies.probe`, SNLI test accuracy), and with `--tasks` a fine-tuning sweep. After
each seed's variants, the random-init control of that seed (`jobs.studies.control`: the preset's main
encoder at initialisation, variant `random_init`) is read out alike, the floor every variant must beat.

Runs go one after the other unless `--concurrent-runs K` lets K of them (each a pretraining run and its
readouts, or a control's readouts) go at once, in the same order, on the one Ray the study starts: Ray
schedules their workers and trials on the CPUs (or GPUs) there are. A CPU preset's worker takes half a
CPU and torch then runs one thread (Ray sets OMP_NUM_THREADS to the floor of the CPUs a worker holds,
at least 1), so on 2 cores `--concurrent-runs 2` keeps both busy: two runs at one thread each did about
twice the steps of one (docs/design.md section 5.4). The readouts of one run at a time (they run torch
in this process, and Tune one sweep at a time); the tokenizers are resolved before any run starts, so
no two runs train one. With `--tasks`, each finished pretraining run
is swept (`jobs.finetuning.sweep.run`; default: no fine-tuning) right after it, and each is given the
representation analysis of `jobs.studies.represent` (paper Fig. 1; `--represent-pairs 0` skips it). Every
run goes into one experiment (default `ablation-<preset>`) and carries its `variant` tag, so the
MLflow UI's runs table and compare view line the variants up; `python -m analysis.report
--experiment ablation-<preset>` writes the Table 3 style table and the figures.

Re-running the same command skips what finished: a pretraining run with the same resolved config is
reported ALREADY_FINISHED by `jobs.pretraining.job`, and a sweep is skipped when the experiment holds a
finished sweep parent of that pretraining run with the same tasks, grid and seeds, and a run that
holds the representation metrics (or the probes' metrics) is not analysed again; the random-init control of a
seed is found again, never made twice. An unfinished pretraining run resumes
from its last checkpoint, and an unfinished sweep runs only its missing trials (`jobs.finetuning.sweep`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from mlflow.tracking import MlflowClient

from jobs import tracking

from jobs.pretraining import job as pretrain

from jobs.cli import AT_LEAST_ONE, NON_NEGATIVE, UserError, comma_list, option, parse_options, run_main
from jobs.env import set_hermetic_env
from jobs.finetuning.grid import load_grid
from jobs.finetuning.sweep import SweepOptions, plan_line
from jobs.finetuning.tasks import benchmark_task_names, load_tasks
from jobs.finetuning.sweep import run as run_sweep
from jobs.names import (COMPARABLE_METRICS, GATE_TAG, KIND_SWEEP, KIND_TAG, PRETRAINING_SEED_TAG, PRETRAINING_TAG,
                        RANDOM_INIT_VARIANT, REPRESENT_METRICS, STOP_TAG)
from jobs.data.tokenizer import resolve_tokenizer
from jobs.pretraining.config import PretrainConfig, resolve
from jobs.pretraining.loop import duration
from jobs.ray_session import init_ray
from jobs.run_tables import SEED_PARAMS
from jobs.studies import control, probe, represent
from jobs.gate import gate


def _variant_list(text: str) -> tuple[str, ...]:
    variants = comma_list(text)
    if not variants:
        raise argparse.ArgumentTypeError(f"{text!r} names no variant")
    return variants


def _like_sweep(name: str) -> Any:
    """A field declared as SweepOptions declares it (type, default, flag and help): one declaration."""
    declared = SweepOptions.__dataclass_fields__[name]
    return field(default=declared.default, metadata=declared.metadata)


@dataclass(frozen=True)
class AblationOptions:
    variants: tuple[str, ...] = field(metadata=option(
        "comma list of variant names, e.g. cocolm,rtd_only,clm_only", parse=_variant_list))
    preset: str = field(default="tiny", metadata=option("the preset every variant is pretrained with"))
    pretraining_seeds: int = field(default=1, metadata=option(
        "pretrain every variant this many times, seeds 0..N-1 (init, corruption, data order); claims need 4 a side",
        bounds=AT_LEAST_ONE))
    first_seed: int = field(default=0, metadata=option(
        "the first pretraining seed: seeds K..K+N-1, e.g. 4 to replicate a 4-seed study on new seeds", bounds=NON_NEGATIVE))
    overrides: tuple[str, ...] = field(default=(), metadata=option(
        "dotted config override for every variant, after its overlay, e.g. train.max_steps=40 (repeatable)",
        flag="--set", repeat=True, metavar="KEY=VALUE"))
    tasks: str | None = field(default=None, metadata=option(
        "fine-tune every variant on these tasks (snli | glue | squad_v2 | rte,mrpc); default: pretraining only"))
    data_dir: str | None = _like_sweep("data_dir")
    grid: str = _like_sweep("grid")
    seeds: tuple[int, ...] = _like_sweep("seeds")
    label_fractions: tuple[float, ...] = _like_sweep("label_fractions")
    max_train: int | None = _like_sweep("max_train")
    max_dev: int | None = _like_sweep("max_dev")
    probe_pairs: int = field(default=10_000, metadata=option(
        "SNLI train pairs for the linear probes of each run (jobs.studies.probe; a tenth as many, at most 1,000, "
        "choose C); 0 skips them", bounds=NON_NEGATIVE))
    concurrent_runs: int = field(default=1, metadata=option(
        "runs (pretraining and readouts) going at once on the study's Ray; 2 on a 2-core machine", bounds=AT_LEAST_ONE))
    control: bool = field(default=True, metadata=option(
        "read out a random-init control per pretraining seed (--no-control: none)"))
    represent_pairs: int = field(default=500, metadata=option(
        "random and similar pairs for the [CLS] cosine analysis of each run (jobs.studies.represent); 0 skips it", bounds=NON_NEGATIVE))
    tracking_uri: str | None = _like_sweep("tracking_uri")
    storage: str | None = field(default=None, metadata=option(
        "checkpoint storage (default: $COCOLM_HOME/ray_results)"))
    experiment: str | None = field(default=None, metadata=option("MLflow experiment (default: ablation-<preset>)"))
    dry_run: bool = field(default=False, metadata=option(
        "print the plan (pretraining runs, controls, trials) after checking the configs, corpus and task names; run nothing"))

    @property
    def experiment_name(self) -> str:
        return self.experiment or f"ablation-{self.preset}"


@dataclass(frozen=True)
class VariantResult:
    variant: str
    seed: int
    pretraining_run: str
    pretraining_status: str  # FINISHED | ALREADY_FINISHED | CONTROL (the random-init control, never trained)
    sweep_run: str = ""  # "" when no tasks
    sweep_status: str = ""  # FINISHED | ALREADY_FINISHED | ""
    represent_status: str = ""  # FINISHED | ALREADY_FINISHED | "" (skipped)
    gate: str = ""  # jobs.gate's verdict on the run
    probe_status: str = ""  # FINISHED | ALREADY_FINISHED | "" (skipped)

    @property
    def did_work(self) -> bool:
        """False for a unit that an earlier sitting finished: this one only found it."""
        return "FINISHED" in (self.pretraining_status, self.sweep_status, self.represent_status, self.probe_status)


@dataclass(frozen=True)
class AblationResult:
    experiment: str
    tracking_uri: str
    variants: list[VariantResult] = field(default_factory=list)


def seed_configs(opts: AblationOptions) -> dict[tuple[int, str], PretrainConfig]:
    """(seed, variant) -> resolved config, seeds outer. With one pretraining seed and no `--first-seed` the
    configs are the user's (their `--set train.seed=...` included); otherwise seed k of
    first_seed..first_seed+N-1 sets train.seed and data.seed to k."""
    pinned = [o for o in opts.overrides if o.split("=", 1)[0].strip() in SEED_PARAMS]
    if opts.pretraining_seeds == 1 and not opts.first_seed:
        configs = [resolve(opts.preset, v, list(opts.overrides)) for v in opts.variants]
        return {(cfg.train.seed, v): cfg for v, cfg in zip(opts.variants, configs)}
    if pinned:
        flag = (f"--pretraining-seeds {opts.pretraining_seeds}" if opts.pretraining_seeds > 1
                else f"--first-seed {opts.first_seed}")
        raise UserError(f"--set {pinned[0]} fixes the seed that {flag} varies; drop one of them")
    seeds = range(opts.first_seed, opts.first_seed + opts.pretraining_seeds)
    return {(seed, v): resolve(opts.preset, v, [*opts.overrides, *(f"{p}={seed}" for p in SEED_PARAMS)])
            for seed in seeds for v in opts.variants}


def run(opts: AblationOptions) -> AblationResult:
    """Check every variant resolves before any compute, then pretrain (and read out) each seed's variants in order."""
    set_hermetic_env()
    configs = seed_configs(opts)  # unknown names fail here
    for cfg in configs.values():
        pretrain.check_corpus(cfg)
    print("\n".join(plan_lines(opts, configs)), flush=True)
    if opts.dry_run:
        return AblationResult(opts.experiment_name, "", [])
    tracking_uri = opts.tracking_uri or tracking.default_tracking_uri()
    tracking.check_tracking(tracking_uri)
    client = MlflowClient(tracking_uri)
    experiment_id = tracking.experiment_id(client, opts.experiment_name, tracking_uri)  # the driver creates the store first
    readouts = Readouts(represent.draw_pairs(opts.represent_pairs) if opts.represent_pairs > 0 else None,
                        probe.probe_task(opts.probe_pairs, min(1000, max(1, opts.probe_pairs // 10)))
                        if opts.probe_pairs > 0 else None)  # the same pairs for every run
    if opts.concurrent_runs > 1:  # started and resolved once, before any thread could race to do it
        init_ray(num_cpus=study_cpus(opts.concurrent_runs), dashboard=True)
        check_cpus(opts.concurrent_runs, ray.cluster_resources().get("CPU", 0))  # a Ray joined or already up
        for cfg in configs.values():
            resolve_tokenizer(cfg.data)
    if note := untrained_positions_note(opts, configs):
        print(note, flush=True)
    units = _units(opts, configs)
    pace = Pace([variant for _, variant, _ in units], opts.concurrent_runs)
    results = _run_units(_Study(opts, client, tracking_uri, readouts, pace), units, opts.concurrent_runs)
    print(_summary(opts, tracking_uri, results))
    print(comparable_metrics(client, results))
    print(tracking.ui_links(tracking_uri, experiment_id, compare=[r.pretraining_run for r in results]))
    return AblationResult(opts.experiment_name, tracking_uri, results)


def plan_lines(opts: AblationOptions, configs: dict[tuple[int, str], PretrainConfig]) -> list[str]:
    """The study in a line or two, first: its pretraining runs and controls, and with --tasks every run's sweep."""
    seeds = sorted({seed for seed, _ in configs})
    controls = len(seeds) if opts.control else 0
    steps = sorted({cfg.train.max_steps for cfg in configs.values()})
    lines = [f"plan: {len(opts.variants)} variant(s) x {len(seeds)} pretraining seed(s) = {len(configs)} pretraining "
             f"runs of {'/'.join(map(str, steps))} steps (preset {opts.preset}), and {controls} random-init "
             f"control(s); each read out"]
    if opts.tasks:
        grid = load_grid(opts.grid)
        lr_set = grid.lr_set(None, opts.preset)
        # a benchmark's grid points need its task names only: its data is read once, by each sweep
        names = ([task.spec.name for task in load_tasks(opts.tasks)] if Path(opts.tasks).exists()
                 else benchmark_task_names(opts.tasks))
        points = [{**point, "label_fraction": fraction} for name in names
                  for fraction in opts.label_fractions for point in grid.points(name, lr_set)]
        per_run = plan_line(points, opts.seeds, grid.name, lr_set).removeprefix("plan: ")
        total = (len(configs) + controls) * len(points) * len(opts.seeds)
        lines.append(f"plan: each of the {len(configs) + controls} runs swept on {per_run}; {total} trials in all")
    return lines


def readout_lengths(opts: AblationOptions) -> dict[str, int]:
    """The most tokens each readout of this study reads per example."""
    lengths = {}
    if opts.represent_pairs > 0:
        lengths["[CLS] cosines"] = represent.MAX_LENGTH
    if opts.probe_pairs > 0:
        lengths["linear probes"] = probe.MAX_LENGTH
    if opts.tasks:
        grid = load_grid(opts.grid)
        lengths[f"fine-tuning (grid {grid.name})"] = max(space.max_length or grid.max_length
                                                         for space in grid.spaces.values())
    return lengths


def untrained_positions_note(opts: AblationOptions, configs: dict[tuple[int, str], PretrainConfig]) -> str:
    """One line where a readout reads positions that pretraining never trained, else "". Blocks shorter
    than the readouts (a cheaper CPU recipe) never train the absolute position embeddings from the block
    length on; every variant and the control share that, but a reader of the readouts must know it."""
    seq_len = min(max(cfg.data.seq_len, cfg.data.long_seq_len) for cfg in configs.values())
    past = {name: length for name, length in readout_lengths(opts).items() if length > seq_len}
    if not past:
        return ""
    return (f"note: pretraining trains positions 0-{seq_len - 1} (data.seq_len, data.long_seq_len), but "
            + ", ".join(f"{name} read up to {length} tokens" for name, length in past.items())
            + f": the absolute position embeddings from {seq_len} on are never trained (weight decay only shrinks them)")


def study_cpus(concurrent_runs: int) -> int:
    """Logical CPUs for a Ray this study starts with K runs at once: at least 2K. Ray Data's autoscaling
    coordinator (Ray 2.60) splits the CPUs the Train workers leave among the streams that run at once
    in whole CPUs (integer division): on 2 logical CPUs, two streams each got 0 and both runs hung at
    their first batch. Logical CPUs are Ray's bookkeeping, not threads: a CPU preset's worker still runs
    one torch thread, and each fine-tuning trial one."""
    return max(os.cpu_count() or 1, 2 * concurrent_runs)


def check_cpus(concurrent_runs: int, cpus: float) -> None:
    if cpus < 2 * concurrent_runs:
        raise UserError(f"--concurrent-runs {concurrent_runs} needs a Ray with at least {2 * concurrent_runs} logical "
                        f"CPUs, this one has {cpus:g}: Ray Data would give the runs' streams no CPU and they would "
                        f"hang (ablate.study_cpus); run fewer at once, or start the cluster with more CPUs")


def _run_units(study: _Study, units: list[tuple[int, str, PretrainConfig]], concurrent: int) -> list[VariantResult]:
    """Every unit's result, in order. One at a time in this thread (Ray Train's and Tune's Ctrl-C handling
    work only there); K at once in threads, where a failure or Ctrl-C starts no new unit and shuts Ray
    down, which stops the runs going (their checkpoints and finished readouts stay: the command resumes)."""
    tracking.STOPPING.clear()  # a study that starts is not stopping (one before it in this process may have)
    if concurrent == 1:
        return [study.unit(i, len(units), *unit) for i, unit in enumerate(units, 1)]
    pool = ThreadPoolExecutor(concurrent, thread_name_prefix="ablate")
    futures = [pool.submit(study.unit, i, len(units), *unit) for i, unit in enumerate(units, 1)]
    try:
        return [future.result() for future in futures]
    except BaseException:
        tracking.STOPPING.set()  # the runs Ray's shutdown breaks under the other threads end KILLED, not FAILED
        pool.shutdown(wait=False, cancel_futures=True)
        ray.shutdown()
        raise
    finally:
        pool.shutdown(wait=False)


def _units(opts: AblationOptions, configs: dict[tuple[int, str], PretrainConfig]) -> list[tuple[int, str, PretrainConfig]]:
    """(seed, variant, config) in order: each seed's variants, then its random-init control."""
    units = []
    for i, ((seed, variant), cfg) in enumerate(configs.items(), 1):
        units.append((seed, variant, cfg))
        last_of_seed = i == len(configs) or list(configs)[i][0] != seed
        if opts.control and last_of_seed:
            units.append((seed, RANDOM_INIT_VARIANT, cfg))
    return units


@dataclass
class _Study:
    """What every unit of a study shares; `unit` may run in several threads at once."""

    opts: AblationOptions
    client: Any
    tracking_uri: str
    readouts: Readouts
    pace: Pace
    readout_lock: threading.Lock = field(default_factory=threading.Lock)

    def unit(self, i: int, count: int, seed: int, variant: str, cfg: PretrainConfig) -> VariantResult:
        self.pace.start(i)
        result, made = self._unit(i, count, seed, variant, cfg)
        label = f"{variant}, seed {seed}" if variant != RANDOM_INIT_VARIANT else f"random-init control, seed {seed}"
        print(f"\n=== ablation {self.opts.experiment_name}: {self.pace.finish(i, label, made or result.did_work)} ===",
              flush=True)
        return result

    def _unit(self, i: int, count: int, seed: int, variant: str, cfg: PretrainConfig) -> tuple[VariantResult, bool]:
        """The unit's result, and whether a control was made now (its status says CONTROL either way)."""
        opts, client, made = self.opts, self.client, False
        if variant == RANDOM_INIT_VARIANT:
            print(f"\n=== ablation {opts.experiment_name}: {i}/{count}: random-init control, seed {seed} ===",
                  flush=True)
            (run_id, made), status = control.random_init_run(client, opts.experiment_name, cfg, seed), "CONTROL"
        else:
            print(f"\n=== ablation {opts.experiment_name}: {i}/{count}: {variant}, pretraining seed {seed} ===",
                  flush=True)
            done = pretrain.run(cfg, self.tracking_uri, opts.storage, experiment=opts.experiment_name)
            client.set_tag(done.run_id, PRETRAINING_SEED_TAG, str(seed))
            run_id, status = done.run_id, done.status
        with self.readout_lock:
            return _read_out(opts, client, self.tracking_uri, self.readouts, variant, seed, run_id, status), made


@dataclass(frozen=True)
class Readouts:
    pairs: Any  # jobs.studies.represent's sentence pairs, or None (skipped)
    probe_task: Any  # jobs.studies.probe's SNLI pairs, or None (skipped)


def _read_out(opts: AblationOptions, client, tracking_uri: str, readouts: Readouts, variant: str, seed: int,
              run_id: str, status: str) -> VariantResult:
    """Every readout of one run, each skipped where it is already logged: [CLS] cosines, the gate (which
    reads them), the probes, the sweep."""
    represent_status = _represent(client, run_id, readouts.pairs)
    verdict = _gate(client, run_id)
    probe_status = "" if readouts.probe_task is None else \
        probe.analyse_run(client, run_id, readouts.probe_task).status
    sweep_run, sweep_status = ("", "") if not opts.tasks else _sweep(opts, client, tracking_uri, run_id, variant, seed)
    return VariantResult(variant, seed, run_id, status, sweep_run, sweep_status, represent_status, verdict, probe_status)


@dataclass
class Pace:
    """This sitting's pace, for the line after each unit: how long its units took, by variant, and which
    are still going. A study of 4 seeds runs for hours; this says about how many are left."""

    variants: list[str]  # each unit's variant, in the study's order (unit i is variants[i - 1])
    concurrent: int
    minutes: dict[str, list[float]] = field(default_factory=dict)  # variant -> minutes of its units that did work
    started: dict[int, float] = field(default_factory=dict)  # unit -> time.monotonic() at its start
    finished: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, i: int) -> None:
        with self.lock:
            self.started[i] = time.monotonic()

    def finish(self, i: int, label: str, did_work: bool) -> str:
        """Record unit i as finished; say how long it took and about how long the study has left."""
        with self.lock:
            now, variant = time.monotonic(), self.variants[i - 1]
            took = (now - self.started.pop(i)) / 60
            self.finished.add(i)
            if did_work:  # a unit an earlier sitting did takes seconds here: it says nothing of the pace
                self.minutes.setdefault(variant, []).append(took)
            going = [(self.variants[j - 1], (now - t) / 60) for j, t in self.started.items()]
            waiting = [v for j, v in enumerate(self.variants, 1) if j not in self.finished and j not in self.started]
            left = minutes_left(self.minutes, going, waiting, self.concurrent)
            line = f"{len(self.finished)}/{len(self.variants)} done; {label} " + (
                f"took {duration(took * 60)}" if did_work else "was done before")
        if not (waiting or going):
            return line + "; the study is done"
        return line if left is None else line + f"; about {duration(left * 60)} left at this sitting's pace"


def minutes_left(took: dict[str, list[float]], going: list[tuple[str, float]], waiting: list[str],
                 concurrent: int) -> float | None:
    """The study's minutes left at this sitting's pace, or None before any unit did work. A unit not
    finished is expected to take the mean minutes of its variant's units (of every unit, for a variant
    none of whose units did work yet), less what it has run if going; the sum is shared by the
    `concurrent` slots (which assumes they stay busy: the last units of a study may leave one idle)."""
    every = [m for ms in took.values() for m in ms]
    if not every:
        return None

    def expected(variant: str) -> float:
        return statistics.fmean(took.get(variant) or every)
    work = sum(expected(v) for v in waiting) + sum(max(expected(v) - ran, 0.0) for v, ran in going)
    return work / concurrent


def _gate(client, run_id: str) -> str:
    """The gate's verdict on a finished pretraining run, tagged on it and printed."""
    run = client.get_run(run_id)
    result = gate(run.data.tags.get("variant", ""), run.info.status, run.data.tags.get(STOP_TAG, ""),
                  run.data.metrics, run.data.params)
    client.set_tag(run_id, GATE_TAG, result.verdict[:5000])
    print(f"gate: {result.verdict} (checked: {', '.join(result.checked) or 'nothing'})", flush=True)
    return result.verdict


def finished_sweep(client, experiment: str, pretraining_run: str, tasks: str, grid: str, seeds: tuple[int, ...],
                   label_fractions: tuple[float, ...] = (1.0,)) -> str:
    """The id of a finished sweep parent of `pretraining_run` with these tasks, grid, seeds and label
    fractions, or ""."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return ""
    runs = client.search_runs(
        [found.experiment_id], max_results=1000,
        filter_string=(f"tags.`{PRETRAINING_TAG}` = '{pretraining_run}' and tags.{KIND_TAG} = '{KIND_SWEEP}' "
                       f"and attributes.status = 'FINISHED' and params.tasks = '{tasks}' and params.grid = '{grid}' "
                       f"and params.seeds = '{','.join(map(str, seeds))}' "
                       f"and params.label_fractions = '{','.join(f'{f:g}' for f in label_fractions)}'"))
    return runs[0].info.run_id if runs else ""


def _represent(client, pretraining_run: str, pairs) -> str:
    """jobs.studies.represent's analysis of a pretraining run, unless skipped (no pairs) or already logged there."""
    if pairs is None:
        return ""
    if REPRESENT_METRICS[-1] in client.get_run(pretraining_run).data.metrics:
        print(f"representation analysis of {pretraining_run} already logged", flush=True)
        return "ALREADY_FINISHED"
    represent.analyse_run(client, pretraining_run, pairs, represent.MAX_LENGTH)
    return "FINISHED"


def _sweep(opts: AblationOptions, client, tracking_uri: str, pretraining_run: str, variant: str,
           seed: int) -> tuple[str, str]:
    grid = load_grid(opts.grid).name  # the sweep logs the grid by name (a file's stem)
    existing = finished_sweep(client, opts.experiment_name, pretraining_run, opts.tasks, grid, opts.seeds,
                              opts.label_fractions)
    if existing:
        print(f"sweep of {variant} on {opts.tasks} (grid {grid}) already finished: MLflow run {existing}", flush=True)
        return existing, "ALREADY_FINISHED"
    result = run_sweep(SweepOptions(
        source=pretraining_run, tasks=opts.tasks, data_dir=opts.data_dir, grid=opts.grid, seeds=opts.seeds,
        label_fractions=opts.label_fractions, tracking_uri=tracking_uri,
        max_train=opts.max_train, max_dev=opts.max_dev, experiment=opts.experiment_name,
        name=f"sweep-{variant}-s{seed}-{grid}-{opts.tasks}"[:200]))  # its parent takes preset/variant from the pretraining run
    return result.run_id, "FINISHED"


def _summary(opts: AblationOptions, tracking_uri: str, results: list[VariantResult]) -> str:
    lines = [f"\nablation study {opts.experiment_name!r} ({len(results)} pretraining runs):"]
    for r in results:
        sweep = f"; sweep {r.sweep_run} {r.sweep_status}" if r.sweep_run else ""
        sweep += f"; representation {r.represent_status}" if r.represent_status else ""
        lines.append(f"  {r.variant:<16} seed {r.seed} pretraining {r.pretraining_run} {r.pretraining_status}{sweep}; "
                     f"gate: {r.gate}")
    lines += [f"tables and figures: python -m analysis.report --experiment {opts.experiment_name} "
              f"--tracking-uri {tracking_uri} --out report-{opts.experiment_name}"]
    return "\n".join(lines)


def comparable_metrics(client, results: list[VariantResult]) -> str:
    """Each variant's last pretraining metrics that mean the same in every variant, then its `loss`,
    which does not (each variant sums different terms): the numbers to compare first."""

    lines = ["pretraining metrics comparable across variants (last values; `loss` is each variant's own sum):"]
    for r in results:
        metrics = client.get_run(r.pretraining_run).data.metrics
        shown = "  ".join(f"{k} {metrics[k]:.3f}" for k in COMPARABLE_METRICS if k in metrics)
        own = f"  | loss {metrics['loss']:.3f}" if "loss" in metrics else ""
        lines.append(f"  {r.variant:<16} s{r.seed} {shown}{own}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> AblationResult:
    return run(parse_options("python -m jobs.studies.ablate", __doc__, AblationOptions, argv))


if __name__ == "__main__":
    run_main(main)
