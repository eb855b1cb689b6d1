"""The paper's fine-tuning metrics in plain Python (no sklearn / scipy), each tested against hand-computed values."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    _same_length(predictions, labels)
    return sum(int(p == y) for p, y in zip(predictions, labels)) / len(labels)


def f1(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (GLUE's MRPC and QQP: 1 = paraphrase / duplicate). 0 when undefined."""
    _same_length(predictions, labels)
    tp = sum(1 for p, y in zip(predictions, labels) if p == positive and y == positive)
    fp = sum(1 for p, y in zip(predictions, labels) if p == positive and y != positive)
    fn = sum(1 for p, y in zip(predictions, labels) if p != positive and y == positive)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews_corr(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation (the multi-class form, which is the usual one for two classes):
    (c*s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2)), c correct, s total,
    p_k / t_k predicted / true count of class k. 0 when a marginal is constant (sklearn's convention)."""
    _same_length(predictions, labels)
    s = len(labels)
    c = sum(int(p == y) for p, y in zip(predictions, labels))
    p_count, t_count = Counter(predictions), Counter(labels)
    classes = set(p_count) | set(t_count)
    numerator = c * s - sum(p_count[k] * t_count[k] for k in classes)
    denominator = (s * s - sum(v * v for v in p_count.values())) * (s * s - sum(v * v for v in t_count.values()))
    return numerator / math.sqrt(denominator) if denominator else 0.0


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; 0 when either side is constant (a collapsed regressor carries no signal)."""
    _same_length(x, y)
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            out[i] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman correlation: Pearson on ranks, ties averaged."""
    return pearson(ranks(x), ranks(y))


def _same_length(a: Sequence, b: Sequence) -> None:
    if len(a) != len(b) or not len(a):
        raise ValueError(f"metrics need two non-empty sequences of one length, got {len(a)} and {len(b)}")


METRICS = {"accuracy": accuracy, "f1": f1, "matthews_corr": matthews_corr, "pearson": pearson, "spearman": spearman}
