"""What each task is: GLUE's eight (docs/method.md section 7.5), SNLI, SQuAD 2.0 and the spec of a user's task."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobs.cli import UserError
from jobs.finetuning.tasks.metrics import METRICS


@dataclass(frozen=True)
class TaskSpec:
    """What a task is: its label set, its metrics and which of them is its score."""

    name: str  # lower case key: mnli, sts-b, snli, or a user task's file stem
    display: str  # as in the paper's tables: MNLI, STS-B, ...
    kind: str  # classification | regression | span (extractive question answering)
    labels: tuple[str, ...]  # label strings in id order; () for regression and span
    metrics: tuple[str, ...]  # keys of METRICS (SPAN_METRICS for span), all computed at every evaluation
    score: str  # the one of `metrics` that ranks grid points and enters the averages
    dev_splits: tuple[str, ...] = ("dev",)
    targets: tuple[str, ...] = ()  # display name of each dev split's score (MNLI-m, MNLI-mm); default display

    def __post_init__(self) -> None:
        if self.kind not in ("classification", "regression", "span"):
            raise UserError(f"task {self.name}: kind must be classification, regression or span, not {self.kind!r}")
        known = SPAN_METRICS if self.kind == "span" else METRICS
        if self.score not in self.metrics or not set(self.metrics) <= set(known):
            raise UserError(f"task {self.name}: metrics {self.metrics} must be among {sorted(known)} "
                             f"and include the score {self.score!r}")
        if self.kind == "classification" and len(self.labels) < 2:
            raise UserError(f"task {self.name}: classification needs at least two labels, got {self.labels}")

    @property
    def num_outputs(self) -> int:
        return len(self.labels) if self.kind == "classification" else 1

    def target(self, dev_split: str) -> str:
        """The name a dev split's score goes by in tables: MNLI's two dev sets are two columns."""
        return self.targets[self.dev_splits.index(dev_split)] if self.targets else self.display


# A span task's metrics: our names (fractions, as every score here) for the keys of the official
# SQuAD 2.0 evaluation (percentages; squad_eval.py). `best_*` are at the no-answer
# threshold that is best on the evaluated set itself, so they are tabled, never the score.
SPAN_METRICS = {"f1": "f1", "exact": "exact", "has_ans_f1": "HasAns_f1", "has_ans_exact": "HasAns_exact",
                "no_ans_f1": "NoAns_f1", "no_ans_exact": "NoAns_exact", "best_f1": "best_f1",
                "best_exact": "best_exact"}


def evaluate(spec: TaskSpec, predictions: Sequence, labels: Sequence) -> dict[str, float]:
    """Every metric of the task, plus `score` (the task's paper metric)."""
    out = {name: float(METRICS[name](list(predictions), list(labels))) for name in spec.metrics}
    out["score"] = out[spec.score]
    return out


@dataclass(frozen=True)
class GlueFormat:
    """Where a GLUE task's TSV keeps its fields: header column names, or indices for header-less CoLA."""

    folder: str
    text: str | int
    label: str | int
    text_pair: str | int | None = None
    header: bool = True
    dev_files: tuple[str, ...] = ("dev.tsv",)
    hub_config: str = ""  # nyu-mll/glue configuration name
    hub_fields: tuple[str, str | None] = ("sentence", None)
    hub_dev: tuple[str, ...] = ("validation",)


_BINARY = ("0", "1")
_NLI3 = ("contradiction", "entailment", "neutral")  # GLUE MNLI's label order
_NLI2 = ("entailment", "not_entailment")

# The paper (Table 1 caption): Spearman for STS-B, Matthews for CoLA, accuracy for the rest. So
# MRPC's and QQP's score is accuracy; their F1 is computed, logged and tabled beside it.
GLUE: dict[str, tuple[TaskSpec, GlueFormat]] = {
    "mnli": (
        TaskSpec("mnli", "MNLI", "classification", _NLI3, ("accuracy",), "accuracy",
                 dev_splits=("dev_matched", "dev_mismatched"), targets=("MNLI-m", "MNLI-mm")),
        GlueFormat("MNLI", "sentence1", "gold_label", "sentence2", dev_files=("dev_matched.tsv", "dev_mismatched.tsv"),
                   hub_config="mnli", hub_fields=("premise", "hypothesis"),
                   hub_dev=("validation_matched", "validation_mismatched")),
    ),
    "qqp": (
        TaskSpec("qqp", "QQP", "classification", _BINARY, ("accuracy", "f1"), "accuracy"),
        GlueFormat("QQP", "question1", "is_duplicate", "question2", hub_config="qqp",
                   hub_fields=("question1", "question2")),
    ),
    "qnli": (
        TaskSpec("qnli", "QNLI", "classification", _NLI2, ("accuracy",), "accuracy"),
        GlueFormat("QNLI", "question", "label", "sentence", hub_config="qnli", hub_fields=("question", "sentence")),
    ),
    "sst-2": (
        TaskSpec("sst-2", "SST-2", "classification", _BINARY, ("accuracy",), "accuracy"),
        GlueFormat("SST-2", "sentence", "label", hub_config="sst2"),
    ),
    "cola": (
        TaskSpec("cola", "CoLA", "classification", _BINARY, ("matthews_corr", "accuracy"), "matthews_corr"),
        # No header: source, label, original label (* or empty), sentence.
        GlueFormat("CoLA", 3, 1, header=False, hub_config="cola"),
    ),
    "rte": (
        TaskSpec("rte", "RTE", "classification", _NLI2, ("accuracy",), "accuracy"),
        GlueFormat("RTE", "sentence1", "label", "sentence2", hub_config="rte", hub_fields=("sentence1", "sentence2")),
    ),
    "mrpc": (
        TaskSpec("mrpc", "MRPC", "classification", _BINARY, ("accuracy", "f1"), "accuracy"),
        GlueFormat("MRPC", "#1 String", "Quality", "#2 String", hub_config="mrpc",
                   hub_fields=("sentence1", "sentence2")),
    ),
    "sts-b": (
        TaskSpec("sts-b", "STS-B", "regression", (), ("spearman", "pearson"), "spearman"),
        GlueFormat("STS-B", "sentence1", "score", "sentence2", hub_config="stsb", hub_fields=("sentence1", "sentence2")),
    ),
}
GLUE_ALIASES = {"sst2": "sst-2", "stsb": "sts-b", "sts": "sts-b"}

SNLI = TaskSpec("snli", "SNLI", "classification", ("contradiction", "entailment", "neutral"), ("accuracy",),
                "accuracy")

# Paper Table 1 reports SQuAD 2.0 EM and F1; F1 ranks grid points, EM is tabled beside it.
SQUAD_V2 = TaskSpec("squad_v2", "SQuAD 2.0", "span", (), tuple(SPAN_METRICS), "f1")
