"""MLflow names: one definition, and key builders whose output the readers parse back."""

from __future__ import annotations

import ast
from pathlib import Path

from jobs import names

ROOT = Path(__file__).resolve().parents[1]


def test_the_best_task_key_round_trips_and_nothing_else_matches():
    for task in ("snli", "mnli-m", "sentiment/v2"):
        assert names.best_task(names.best_task_metric(task, "median")) == task
    for key in ("best//median", "best/snli/min", "glue_avg", "best.dev.score", "xbest/snli/median"):
        assert names.best_task(key) is None, key
    assert names.best_split_metric("dev", "accuracy") == "best.dev.accuracy"


def test_every_tag_is_defined_once_and_spelled_nowhere_else():
    """A tag's string appears as a literal only in jobs/names.py among the job and analysis modules."""
    tags = {value for key, value in vars(names).items() if key.endswith("_TAG") or key.startswith("KIND_")}
    tags -= {"kind"}  # a common word: Ray Data columns and task kinds use it too
    for path in [*ROOT.glob("jobs/**/*.py"), *ROOT.glob("analysis/*.py")]:
        if path.name == "names.py":
            continue
        literals = {node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)}
        assert not tags & literals, f"{path.name} spells {tags & literals} instead of importing jobs.names"


def test_a_label_fraction_target_round_trips_and_all_the_labels_keep_the_plain_name():
    assert names.fraction_target("SNLI", 1.0) == "SNLI" and names.split_fraction("SNLI") == ("SNLI", 1.0)
    assert names.fraction_target("MNLI-m", 0.01) == "MNLI-m:0.01"
    assert names.split_fraction("MNLI-m:0.01") == ("MNLI-m", 0.01)
    assert names.split_fraction(names.fraction_target("SQuAD 2.0", 0.2)) == ("SQuAD 2.0", 0.2)
    assert names.split_fraction("odd:name") == ("odd:name", 1.0)  # a user task named with a colon is not a fraction
