"""The paper's fine-tuning metrics (docs/method.md section 8.2), from scikit-learn and SciPy, with this
platform's conventions for degenerate inputs (a collapsed model scores 0, never NaN)."""

from __future__ import annotations

from collections.abc import Sequence

from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    _same_length(predictions, labels)
    return sum(int(p == y) for p, y in zip(predictions, labels)) / len(labels)


def f1(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (GLUE's MRPC and QQP: 1 = paraphrase / duplicate). 0 when undefined
    (no true positive)."""
    _same_length(predictions, labels)
    # `labels=[positive]` scores that one class whatever else occurs, where average="binary" would
    # refuse predictions of a third class or labels without the positive one.
    return float(f1_score(labels, predictions, labels=[positive], average="micro", zero_division=0.0))


def matthews_corr(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation, in its multi-class form (the usual one for two classes); 0 when a marginal
    is constant (sklearn's convention)."""
    _same_length(predictions, labels)
    return float(matthews_corrcoef(labels, predictions))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; 0 when either side is constant (a collapsed regressor carries no signal),
    where SciPy gives NaN."""
    _same_length(x, y)
    return 0.0 if _constant(x) or _constant(y) else float(pearsonr(x, y).statistic)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman correlation: Pearson on ranks, ties sharing their mean rank; 0 when either side is constant."""
    _same_length(x, y)
    return 0.0 if _constant(x) or _constant(y) else float(spearmanr(x, y).statistic)


def _constant(values: Sequence[float]) -> bool:
    return min(values) == max(values)


def _same_length(a: Sequence, b: Sequence) -> None:
    if len(a) != len(b) or not len(a):
        raise ValueError(f"metrics need two non-empty sequences of one length, got {len(a)} and {len(b)}")


METRICS = {"accuracy": accuracy, "f1": f1, "matthews_corr": matthews_corr, "pearson": pearson, "spearman": spearman}
