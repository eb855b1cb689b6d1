"""jobs.finetuning.tasks.specs: each task scores with the paper metric."""

from __future__ import annotations

import pytest

from jobs.finetuning.tasks.specs import GLUE, evaluate


def test_task_scores_follow_the_paper():
    assert GLUE["cola"][0].score == "matthews_corr"
    assert GLUE["sts-b"][0].score == "spearman" and "pearson" in GLUE["sts-b"][0].metrics
    for name in ("mrpc", "qqp"):  # paper Table 1: accuracy for the rest; F1 tabled beside it
        assert GLUE[name][0].score == "accuracy" and "f1" in GLUE[name][0].metrics
    result = evaluate(GLUE["mrpc"][0], [0, 1, 1, 0, 1], [0, 1, 0, 0, 0])
    assert result == pytest.approx({"accuracy": 0.6, "f1": 0.5, "score": 0.6})
