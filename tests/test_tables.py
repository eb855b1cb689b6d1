"""jobs.finetuning.tables: trial rows per dev split, failed trials without a score, dev selects and test reports."""

from __future__ import annotations

import math
from types import SimpleNamespace

from mlflow.tracking import MlflowClient

from helpers import empty_store

from jobs.finetuning.tasks.specs import GLUE, SNLI
from jobs.finetuning.tables import log_tables, tabulate, trial_records
from jobs.names import (KIND_SWEEP, KIND_TAG, PRETRAINING_TAG, best_task_metric, dev_seed_scores, seed_scores)
from jobs.run_tables import sweep_scores
from jobs.tracking import experiment_id


def test_mnli_trials_give_an_mnli_m_and_an_mnli_mm_row_and_failures_no_score():
    encoded = {"mnli": SimpleNamespace(spec=GLUE["mnli"][0], test=None)}
    point = {"task": "mnli", "lr": 2e-5, "batch_size": 32, "epochs": 3, "warmup": 0.06}
    ok = SimpleNamespace(config={"point": point, "seed": 0}, error=None, metrics={
        "done": 1, "best.dev_matched.score": 0.8, "best.dev_mismatched.score": 0.7})
    failed = SimpleNamespace(config={"point": point, "seed": 1}, error=RuntimeError("x"), metrics={})
    rows = trial_records([ok, failed], encoded)
    assert [(r["task"], r["seed"], r["score"]) for r in rows[:2]] == [("MNLI-m", 0, 0.8), ("MNLI-mm", 0, 0.7)]
    assert [r["task"] for r in rows[2:]] == ["MNLI-m", "MNLI-mm"] and all(r["score"] != r["score"] for r in rows[2:])


def snli_trials(dev_by_lr: dict[float, list[float]], test_by_lr: dict[float, list[float]]) -> list:
    """Finished SNLI trials as Tune returns them: per learning rate and seed, its best dev accuracy and the
    test accuracy scored with that evaluation's weights."""
    results = []
    for lr, devs in dev_by_lr.items():
        point = {"task": "snli", "lr": lr, "batch_size": 32, "epochs": 2, "warmup": 0.1}
        for seed, (dev, test) in enumerate(zip(devs, test_by_lr[lr])):
            results.append(SimpleNamespace(config={"point": point, "seed": seed}, error=None, metrics={
                "done": 1, "best.dev.score": dev, "best.dev.accuracy": dev, "test.score": test, "test.accuracy": test}))
    return results


def logged_sweep(tmp_path, out) -> tuple[MlflowClient, str, str]:
    """`out`'s tables logged to a finished sweep run in an empty store, as the sweep job does: the client,
    the experiment and the run."""
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    exp = experiment_id(client, "study", uri)
    sweep = client.create_run(exp, tags={KIND_TAG: KIND_SWEEP, PRETRAINING_TAG: "p1"}).info.run_id
    log_tables(client, sweep, out)
    client.set_terminated(sweep)
    return client, exp, sweep


def test_the_sweep_reports_test_scores_at_the_grid_point_dev_chose(tmp_path):
    """lr 1e-3 wins on dev, lr 5e-4 would win on test: the reported values are 1e-3's test scores, dev's
    sit beside them, and the readers (`sweep_scores`, `seed_scores`) get the test values and the split."""
    dev = {5e-4: [0.60, 0.61, 0.62], 1e-3: [0.70, 0.71, 0.72]}
    test = {5e-4: [0.80, 0.81, 0.82], 1e-3: [0.50, 0.53, 0.51]}
    encoded = {"snli": SimpleNamespace(spec=SNLI, test=object())}
    out = tabulate(snli_trials(dev, test), encoded, seeds=(0, 1, 2))
    row = out.table.set_index("task").loc["SNLI"]
    assert row["lr"] == 1e-3 and row["split"] == "test" and row["score_median"] == 0.71
    assert (row["reported_median"], row["reported_min"], row["reported_max"]) == (0.51, 0.50, 0.53)
    assert "| SNLI | accuracy | test | 51.00 | 50.00 | 53.00 | 71.00 |" in out.markdown

    client, exp, sweep = logged_sweep(tmp_path, out)
    metrics = client.get_run(sweep).data.metrics
    assert seed_scores(metrics, "SNLI") == {0: 0.50, 1: 0.53, 2: 0.51}  # what the claims read: test values
    assert dev_seed_scores(metrics, "SNLI") == {0: 0.70, 1: 0.71, 2: 0.72}
    assert metrics[best_task_metric("SNLI", "median")] == 0.51 and metrics[best_task_metric("SNLI", "dev_median")] == 0.71
    scores = sweep_scores(client, [exp]).set_index("task").loc["SNLI"]
    assert scores["split"] == "test" and scores["score"] == 0.51 and scores["values"] == (0.50, 0.53, 0.51)
    assert scores["dev_score"] == 0.71 and scores["dev_values"] == (0.70, 0.71, 0.72)


def test_a_task_without_a_test_split_reports_dev_and_says_so(tmp_path):
    encoded = {"snli": SimpleNamespace(spec=SNLI, test=None)}
    results = snli_trials({1e-3: [0.70, 0.71, 0.72]}, {1e-3: [math.nan] * 3})
    out = tabulate([SimpleNamespace(config=r.config, error=None, metrics={k: v for k, v in r.metrics.items()
                                                                          if not k.startswith("test.")})
                    for r in results], encoded, seeds=(0, 1, 2))
    row = out.table.iloc[0]
    assert row["split"] == "dev" and row["reported_median"] == row["score_median"] == 0.71
    client, exp, _ = logged_sweep(tmp_path, out)
    scores = sweep_scores(client, [exp]).iloc[0]
    assert scores["split"] == "dev" and scores["values"] == scores["dev_values"] == (0.70, 0.71, 0.72)


def rte_trials(devs: list[float]) -> list:
    point = {"task": "rte", "lr": 3e-5, "batch_size": 16, "epochs": 10, "warmup": 0.1}
    return [SimpleNamespace(config={"point": point, "seed": seed}, error=None,
                            metrics={"done": 1, "best.dev.score": dev, "best.dev.accuracy": dev})
            for seed, dev in enumerate(devs)]


def test_the_grids_published_result_is_printed_and_logged_beside_the_median(tmp_path):
    encoded = {"rte": SimpleNamespace(spec=GLUE["rte"][0], test=None)}
    out = tabulate(rte_trials([0.86, 0.88, 0.90]), encoded, seeds=(0, 1, 2), published={"RTE": {"accuracy": 87.4}})
    assert "| RTE | accuracy | dev | 88.00 | 86.00 | 90.00 | 88.00 | 87.40 | +0.60 |" in out.markdown
    assert "`published`: the grid's published dev result" in out.markdown
    plain = tabulate(rte_trials([0.86, 0.88, 0.90]), encoded, seeds=(0, 1, 2))
    assert "published" not in plain.markdown and "gap" not in plain.table.columns  # no published: as before

    client, _, sweep = logged_sweep(tmp_path, out)
    metrics = client.get_run(sweep).data.metrics
    assert math.isclose(metrics[best_task_metric("RTE", "published")], 0.874)
    assert math.isclose(metrics[best_task_metric("RTE", "gap")], 0.88 - 0.874)
