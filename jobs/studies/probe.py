"""Linear probe on the frozen encoder: how much of SNLI a pretraining run's final hidden states carry.

    python -m jobs.studies.probe --from RUN_ID[,RUN_ID...] | --from-experiment NAME
        [--train-pairs 10000] [--max-length 64] [--tracking-uri URI]

For each pretraining run: its exported encoder (artifact `encoder/`, with the tokenizer) encodes SNLI
pairs in the fine-tuning format (`[CLS] premise [SEP] [SEP] hypothesis [SEP]`, cut to `--max-length`)
through its tokenizer's scheme (`jobs.data.schemes`: an encoder converted from the authors' checkpoint
reads their ids) and is never trained. Two feature vectors per pair, from the last layer: the [CLS] vector and the mean
over the pair's tokens. On each, a multinomial logistic regression (scikit-learn, features standardized
on train) is fitted on `--train-pairs` pairs of SNLI train (a fixed-seed subset, the same for every
run), its L2 strength chosen from `C_GRID` on `DEV_PAIRS` pairs of the dev split that `read_snli` holds
out of train by premise, and scored once on the whole, untouched SNLI test split (9,824 pairs).

Logged on the pretraining run itself: metrics `jobs.names.PROBE_METRICS` (the test accuracies, the
reported numbers), the dev accuracies and the sizes (`PROBE_DEV_METRICS`, `PROBE_SIZE_METRICS`), and
`probe/probe.json` with every detail (the chosen C, accuracy per C, confusion matrices, truncation,
seconds). A run that holds the metrics is not probed again. Unlike fine-tuning, nothing here can move
the encoder: a [CLS] vector that collapsed onto one direction scores what its remaining linear
information allows, and a randomly initialised encoder (`jobs.studies.control`) gives the floor.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import confusion_matrix
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from model import Encoder
from model.classifier import load_encoder

from jobs import tracking
from jobs.cli import AT_LEAST_ONE, Range, UserError, comma_list, option, parse_options, run_main
from jobs.env import set_hermetic_env
from jobs.finetuning.encoding import EncodedSplit, batches, encode_task
from jobs.finetuning.tasks.snli import SNLI_DIR, read_snli
from jobs.finetuning.tasks.subsets import subsample
from jobs.finetuning.tasks.task import Task
from jobs.names import PROBE_ARTIFACT, PROBE_DEV_METRICS, PROBE_FEATURES, PROBE_METRICS, PROBE_SIZE_METRICS
from jobs.run_tables import finished_run_ids

TRAIN_PAIRS = 10_000  # of SNLI train's 94,889 (the issue asks for at least 10,000): 3 classes x H weights
#                       need no more, and embedding is most of a probe's time
DEV_PAIRS = 1_000  # of the 5,001 held out by premise: only picks C
C_GRID = (0.01, 0.1, 1.0)  # inverse L2 strength on standardized features; ties go to the stronger
MAX_LENGTH = 64  # tokens per pair, as the study-cpu fine-tuning grid
MAX_ITER = 1000  # lbfgs iterations: standardized features converge in far fewer
EMBED_BATCH = 128


@dataclass(frozen=True)
class ProbeResult:
    run_id: str
    status: str  # FINISHED | ALREADY_FINISHED
    metrics: dict[str, float]  # PROBE_METRICS, PROBE_DEV_METRICS and PROBE_SIZE_METRICS as logged


def probe_task(train_pairs: int = TRAIN_PAIRS, dev_pairs: int = DEV_PAIRS, snli_dir: str | Path = SNLI_DIR) -> Task:
    """The SNLI pairs every run is probed on: fixed-seed subsets of train and dev; test whole."""
    return subsample(read_snli(snli_dir), train_pairs, dev_pairs)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch and BLAS on one thread while probing, then as before. Small products (B x 64 tokens by 128
    wide, lbfgs on (10000, 128)) gain little from a second thread, and on two busy cores two threads
    spin: measured on the shared 2-core machine, embedding 2,000 pairs took 3.5 s on one thread and
    18.5 s on two; one logistic regression fit 6.6 s against 223 s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            yield
    finally:
        torch.set_num_threads(threads)


def features(encoder: Encoder, split: EncodedSplit, pad_id: int) -> dict[str, np.ndarray]:
    """{'cls': (N, H), 'mean': (N, H)} in the split's order: the last layer's [CLS] vector and the mean of
    its vectors over the pair's tokens (padding left out)."""
    out = {name: np.empty((len(split), encoder.cfg.hidden_size), dtype=np.float32) for name in PROBE_FEATURES}
    order = np.argsort(split.lengths(), kind="stable")  # batches of similar lengths pad little
    encoder.eval()
    with torch.no_grad():
        for start, (ids, _) in zip(range(0, len(order), EMBED_BATCH), batches(split, order, EMBED_BATCH, pad_id)):
            rows = order[start : start + EMBED_BATCH]
            mask = ids != pad_id  # (B, T)
            hidden = encoder(ids, mask)  # (B, T, H)
            out["cls"][rows] = hidden[:, 0].numpy()
            weights = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            out["mean"][rows] = ((hidden * weights).sum(1) / weights.sum(1)).numpy()
    return out


def fit_probe(train: tuple[np.ndarray, np.ndarray], dev: tuple[np.ndarray, np.ndarray],
              test: tuple[np.ndarray, np.ndarray], c_grid: tuple[float, ...] = C_GRID) -> dict:
    """A standardized multinomial logistic regression per C on train; the C with the best dev accuracy
    (the first on a tie) is the probe, scored once on test. Returns its accuracies and details."""
    fitted, dev_accuracy = {}, {}
    for c in c_grid:
        model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=MAX_ITER))
        fitted[c] = model.fit(*train)
        dev_accuracy[c] = float(model.score(*dev))
    chosen = max(c_grid, key=lambda c: dev_accuracy[c])  # max keeps the first of equals: grid order
    model = fitted[chosen]
    predicted = model.predict(test[0])
    return {"c": chosen, "dev_accuracy_by_c": {str(c): a for c, a in dev_accuracy.items()},
            "train_accuracy": float(model.score(*train)), "dev_accuracy": dev_accuracy[chosen],
            "test_accuracy": float(np.mean(predicted == test[1])),
            "test_confusion": confusion_matrix(test[1], predicted, labels=np.unique(train[1])).tolist(),
            "iterations": int(model[-1].n_iter_.max()), "converged": bool(model[-1].n_iter_.max() < MAX_ITER)}


def probe_encoder(encoder_dir: Path, task: Task, max_length: int) -> dict:
    """Encode the pairs with the encoder's own tokenizer, embed them, fit and score both probes."""
    torch.manual_seed(0)  # nothing is random in eval mode; a fixed seed keeps it so
    encoder = load_encoder(encoder_dir)
    if max_length > encoder.cfg.max_positions:
        raise UserError(f"--max-length {max_length} exceeds the encoder's {encoder.cfg.max_positions} positions")
    encoded = encode_task(task, encoder_dir, max_length)
    started = time.perf_counter()
    splits = {"train": encoded.train, "dev": encoded.dev["dev"], "test": encoded.test}
    vectors = {name: features(encoder, split, encoded.pad_id) for name, split in splits.items()}
    embedded = time.perf_counter()
    labelled = {name: split.labels for name, split in splits.items()}
    probes = {feature: fit_probe(*((vectors[s][feature], labelled[s]) for s in ("train", "dev", "test")))
              for feature in PROBE_FEATURES}
    majority = np.bincount(labelled["train"]).argmax()
    return {"probes": probes, "pairs": {name: len(split) for name, split in splits.items()},
            "truncated": dict(encoded.truncated), "max_length": max_length, "c_grid": list(C_GRID),
            "test_majority_class_accuracy": float(np.mean(labelled["test"] == majority)),
            "hidden_size": encoder.cfg.hidden_size, "notes": list(task.notes),
            "embed_seconds": embedded - started, "fit_seconds": time.perf_counter() - embedded}


def probe_metrics(details: dict) -> dict[str, float]:
    """The values logged on the run: test and dev accuracy per feature, then the sizes."""
    probes, pairs = details["probes"], details["pairs"]
    return {**{key: probes[f]["test_accuracy"] for key, f in zip(PROBE_METRICS, PROBE_FEATURES)},
            **{key: probes[f]["dev_accuracy"] for key, f in zip(PROBE_DEV_METRICS, PROBE_FEATURES)},
            **{key: float(pairs[s]) for key, s in zip(PROBE_SIZE_METRICS, ("train", "dev", "test"))}}


def is_probed(client: MlflowClient, run_id: str) -> bool:
    """The run holds every reported probe metric (logged in one batch, after the details)."""
    return set(PROBE_METRICS) <= set(client.get_run(run_id).data.metrics)


def analyse_run(client: MlflowClient, run_id: str, task: Task, max_length: int = MAX_LENGTH) -> ProbeResult:
    """Probe the run's exported encoder and log the results on the run; a run already probed is left as is."""
    if is_probed(client, run_id):
        logged = client.get_run(run_id).data.metrics
        print(f"probe of run {run_id} already logged", flush=True)
        return ProbeResult(run_id, "ALREADY_FINISHED",
                           {k: logged[k] for k in (*PROBE_METRICS, *PROBE_DEV_METRICS, *PROBE_SIZE_METRICS) if k in logged})
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per encoder file otherwise
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cocolm-probe-") as tmp:
        with one_thread():
            details = probe_encoder(Path(client.download_artifacts(run_id, "encoder", tmp)), task, max_length)
    details["seconds"] = time.perf_counter() - started
    values = probe_metrics(details)
    # The details first, the metrics in one batch last: a run with the metrics has everything.
    client.log_text(run_id, json.dumps(details, indent=1) + "\n", PROBE_ARTIFACT)
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()])
    run = client.get_run(run_id)
    label = f"{run.data.tags.get('variant', run.info.run_name)} ({run.data.tags.get('preset', '?')})"
    cls, mean = (details["probes"][f] for f in PROBE_FEATURES)
    print(f"{label} run {run_id}: linear probe on SNLI test ({details['pairs']['test']} pairs; trained on "
          f"{details['pairs']['train']}): [CLS] {cls['test_accuracy']:.3f} (C {cls['c']:g}), mean-pooled "
          f"{mean['test_accuracy']:.3f} (C {mean['c']:g}), majority class {details['test_majority_class_accuracy']:.3f}; "
          f"embedding {details['embed_seconds']:.0f} s, fitting {details['fit_seconds']:.0f} s, "
          f"{details['seconds']:.0f} s in all; logged as its metrics {', '.join(PROBE_METRICS)} and {PROBE_ARTIFACT}",
          flush=True)
    return ProbeResult(run_id, "FINISHED", values)


@dataclass(frozen=True)
class ProbeOptions:
    runs: tuple[str, ...] = field(default=(), metadata=option(
        "pretraining MLflow run id(s), comma separated", flag="--from", parse=comma_list))
    experiment: str | None = field(default=None, metadata=option(
        "the runs to probe: every finished pretraining run of this MLflow experiment", flag="--from-experiment"))
    train_pairs: int = field(default=TRAIN_PAIRS, metadata=option(
        "SNLI train pairs the probes are fitted on (a fixed-seed subset)", bounds=AT_LEAST_ONE))
    max_length: int = field(default=MAX_LENGTH, metadata=option("tokens per pair, [CLS] and [SEP]s included",
                                                                bounds=Range(5)))
    tracking_uri: str | None = field(default=None, metadata=option(
        "MLflow tracking URI (default: sqlite store under $COCOLM_HOME)"))

    def __post_init__(self) -> None:
        if bool(self.runs) == bool(self.experiment):
            raise UserError("give the runs to probe: --from RUN_ID[,RUN_ID...] or --from-experiment NAME (one of them)")


def run(opts: ProbeOptions) -> list[ProbeResult]:
    """Probe the given runs (or every finished pretraining run of the experiment)."""
    set_hermetic_env()
    tracking_uri = opts.tracking_uri or tracking.default_tracking_uri()
    tracking.check_sqlite(tracking_uri)  # a store that only is read: never made here
    client = MlflowClient(tracking_uri)
    run_ids = list(opts.runs) or finished_run_ids(client, opts.experiment, tracking_uri, newest_per_seed=False)
    for run_id in run_ids:  # every id checked before any run is probed
        try:
            client.get_run(run_id)
        except MlflowException:
            raise UserError(f"--from {run_id!r}: no such run in the MLflow store {tracking_uri}") from None
    task = probe_task(opts.train_pairs)
    return [analyse_run(client, run_id, task, opts.max_length) for run_id in run_ids]


def main(argv: list[str] | None = None) -> list[ProbeResult]:
    return run(parse_options("python -m jobs.studies.probe", __doc__, ProbeOptions, argv))


if __name__ == "__main__":
    run_main(main)
