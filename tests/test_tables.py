"""jobs.finetuning.tables: trial rows per dev split, failed trials without a score."""

from __future__ import annotations

from types import SimpleNamespace

from jobs.finetuning.tasks.specs import GLUE
from jobs.finetuning.tables import trial_records


def test_mnli_trials_give_an_mnli_m_and_an_mnli_mm_row_and_failures_no_score():
    encoded = {"mnli": SimpleNamespace(spec=GLUE["mnli"][0], test=None)}
    point = {"task": "mnli", "lr": 2e-5, "batch_size": 32, "epochs": 3, "warmup": 0.06}
    ok = SimpleNamespace(config={"point": point, "seed": 0}, error=None, metrics={
        "done": 1, "best.dev_matched.score": 0.8, "best.dev_mismatched.score": 0.7})
    failed = SimpleNamespace(config={"point": point, "seed": 1}, error=RuntimeError("x"), metrics={})
    rows = trial_records([ok, failed], encoded)
    assert [(r["task"], r["seed"], r["score"]) for r in rows[:2]] == [("MNLI-m", 0, 0.8), ("MNLI-mm", 0, 0.7)]
    assert [r["task"] for r in rows[2:]] == ["MNLI-m", "MNLI-mm"] and all(r["score"] != r["score"] for r in rows[2:])
