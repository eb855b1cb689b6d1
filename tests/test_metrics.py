"""jobs.finetuning.tasks.metrics (scikit-learn and SciPy under this platform's conventions), against
hand-computed values."""

from __future__ import annotations

import math

import pytest

from jobs.finetuning.tasks.metrics import accuracy, f1, matthews_corr, pearson, spearman


def test_accuracy_and_f1():
    predictions, labels = [0, 1, 1, 0, 1], [0, 1, 0, 0, 0]
    assert accuracy(predictions, labels) == pytest.approx(3 / 5)
    # tp = 1 (index 1), fp = 2 (indices 2, 4), fn = 0: F1 = 2 / (2 + 2 + 0)
    assert f1(predictions, labels) == pytest.approx(0.5)
    assert f1([0, 0], [1, 0]) == 0.0  # no true positive
    assert f1([0, 0], [0, 0]) == 0.0  # no positive at all: undefined, 0 (sklearn would warn and say 0 too)
    # A third class predicted (a head with more outputs than the task's two labels): still the F1 of
    # class 1, tp 1, fp 0, fn 1: 2 / (2 + 0 + 1)
    assert f1([1, 2, 0], [1, 1, 0]) == pytest.approx(2 / 3)


def test_matthews_binary_multiclass_and_degenerate():
    # tp 3, fp 1, tn 3, fn 1: (3*3 - 1*1) / sqrt(4*4*4*4) = 8 / 16
    assert matthews_corr([1, 1, 1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1, 1, 0]) == pytest.approx(0.5)
    # 3 classes: c=2, s=4, p=(2,1,1), t=(1,2,1): (2*4 - 5) / sqrt((16-6)(16-6)) = 3/10
    assert matthews_corr([0, 1, 2, 0], [0, 1, 1, 2]) == pytest.approx(0.3)
    assert matthews_corr([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0  # constant predictions: 0 by convention
    assert matthews_corr([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)


def test_pearson_and_spearman_with_ties():
    # x mean 2.5, y mean 5: sxy 11, sxx 5, syy 26
    assert pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(130))
    # ranks (1, 2.5, 2.5, 4) vs (1, 3, 2, 4): sxy 4.5, sxx 4.5, syy 5
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    # ranks (3, 1, 3, 3) vs (1, 2, 3, 4), both of mean 2.5: sxy -0.75 + 0.75 + 0.25 + 0.75 = 1, sxx 3, syy 5
    assert spearman([3.0, 1.0, 3.0, 3.0], [1, 2, 3, 4]) == pytest.approx(1 / math.sqrt(15))
    assert spearman([1, 2, 3], [1, 8, 27]) == pytest.approx(1.0)


def test_a_constant_side_correlates_zero_not_nan():
    """A collapsed regressor predicts one value: SciPy says NaN, which would poison a median; we say 0."""
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0 and pearson([1, 2, 3], [2, 2, 2]) == 0.0
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0
    with pytest.raises(ValueError, match="non-empty sequences of one length"):
        pearson([1, 2], [1, 2, 3])
