"""jobs.finetuning.trial: one fine-tuning run as a plain function, seeded, evaluated every half epoch."""

from __future__ import annotations

import dataclasses

from jobs.pretraining.encoders import resolve_encoder
from jobs.finetuning.encoding import encode_task
from jobs.finetuning.tasks.user import read_user_task
from jobs.finetuning.trial import TrialConfig, fine_tune
from helpers import WORDS, sentiment_file


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


def test_the_test_split_is_scored_once_with_the_weights_of_the_best_dev_evaluation(tmp_path, exported):
    """Test holds the dev rows here, so scored with the best dev evaluation's weights it scores exactly the
    best dev score; scored with the last weights it would score the last evaluation's, which is worse."""
    encoded = encode_task(read_user_task(sentiment_file(tmp_path / "sentiment.jsonl")), exported, max_length=32)
    encoded = dataclasses.replace(encoded, test=encoded.dev["dev"])
    result = fine_tune(TrialConfig("sentiment", 3e-3, 16, 3, 0.1, seed=0), encoded,
                       resolve_encoder(str(exported), None, tmp_path))
    best = result.best["dev"]["score"]
    assert result.history[-1]["dev.score"] < best  # the premise: the last evaluation is not the best
    assert result.test["score"] == best and result.flat()["test.accuracy"] == best
