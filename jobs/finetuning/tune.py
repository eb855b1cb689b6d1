"""Ray Tune for both fine-tuning jobs, the sweep (sweep.py: grid points x seeds) and few-shot (fewshot.py:
methods x learning rates x splits): how their trials are placed, run, retried and tracked.

    run_trials(trial, data=..., encoder=..., configs=[{"point": ..., "seed": ...}, ...], ...) -> ResultGrid

- **Resources** (`trial_resources`): `--cpus-per-trial` CPUs each, and `--gpus-per-trial` GPUs (by
  default `GPU_SHARE` where the cluster has GPUs, so four small fine-tunings share one). Ray hides
  every GPU a trial did not ask for (CUDA_VISIBLE_DEVICES), so a trial that asks for none runs on CPU.
- **The trial** runs in a Tune actor (`actor.py`): it fetches only its own data from the object store, uses
  as many threads as it has CPUs, and passes the fault hook first (`jobs.faults`: tests make a named trial
  fail its first attempts). A failed trial is retried `max_failures` times.
- **MLflow** (`MlflowTrials`): the driver logs every trial attempt as a child run of the job's parent
  run from Tune callbacks, so trials on other nodes need no access to the store.
- **Ctrl-C**: Tune's own handler ends the run gracefully and returns; `run_trials` passes the interrupt
  on as KeyboardInterrupt (trials still open are logged KILLED), so a job never tables a half-run grid
  as finished. Every trial reports `done` last: a result without it and without an error never ended.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import ray
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from jobs import faults, tracking
from jobs.cli import NON_NEGATIVE, POSITIVE, option
from jobs.pretraining.pretrained import PretrainedEncoder
from jobs.finetuning.actor import Trial, in_actor
from jobs.names import ATTEMPT_TAG, ERROR_TAG, KIND_TAG, KIND_TRIAL, TRIAL_TAG
from jobs.ray_session import init_ray

GPU_SHARE = 0.25  # GPUs per trial by default where the cluster has them

# The options both jobs take, with one meaning.
CPUS_PER_TRIAL = option("logical CPUs per trial", bounds=POSITIVE)
GPUS_PER_TRIAL = option(f"GPUs per trial (default: {GPU_SHARE} on a cluster with GPUs, else 0)",
                        bounds=NON_NEGATIVE)
MAX_FAILURES = option("Tune retries of a failed trial", bounds=NON_NEGATIVE)


@dataclass(frozen=True)
class ParentRun:
    """The job's MLflow parent run, which the trials' child runs hang under."""

    tracking_uri: str
    experiment_id: str
    run_id: str


def trial_resources(cpus_per_trial: float, gpus_per_trial: float | None,
                    cluster: dict[str, float] | None = None) -> dict[str, float]:
    """What one trial asks Ray for; `cluster` is the cluster's resources (default: the running Ray's)."""
    if gpus_per_trial is None:
        cluster = ray.cluster_resources() if cluster is None else cluster
        gpus_per_trial = GPU_SHARE if cluster.get("GPU", 0) > 0 else 0.0
    return {"cpu": cpus_per_trial, **({"gpu": gpus_per_trial} if gpus_per_trial else {})}


def run_trials(trial: Trial, *, data: dict[str, Any], encoder: PretrainedEncoder, configs: list[dict[str, Any]],
               name_of: Callable[[dict[str, Any]], str], params_of: Callable[[dict[str, Any]], dict[str, Any]],
               cpus_per_trial: float, gpus_per_trial: float | None, max_failures: int, parent: ParentRun,
               storage: str, run_name: str) -> tune.ResultGrid:
    """One trial per config of `configs` (each a dict with the same keys), `trial(config, data refs,
    encoder)` reporting through `tune.report`. `data` goes into the object store once; the Tune run is
    `run_name` under `storage`."""
    init_ray()
    resources = trial_resources(cpus_per_trial, gpus_per_trial)
    settings = {"threads": max(1, int(cpus_per_trial)), "inject_failures": faults.planned().trials,
                "marker_dir": str(Path(storage) / run_name / "injected_failures")}
    trainable = tune.with_resources(tune.with_parameters(
        in_actor, trial=trial, name_of=name_of, data={key: ray.put(value) for key, value in data.items()},
        encoder=encoder, settings=settings), resources)
    callback = MlflowTrials(parent, params_of, name_of, total=len(configs),
                            interrupt_after=faults.planned().interrupt_after_trials)
    tuner = tune.Tuner(
        trainable,
        param_space=listed_space(configs),
        tune_config=tune.TuneConfig(
            reuse_actors=True,  # a trial reseeds everything; reusing the process saves the torch import per trial
            trial_name_creator=lambda t: name_of(configs[t.config["index"]]),
            trial_dirname_creator=lambda t: f"{name_of(configs[t.config['index']])}-{t.trial_id}",
        ),
        run_config=tune.RunConfig(
            name=run_name, storage_path=storage, verbose=0,
            failure_config=tune.FailureConfig(max_failures=max_failures),
            callbacks=[callback, CSVLoggerCallback(), JsonLoggerCallback()],  # no TensorBoard (jobs.env)
        ),
    )
    print(f"trials get {resources} each", flush=True)
    results = tuner.fit()
    unended = sum(1 for r in results if r.error is None and not (r.metrics or {}).get("done"))
    if unended:  # Tune caught a Ctrl-C (or SIGUSR1) and stopped early
        raise KeyboardInterrupt(f"Tune run {run_name} interrupted with {unended} of {len(configs)} trials unended")
    return results


def listed_space(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """Tune's search space of exactly `configs`: a grid over their indices, each key looked up in the
    indexed config. A product of grid_search axes cannot leave out single (point, seed) pairs, which a
    resumed sweep must; the trials' configs keep their keys (plus `index`). Tune resolves the lookups
    only once a trial is added: its name creators see `index` alone."""
    return {"index": tune.grid_search(list(range(len(configs)))),
            **{key: tune.sample_from(partial(_config_value, configs, key)) for key in configs[0]}}


def _config_value(configs: list[dict[str, Any]], key: str, config: dict[str, Any]) -> Any:
    return configs[config["index"]][key]


# ----------------------------------------------------------------------------- MLflow, from the driver


class MlflowTrials(tune.Callback):
    """Keeps one MLflow child run per trial attempt, under the job's parent run, and prints a line
    per finished trial."""

    def __init__(self, parent: ParentRun, params_of: Callable[[dict[str, Any]], dict[str, Any]],
                 name_of: Callable[[dict[str, Any]], str], total: int, interrupt_after: int = 0) -> None:
        """`params_of(config)` gives a trial's MLflow params, `name_of(config)` its name; `interrupt_after`
        (jobs.faults, tests only): Ctrl-C this process once that many trials ended."""
        self.client = MlflowClient(parent.tracking_uri)
        self.parent, self.total, self.interrupt_after = parent, total, interrupt_after
        self.params_of, self.name_of = params_of, name_of
        self.runs: dict[str, str] = {}  # trial id -> child run of its current attempt
        self.attempts: dict[str, int] = {}
        self.finished = 0

    def on_trial_start(self, iteration, trials, trial, **info):
        name = self.name_of(trial.config)
        self.attempts[trial.trial_id] = self.attempts.get(trial.trial_id, 0) + 1
        run = self.client.create_run(self.parent.experiment_id, run_name=name, tags={
            "mlflow.parentRunId": self.parent.run_id, TRIAL_TAG: name, KIND_TAG: KIND_TRIAL,
            ATTEMPT_TAG: str(self.attempts[trial.trial_id])})
        self.runs[trial.trial_id] = run.info.run_id
        tracking.log_params(self.client, run.info.run_id, self.params_of(trial.config))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self.runs.get(trial.trial_id)
        if run_id is None:
            return
        final = bool(result.get("done"))
        now, step = int(time.time() * 1000), int(result.get("eval", 0))
        metrics = [Metric(k, float(v), now, step) for k, v in result.items()
                   if _is_trial_metric(k, v) and (not final or k.startswith("test.") or k == "trial_seconds")]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[start : start + 1000])

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.finished += 1
        result = trial.last_result or {}
        scores = ", ".join(f"{k.split('.')[1]} {v:.4f}" for k, v in result.items()
                           if k.startswith("best.") and k.endswith(".score"))
        print(f"[{self.finished}/{self.total}] {self.name_of(trial.config)}: {scores} "
              f"({result.get('trial_seconds', 0):.0f}s)", flush=True)
        self._end(trial, ok=True)
        if self.finished == self.interrupt_after:  # a user's Ctrl-C, which Tune's own handler takes
            os.kill(os.getpid(), signal.SIGINT)

    def on_trial_recover(self, iteration, trials, trial, **info):
        print(f"trial {self.name_of(trial.config)} failed; retrying: {_first_line(trial)}", flush=True)
        self._end(trial, ok=False)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.finished += 1
        print(f"[{self.finished}/{self.total}] {self.name_of(trial.config)} FAILED after "
              f"{self.attempts.get(trial.trial_id, 1)} attempt(s): {_first_line(trial)}", flush=True)
        self._end(trial, ok=False)

    def on_experiment_end(self, trials, **info):
        """Trials still open when Tune stops early (Ctrl-C) never ended: KILLED, not left RUNNING."""
        for run_id in self.runs.values():
            self.client.set_terminated(run_id, status="KILLED")
        self.runs.clear()

    def _end(self, trial, ok: bool) -> None:
        run_id = self.runs.pop(trial.trial_id, None)
        if run_id is None:
            return
        if not ok:
            self.client.set_tag(run_id, ERROR_TAG, _first_line(trial)[:5000])
        tracking.end_run(self.client, run_id, ok)


def _is_trial_metric(key: str, value: Any) -> bool:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return numeric and (key.startswith(("best.", "test.")) or "." in key or key in ("train_loss", "lr", "epoch",
                                                                                    "trial_seconds"))


def _first_line(trial) -> str:
    error_file = getattr(trial, "error_file", None) or ""
    try:
        text = Path(error_file).read_text().strip().splitlines() if error_file else []
    except OSError:
        text = []
    return text[-1] if text else "unknown error"
