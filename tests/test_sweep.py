"""Fine-tuning: the exported / checkpointed encoder, one trial as a plain function, grids, and a Tune sweep
end to end (2 learning rates x 5 seeds on a user task file) with its MLflow parent and child runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from jobs import faults
from jobs.encoders import encoder_from_checkpoint, resolve_encoder
from jobs.finetune import TrialConfig, fine_tune
from jobs.sweep import SweepOptions, load_grid, parse_seeds, run
from jobs.tasks import encode_task, read_user_task
from model import Encoder, EncoderConfig
from model.classifier import SequenceClassifier, load_encoder
from model.export import export_encoder

WORDS = ["good", "fine", "great", "bad", "poor", "awful"]


def tiny_encoder_config(tokenizer_dir: Path) -> EncoderConfig:
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    return EncoderConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=2, ffn_size=64, embedding_size=32,
                         max_positions=64)


@pytest.fixture(scope="module")
def exported(tokenizer_dir, tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return export_encoder(Encoder(tiny_encoder_config(tokenizer_dir)), tmp_path_factory.mktemp("export") / "encoder",
                          tokenizer_dir=tokenizer_dir)


def sentiment_file(path: Path, n: int = 100) -> Path:
    """A user task: the label is whether the sentence's adjective is positive."""
    rows = [{"text": f"the film was {WORDS[i % 6]} and the story {i}", "label": "pos" if i % 6 < 3 else "neg"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------------- the encoder


def test_load_encoder_reads_the_export_with_our_encoder(exported, tokenizer_dir):
    from safetensors.torch import load_file

    encoder = load_encoder(exported).eval()
    original = Encoder(tiny_encoder_config(tokenizer_dir))
    original.load_state_dict({k.removeprefix("encoder."): v for k, v in load_file(str(exported / "model.safetensors")).items()})
    ids = torch.randint(5, 100, (2, 12))
    torch.testing.assert_close(encoder(ids), original.eval()(ids))
    classifier = SequenceClassifier(encoder, 3)
    assert classifier(ids).shape == (2, 3)
    assert [type(m).__name__ for m in classifier.head.children()] == ["Dropout", "Linear", "Linear"]  # dropout reused


def test_a_checkpoint_dir_gives_its_main_encoder(tmp_path, tokenizer_dir):
    from jobs import checkpoint
    from jobs.checkpoint import TrainState
    from jobs.config import resolve, to_yaml, with_vocab_size
    from jobs.train_loop import build_training

    cfg = resolve("tiny", "cocolm", ["model.hidden_size=32", "model.ffn_size=64", "model.max_positions=64"])
    cfg = with_vocab_size(cfg, tiny_encoder_config(tokenizer_dir).vocab_size)
    model, optimizer, scheduler = build_training(cfg)
    checkpoint.save(tmp_path / "ckpt", model, optimizer, scheduler, TrainState(step=3), to_yaml(cfg), tokenizer_dir)
    source = resolve_encoder(str(tmp_path / "ckpt"), None, tmp_path)
    assert source.preset == "tiny" and source.tokenizer_dir == tmp_path / "ckpt" / "tokenizer"
    for key, value in model.main.state_dict().items():
        torch.testing.assert_close(source.state[key], value)
    assert encoder_from_checkpoint(tmp_path / "ckpt").cfg == model.main.cfg


# ----------------------------------------------------------------------------- one trial, no Ray


def test_one_trial_evaluates_every_half_epoch_and_is_seeded(tmp_path, exported):
    task = read_user_task(sentiment_file(tmp_path / "sentiment.jsonl"))
    encoded = encode_task(task, exported, max_length=32)
    encoder = resolve_encoder(str(exported), None, tmp_path)
    cfg = TrialConfig(task="sentiment", lr=1e-3, batch_size=16, epochs=2, warmup=0.1, seed=3)
    seen = []
    first = fine_tune(cfg, encoded, encoder, on_eval=seen.append)
    assert [h["step"] for h in first.history] == [3, 6, 9, 12]  # 90 rows / 16 = 6 steps per epoch
    assert [h["epoch"] for h in first.history] == [0.5, 1.0, 1.5, 2.0] and seen == first.history
    best = max(h["dev.score"] for h in first.history)
    assert first.best["dev"]["score"] == best and first.flat()["best.dev.accuracy"] == best
    again = fine_tune(cfg, encoded, encoder)
    assert again.history == first.history  # same seed, same run
    other = fine_tune(TrialConfig("sentiment", 1e-3, 16, 2, 0.1, seed=4), encoded, encoder)
    assert other.history[0]["train_loss"] != first.history[0]["train_loss"]


def test_a_regression_trial_reports_spearman_and_pearson(tmp_path, exported):
    path = tmp_path / "scores.csv"
    path.write_text("text,text_pair,label\n" + "".join(f"a {WORDS[i % 6]},b {i},{(i % 6) / 2.5:.2f}\n" for i in range(60)))
    task = read_user_task(path)
    assert task.spec.kind == "regression"
    result = fine_tune(TrialConfig("scores", 1e-3, 16, 1, 0.1, 0), encode_task(task, exported, 32),
                       resolve_encoder(str(exported), None, tmp_path))
    assert set(result.best["dev"]) >= {"spearman", "pearson", "score"} and len(result.history) == 2


# ----------------------------------------------------------------------------- grids


def test_the_paper_grid_is_table_7():
    grid = load_grid("paper")
    assert grid.max_length == 512
    assert len(grid.points("cola")) == 4 * 4 * 2 * 2 and len(grid.points("mnli")) == 3 * 4
    assert {p["lr"] for p in grid.points("rte", "large++")} == {7e-6, 1e-5, 2e-5, 3e-5}
    assert {p["lr"] for p in grid.points("qqp", "large++")} == {5e-6, 7e-6, 1e-5, 2e-5}
    assert {p["lr"] for p in grid.points("sst-2", "base")} == {1e-5, 2e-5, 3e-5, 4e-5}
    assert {p["warmup"] for p in grid.points("sts-b")} == {0.06, 0.1} and {p["batch_size"] for p in grid.points("qnli")} == {32}
    assert load_grid("paper").space("my-own-task") == grid.spaces["small"]
    quick = load_grid("quick")
    assert quick.max_length <= 128 and 0 < quick.max_train <= 10_000 and len(quick.points("snli")) * 5 <= 20


def test_grid_errors_name_the_key(tmp_path):
    (tmp_path / "g.yaml").write_text("spaces: {s: {epochs: [1], lr: [1e-3], batch_size: [8], warmup: [0.1], lrs: [1]}}\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['lrs'\]"):
        load_grid(str(tmp_path / "g.yaml"))
    with pytest.raises(ValueError, match="unknown grid 'nope'"):
        load_grid("nope")
    assert parse_seeds("5") == (0, 1, 2, 3, 4) and parse_seeds("1,7") == (1, 7)


@pytest.mark.parametrize("bad", [",", "abc", "0", "1,x", "2,2", "3,-1"])
def test_bad_seed_lists_are_usage_errors_before_anything_starts(bad, capsys, monkeypatch):
    """`--seeds ","` used to create an MLflow parent run and crash inside Ray Tune; `abc` gave a bare
    int() error. Now argparse stops with the flag's name; nothing is started."""
    from jobs import sweep

    monkeypatch.setattr(sweep, "run", lambda opts: pytest.fail("the sweep must not start"))
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--from", "last", "--seeds", bad])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--seeds" in err and "expected a seed count" in err
    with pytest.raises(ValueError, match="no seeds|distinct non-negative"):
        SweepOptions(source="last", seeds=())


def test_mnli_trials_give_an_mnli_m_and_an_mnli_mm_row_and_failures_no_score():
    from types import SimpleNamespace

    from jobs.sweep import trial_records
    from jobs.tasks import GLUE

    encoded = {"mnli": SimpleNamespace(spec=GLUE["mnli"][0], test=None)}
    point = {"task": "mnli", "lr": 2e-5, "batch_size": 32, "epochs": 3, "warmup": 0.06}
    ok = SimpleNamespace(config={"point": point, "seed": 0}, error=None, metrics={
        "done": 1, "best.dev_matched.score": 0.8, "best.dev_mismatched.score": 0.7})
    failed = SimpleNamespace(config={"point": point, "seed": 1}, error=RuntimeError("x"), metrics={})
    rows = trial_records([ok, failed], encoded)
    assert [(r["task"], r["seed"], r["score"]) for r in rows[:2]] == [("MNLI-m", 0, 0.8), ("MNLI-mm", 0, 0.7)]
    assert [r["task"] for r in rows[2:]] == ["MNLI-m", "MNLI-mm"] and all(r["score"] != r["score"] for r in rows[2:])


def test_learning_rate_list_follows_the_pretraining_preset():
    from jobs.sweep import _lr_set

    grid = load_grid("paper")
    assert _lr_set(grid, None, "large++") == "large++" and _lr_set(grid, None, "tiny") == "base"
    assert _lr_set(grid, "base", "large++") == "base"
    with pytest.raises(ValueError, match="--lr-set 'huge'"):
        _lr_set(grid, "huge", "")


# ----------------------------------------------------------------------------- the sweep on Ray Tune


@pytest.mark.timeout(420)
def test_sweep_end_to_end_with_retries_incomplete_points_and_mlflow(ray_local, tmp_path, exported, monkeypatch,
                                                                   capfd):
    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri)
    # A pretraining run holding the exported encoder, as jobs.pretrain leaves it.
    from jobs.tracking import experiment_id

    pretraining = client.create_run(experiment_id(client, "pretraining", tracking_uri), run_name="tiny")
    client.log_artifacts(pretraining.info.run_id, str(exported), "encoder")
    client.log_param(pretraining.info.run_id, "preset", "tiny")
    client.set_terminated(pretraining.info.run_id)
    grid = tmp_path / "two_lrs.yaml"
    grid.write_text("max_length: 32\nspaces:\n  t: {epochs: [1], lr: [1.0e-3, 3.0e-3], batch_size: [16], warmup: [0.1]}\n"
                    "tasks: {default: t}\n")
    monkeypatch.setenv(faults.ENV, json.dumps({"trials": {
        "sentiment-lr0.001-bs16-ep1-wu0.1-seed1": 1,  # fails once, the retry succeeds
        "sentiment-lr0.003-bs16-ep1-wu0.1-seed3": 2}}))  # fails every allowed attempt
    result = run(SweepOptions(
        source=pretraining.info.run_id, tasks=str(sentiment_file(tmp_path / "sentiment.jsonl")), grid=str(grid),
        seeds=(0, 1, 2, 3, 4), tracking_uri=tracking_uri, max_failures=1, storage=str(tmp_path / "ray"),
    ))
    summary = result.summary.set_index("lr")
    assert summary.loc[1e-3, "complete"] and summary.loc[1e-3, "seeds_done"] == 5
    assert not summary.loc[3e-3, "complete"] and summary.loc[3e-3, "missing_seeds"] == "3"
    assert result.best.iloc[0]["lr"] == 1e-3  # the incomplete point cannot win
    assert "incomplete: 4/5 seeds (missing 3)" in result.markdown and "| sentiment | accuracy |" in result.markdown
    out = capfd.readouterr()
    assert "TensorBoard" not in out.out + out.err and "Failed to fetch metrics" not in out.out + out.err
    assert len(list((tmp_path / "ray").glob("sweep-*/*/result.json"))) >= 10  # Tune's own result files remain

    parent = client.get_run(result.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["cocolm.pretraining_run"] == pretraining.info.run_id
    assert parent.data.params["pretraining_run"] == pretraining.info.run_id and parent.data.params["lr_set"] == "base"
    assert parent.data.metrics["best/sentiment/median"] == pytest.approx(summary.loc[1e-3, "score_median"])
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


def test_from_last_picks_the_newest_finished_pretraining_run(tmp_path):
    from jobs.encoders import latest_pretraining_run

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(ValueError, match="no finished run"):
        latest_pretraining_run(client)
    experiment = client.create_experiment("pretraining", artifact_location=(tmp_path / "art").as_uri())
    older, newer, running = (client.create_run(experiment).info.run_id for _ in range(3))
    for run_id in (older, newer):
        time.sleep(0.01)
        client.set_terminated(run_id, "FINISHED")
    assert latest_pretraining_run(client) == newer
