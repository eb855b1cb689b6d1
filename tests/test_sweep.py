"""Fine-tuning: the exported / checkpointed encoder, one trial as a plain function, grids, and a Tune sweep
end to end (2 learning rates x 5 seeds on a user task file) with its MLflow parent and child runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from jobs import faults
from jobs.names import seed_scores
from jobs.finetuning.sweep import SweepOptions, run
from helpers import ONE_POINT_GRID, empty_store, sentiment_file, sweep_inputs

# ----------------------------------------------------------------------------- grids


@pytest.mark.parametrize("bad", [",", "abc", "0", "1,x", "2,2", "3,-1"])
def test_bad_seed_lists_are_usage_errors_before_anything_starts(bad, capsys, monkeypatch):
    """`--seeds ","` used to create an MLflow parent run and crash inside Ray Tune; `abc` gave a bare
    int() error. Now argparse stops with the flag's name; nothing is started."""
    from jobs.finetuning import sweep

    monkeypatch.setattr(sweep, "run", lambda opts: pytest.fail("the sweep must not start"))
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--from", "last", "--seeds", bad])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--seeds" in err and "expected a seed count" in err
    with pytest.raises(ValueError, match="no seeds|distinct non-negative"):
        SweepOptions(source="last", seeds=())


def test_a_dry_run_prints_the_plan_first_and_runs_nothing(tmp_path, exported, capsys, monkeypatch):
    """The plan line (what a sweep also prints first) after the encoder, data and grid are checked; no Ray,
    no MLflow experiment or run."""
    from jobs.finetuning import sweep

    monkeypatch.setattr(sweep, "_tune", lambda *args: pytest.fail("a dry run must not start trials"))
    tracking_uri = f"sqlite:///{tmp_path}/m.db"
    result = sweep.main(["--from", str(exported), "--tasks", "snli", "--grid", "quick", "--seeds", "5",
                         "--label-fractions", "0.1,1.0", "--tracking-uri", tracking_uri,
                         "--storage", str(tmp_path / "ray"), "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("plan: snli:0.1 (3 grid points), snli (3 grid points) x 5 seeds = 30 trials "
                        "(grid quick, learning rates base)")
    # the notes end with the GPU-hours each target's trials are estimated at (jobs/finetuning/cost.py)
    assert re.fullmatch(r"estimate: .+ for the sweep on one GPU \(snli:0\.1 .+, snli .+\): .+ not a measurement",
                        lines[-1]), lines[-1]
    assert result.tables is None and result.trials_run == 0
    from mlflow.tracking import MlflowClient

    assert [e.name for e in MlflowClient(tracking_uri).search_experiments()] in ([], ["Default"])


# ----------------------------------------------------------------------------- the sweep on Ray Tune


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_sweep_end_to_end_with_retries_incomplete_points_and_mlflow(ray_local, tmp_path, exported, monkeypatch,
                                                                   capfd):
    tracking_uri, client, pretraining_run, grid = sweep_inputs(
        tmp_path, exported, monkeypatch, "max_length: 32\nspaces:\n"
        "  t: {epochs: [1], lr: [1.0e-3, 3.0e-3], batch_size: [16], warmup: [0.1]}\ntasks: {default: t}\n")
    monkeypatch.setenv(faults.ENV, json.dumps({"trials": {
        "sentiment-lr0.001-bs16-ep1-wu0.1-seed1": 1,  # fails once, the retry succeeds
        "sentiment-lr0.003-bs16-ep1-wu0.1-seed3": 2}}))  # fails every allowed attempt
    result = run(SweepOptions(
        source=pretraining_run, tasks=str(sentiment_file(tmp_path / "sentiment.jsonl")), grid=str(grid),
        seeds=(0, 1, 2, 3, 4), tracking_uri=tracking_uri, max_failures=1, storage=str(tmp_path / "ray"),
    ))
    summary = result.tables.summary.set_index("lr")
    assert summary.loc[1e-3, "complete"] and summary.loc[1e-3, "seeds_done"] == 5
    assert not summary.loc[3e-3, "complete"] and summary.loc[3e-3, "missing_seeds"] == "3"
    assert result.tables.best.iloc[0]["lr"] == 1e-3  # the incomplete point cannot win
    assert "incomplete: 4/5 seeds (missing 3)" in result.tables.markdown and "| sentiment | accuracy |" in result.tables.markdown
    out = capfd.readouterr()
    assert "TensorBoard" not in out.out + out.err and "Failed to fetch metrics" not in out.out + out.err
    assert len(list((tmp_path / "ray").glob("sweep-*/*/result.json"))) >= 10  # Tune's own result files remain

    parent = client.get_run(result.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["cocolm.pretraining_run"] == pretraining_run
    assert parent.data.params["pretraining_run"] == pretraining_run and parent.data.params["lr_set"] == "base"
    assert parent.data.metrics["best/sentiment/median"] == pytest.approx(summary.loc[1e-3, "score_median"])
    per_seed = seed_scores(parent.data.metrics, "sentiment")  # what the claims' tests over seeds read
    assert sorted(per_seed) == [0, 1, 2, 3, 4]
    assert np.median(list(per_seed.values())) == pytest.approx(summary.loc[1e-3, "score_median"])
    assert "sentiment/lr_0.001.bs_16.ep_1.wu_0.1/std" in parent.data.metrics
    assert "sentiment/lr_0.003.bs_16.ep_1.wu_0.1/median" not in parent.data.metrics  # incomplete: no median
    assert parent.data.metrics["points_incomplete"] == 1 and parent.data.metrics["trials_failed"] == 1
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"task_table.csv", "task_table.md", "grid_points.csv", "grid_points.md", "best_points.csv",
            "trials.csv", "summary.md"} <= artifacts

    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{result.run_id}'", max_results=100)
    statuses = sorted(c.info.status for c in children)
    assert statuses.count("FINISHED") == 9 and statuses.count("FAILED") == 3  # 1 retried + 2 attempts of the lost trial
    assert all(c.info.status in ("FINISHED", "FAILED") for c in children)  # every run ended
    done = next(c for c in children if c.info.status == "FINISHED")
    assert {"lr", "batch_size", "epochs", "warmup", "seed", "task", "pretraining_run"} <= set(done.data.params)
    assert len(client.get_metric_history(done.info.run_id, "dev.accuracy")) == 2  # every half epoch
    assert "best.dev.accuracy" in done.data.metrics


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_label_fractions_are_targets_of_their_own_with_nested_subsets(ray_local, tmp_path, exported, monkeypatch):
    """--label-fractions 0.2,1.0: every grid point and seed runs on 20% of the training labels and on all of
    them, and each fraction gets its own best point, parent metrics and task table row."""
    tracking_uri, client, pretraining_run, grid = sweep_inputs(tmp_path, exported, monkeypatch, ONE_POINT_GRID)
    result = run(SweepOptions(
        source=pretraining_run, tasks=str(sentiment_file(tmp_path / "sentiment.jsonl")), grid=str(grid),
        seeds=(0, 1, 2, 3, 4), label_fractions=(0.2, 1.0), tracking_uri=tracking_uri, storage=str(tmp_path / "ray")))
    table = result.tables.table.set_index("task")
    assert list(table.index) == ["sentiment", "sentiment:0.2"] and table["complete"].all()
    parent = client.get_run(result.run_id)
    assert parent.data.params["label_fractions"] == "0.2,1"
    assert {"best/sentiment:0.2/median", "best/sentiment/median"} <= set(parent.data.metrics)
    notes = client.download_artifacts(result.run_id, "data_notes.txt", str(tmp_path))
    text = Path(notes).read_text()
    assert "sentiment:0.2 (classification, score: accuracy): train 18, dev 10" in text  # 20% of 90 rows
    assert "0.2 of the training labels: 18 of 90 (class-balanced" in text
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{result.run_id}'", max_results=100)
    names = sorted(c.data.tags["cocolm.trial"] for c in children)
    assert len(names) == 10 and names[0] == "sentiment-labels0.2-lr0.001-bs16-ep1-wu0.1-seed0"
    assert {c.data.params["label_fraction"] for c in children} == {"0.2", "1.0"}


@pytest.mark.parametrize("bad", ["0", "1.5", "0.1,0.1", "x", ""])
def test_bad_label_fractions_are_usage_errors(bad, capsys):
    from jobs.finetuning import sweep

    with pytest.raises(SystemExit):
        sweep.main(["--from", "last", "--label-fractions", bad])
    assert "--label-fractions" in capsys.readouterr().err


# ----------------------------------------------------------------------------- an interrupted sweep resumes


def _children(client, parent):
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'", max_results=100)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_an_interrupted_sweep_resumes_its_parent_and_runs_only_the_missing_trials(ray_local, tmp_path, exported,
                                                                                  monkeypatch, capfd):
    """Issue 33: a sweep stopped between trials (Ctrl-C here; a kill -9 leaves its runs RUNNING, as set below)
    is continued by the same command: the same parent, only the trials without a FINISHED child run, and
    the tables over all of them. Other seeds are another sweep; a live command's sweep is not shared."""
    from jobs.cli import UserError
    from jobs.finetuning import sweep
    from jobs.tracking import holding_run

    tracking_uri, client, pretraining_run, grid = sweep_inputs(tmp_path, exported, monkeypatch, ONE_POINT_GRID)
    opts = SweepOptions(source=pretraining_run, tasks=str(sentiment_file(tmp_path / "sentiment.jsonl")),
                        grid=str(grid), seeds=(0, 1, 2), tracking_uri=tracking_uri, storage=str(tmp_path / "ray"))

    monkeypatch.setenv(faults.ENV, json.dumps({"interrupt_after_trials": 1}))  # Ctrl-C once a trial ended
    with pytest.raises(KeyboardInterrupt):
        run(opts)
    monkeypatch.delenv(faults.ENV)
    experiment = client.get_experiment_by_name("finetuning").experiment_id
    [parent] = client.search_runs([experiment], filter_string="tags.kind = 'finetuning-sweep'")
    assert parent.info.status == "KILLED"  # stopped, not broken
    first = _children(client, parent)
    finished = [c for c in first if c.info.status == "FINISHED"]
    assert 1 <= len(finished) < 3 and all(c.info.status in ("FINISHED", "KILLED") for c in first)
    for run_id in [parent.info.run_id, *(c.info.run_id for c in first if c.info.status == "KILLED")]:
        client.update_run(run_id, status="RUNNING")  # what a kill -9 leaves

    other = run(SweepOptions(**{**opts.__dict__, "seeds": (0,)}))  # other seeds: a sweep of its own
    assert other.run_id != parent.info.run_id and other.trials_run == 1
    assert client.get_run(parent.info.run_id).info.status == "RUNNING"  # not touched
    lock = sweep._lock_name(tracking_uri, experiment, parent.data.params)
    with holding_run(opts.storage, lock), pytest.raises(UserError, match="is live"):
        run(opts)  # as if a live command held the sweep: refused, not shared
    capfd.readouterr()

    started = max(c.info.start_time for c in _children(client, client.get_run(other.run_id)))
    result = run(opts)
    assert f"resuming sweep parent {parent.info.run_id} (RUNNING): {len(finished)} of 3 trials already finished" \
        in capfd.readouterr().out
    assert result.run_id == parent.info.run_id and result.trials_run == 3 - len(finished)
    resumed = client.get_run(parent.info.run_id)
    assert resumed.info.status == "FINISHED"
    children = _children(client, resumed)
    assert sum(c.info.start_time > started for c in children) == 3 - len(finished)  # only the missing trials ran
    assert sorted(c.info.status for c in children).count("FINISHED") == 3
    assert all(c.info.status in ("FINISHED", "KILLED") for c in children)  # the stale RUNNING children: KILLED
    scores = {c.data.tags["cocolm.trial"]: c.data.metrics["best.dev.accuracy"] for c in children
              if c.info.status == "FINISHED"}
    summary = result.tables.summary.iloc[0]
    assert summary["complete"] and summary["seeds_done"] == 3 and len(result.tables.trials) == 3
    assert summary["score_median"] == pytest.approx(np.median(list(scores.values())))
    assert sorted(seed_scores(resumed.data.metrics, "sentiment")) == [0, 1, 2]


def test_only_an_unfinished_parent_with_every_identifying_param_the_same_is_resumed(tmp_path):
    """Any of the params that say what a sweep is (tasks, grid, seeds, label fractions, sizes, lr set, the
    pretraining run) differing, or the parent FINISHED, is another sweep: a new parent."""
    from mlflow.tracking import MlflowClient

    from jobs import tracking
    from jobs.finetuning.sweep import SAME_SWEEP, _unfinished_parent
    from jobs.names import KIND_SWEEP, KIND_TAG

    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    experiment = tracking.experiment_id(client, "finetuning", uri)
    params = {"pretraining_run": "abc", "from": "abc", "tasks": "rte", "grid": "quick", "seeds": "0,1,2",
              "label_fractions": "1", "max_train": 0, "max_dev": 0, "max_length": "128", "lr_set": "base",
              "max_failures": 2}

    def parent(status: str, **changed) -> str:
        run_id = client.create_run(experiment, tags={KIND_TAG: KIND_SWEEP}).info.run_id
        tracking.log_params(client, run_id, {**params, **changed})
        if status != "RUNNING":
            client.set_terminated(run_id, status)
        return run_id

    assert _unfinished_parent(client, experiment, params) is None
    parent("FINISHED")
    for key in SAME_SWEEP:
        parent("FAILED", **{key: "other"})
    assert _unfinished_parent(client, experiment, params) is None
    parent("KILLED")
    newest = parent("RUNNING", max_failures=5, **{"from": "last"})  # neither says what the sweep is
    assert _unfinished_parent(client, experiment, params).info.run_id == newest
