"""jobs.studies.probe: linear probes on the frozen encoder, logged once on the pretraining run."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from jobs.finetuning.tasks.snli import SNLI_DIR, read_snli
from jobs.finetuning.tasks.specs import SNLI
from jobs.finetuning.tasks.subsets import subsample
from jobs.finetuning.tasks.task import Split, Task
from jobs.cli import UserError
from jobs.names import PROBE_ARTIFACT, PROBE_DEV_METRICS, PROBE_METRICS, PROBE_SIZE_METRICS
from jobs.studies import probe
from jobs.tracking import experiment_id
from helpers import empty_store, fake_pretraining_run


def small_snli(directory: Path, train: int = 400, test: int = 120) -> Path:
    """The first rows of the shipped SNLI's train and test files, in the same format."""
    directory.mkdir()
    for name, count in (("train", train), ("test", test)):
        with gzip.open(SNLI_DIR / f"{name}.jsonl.gz", "rt") as source, gzip.open(directory / f"{name}.jsonl.gz", "wt") as out:
            out.writelines(itertools.islice(source, count))
    return directory


def labelled(rng: np.random.Generator, n: int, signal: float, flip: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(X, y): 16 noise features, the first three adding `signal` times the one-hot label; `flip` gives
    every row the next class's label instead (a split where the learned rule is always wrong)."""
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 16))
    x[np.arange(n), y] += signal
    return x, (y + 1) % 3 if flip else y


def test_a_probe_on_features_that_carry_the_label_is_right_and_on_noise_at_chance():
    rng = np.random.default_rng(0)
    carried = probe.fit_probe(labelled(rng, 600, 8.0), labelled(rng, 200, 8.0), labelled(rng, 600, 8.0))
    assert carried["test_accuracy"] > 0.97 and carried["converged"]
    noise = probe.fit_probe(labelled(rng, 600, 0.0), labelled(rng, 200, 0.0), labelled(rng, 600, 0.0))
    assert 0.25 < noise["test_accuracy"] < 0.42
    assert np.array(carried["test_confusion"]).sum() == 600  # every test pair scored once


def test_the_regularisation_is_chosen_on_dev_never_on_test():
    """Dev follows train's rule, test has every label moved one class on: chosen on dev, C=1 learns the
    rule and scores 0 on test; chosen on test, the near-constant C=1e-6 model would win (about 1/3)."""
    rng = np.random.default_rng(1)
    result = probe.fit_probe(labelled(rng, 600, 2.0), labelled(rng, 300, 2.0), labelled(rng, 600, 2.0, flip=True),
                             c_grid=(1e-6, 1.0))
    assert result["c"] == 1.0 and result["dev_accuracy"] > 0.6 and result["test_accuracy"] < 0.2


@pytest.mark.timeout(300)
def test_probe_logs_on_the_pretraining_run_and_skips_a_run_already_probed(exported, tmp_path, capsys):
    snli = small_snli(tmp_path / "snli")
    task = subsample(read_snli(snli, dev_pairs=80), 250, 60)
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    run_id = fake_pretraining_run(client, experiment_id(client, "ablation-tiny", uri), "cocolm", {})
    client.log_artifacts(run_id, str(exported), "encoder")

    done = probe.analyse_run(client, run_id, task, max_length=32)
    assert done.status == "FINISHED"
    logged = client.get_run(run_id).data.metrics
    assert set(PROBE_METRICS) | set(PROBE_DEV_METRICS) | set(PROBE_SIZE_METRICS) <= set(logged)
    assert all(0 <= logged[k] <= 1 for k in PROBE_METRICS)
    assert [logged[k] for k in PROBE_SIZE_METRICS] == [len(task.train), len(task.dev["dev"]), len(task.test)] \
        == [250, 60, 120]  # the whole test split, never cut
    details = json.loads(Path(client.download_artifacts(run_id, PROBE_ARTIFACT, str(tmp_path))).read_text())
    assert details["probes"]["cls"]["test_accuracy"] == logged[PROBE_METRICS[0]]
    assert details["probes"]["cls"]["c"] in probe.C_GRID
    assert f"run {run_id}: linear probe on SNLI test (120 pairs; trained on 250)" in capsys.readouterr().out

    # Run again, through the command line: nothing is computed or logged a second time.
    history = len(client.get_metric_history(run_id, PROBE_METRICS[0]))
    again = probe.main(["--from", run_id, "--tracking-uri", uri])
    assert [r.status for r in again] == ["ALREADY_FINISHED"] and again[0].metrics == done.metrics
    assert len(client.get_metric_history(run_id, PROBE_METRICS[0])) == history == 1
    assert f"probe of run {run_id} already logged" in capsys.readouterr().out


def test_probes_of_a_frozen_encoder_read_a_label_its_input_carries(exported):
    """Through the whole path (encoding, length-sorted batches back in order, pooling): the label is which
    word the premise holds, so even a random encoder's vectors carry it; rows put back out of order,
    or labels not matched to their pairs, would score at chance."""
    words = [("good", "great"), ("bad", "awful"), ("red", "blue")]  # one pair of words per class
    rng = np.random.default_rng(0)

    def split(n: int) -> Split:
        labels = rng.integers(0, 3, n).tolist()
        premises = [f"the film was {words[y][i % 2]} " + "and long " * int(rng.integers(0, 6)) for i, y in enumerate(labels)]
        return Split(premises, [f"a story number {i}" for i in range(n)], labels, "synthetic")

    task = Task(SNLI, split(300), {"dev": split(90)}, split(150))
    details = probe.probe_encoder(exported, task, max_length=32)
    assert details["probes"]["mean"]["test_accuracy"] > 0.9 and details["probes"]["cls"]["test_accuracy"] > 0.9
    assert details["pairs"] == {"train": 300, "dev": 90, "test": 150}


def test_an_unknown_run_is_one_error_line_before_anything_is_probed(tmp_path):
    uri = empty_store(tmp_path)
    with pytest.raises(UserError, match="--from 'nope': no such run in the MLflow store"):
        probe.main(["--from", "nope", "--tracking-uri", uri])
    with pytest.raises(UserError, match="one of them"):
        probe.ProbeOptions()
