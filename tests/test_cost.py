"""The GPU-hours a sweep's plan estimates (jobs.finetuning.cost), against the FLOPs counted by hand."""

import numpy as np
import pytest

from jobs.finetuning.cost import MEASURED_RATE, gpu_hours_line, gpu_time, padded_batch_flops, trial_flops
from jobs.finetuning.encoding import EncodedTask, ragged
from jobs.finetuning.tasks.specs import SNLI
from jobs.finetuning.trial import EVAL_BATCH, EVALS_PER_EPOCH
from model.config import EncoderConfig

CFG = EncoderConfig(vocab_size=100, hidden_size=8, num_layers=2, num_heads=2, ffn_size=32, max_positions=64,
                    embedding_size=8)


def forward(t: int) -> float:
    """Two layers of H 8, F 32 at T tokens: QKV, output and FFN matmuls, then Q K^T and the weighted sum."""
    return 2 * (2 * t * (4 * 8 * 8 + 2 * 8 * 32) + 4 * t * t * 8)


def split(lengths: list[int]):
    return ragged([[1] * n for n in lengths], np.zeros(len(lengths), dtype=np.int64))


def test_a_batch_costs_its_longest_sequence_times_its_size():
    lengths = np.array([3, 5, 2, 7])
    assert padded_batch_flops(CFG, lengths, 4, 1) == 4 * forward(7)  # one batch, padded to 7
    assert padded_batch_flops(CFG, lengths, 1, 1) == sum(forward(n) for n in lengths)  # no padding
    two = padded_batch_flops(CFG, lengths, 2, 3)  # a fixed shuffle: padding costs something, never below none
    assert 3 * sum(forward(n) for n in lengths) < two < 3 * 4 * forward(7)


def test_a_trial_trains_three_passes_an_epoch_and_evaluates_the_dev_splits():
    task = EncodedTask(SNLI, split([4] * 6), {"dev": split([2] * 3)}, None, 0, 64)
    epochs = 2
    expected = 3 * epochs * 6 * forward(4) + epochs * EVALS_PER_EPOCH * 3 * forward(2)
    assert EVAL_BATCH >= 3 and trial_flops(CFG, task, epochs, 2) == pytest.approx(expected)


def test_the_line_sums_each_targets_points_and_seeds_in_gpu_time():
    task = EncodedTask(SNLI, split([4] * 6), {"dev": split([2] * 3)}, None, 0, 64)
    points = [{"task": "snli", "epochs": 1, "batch_size": 2, "label_fraction": 1.0, "lr": lr} for lr in (1e-5, 2e-5)]
    hours = 2 * 5 * trial_flops(CFG, task, 1, 2) / MEASURED_RATE / 3600
    line = gpu_hours_line(CFG, {"snli": task}, points, seeds=5)
    assert line.startswith(f"estimate: {gpu_time(hours)} for the sweep on one GPU (snli {gpu_time(hours)})")
    assert "lower bound, not a measurement" in line
    assert (gpu_time(12.345), gpu_time(0.075), gpu_time(0.001)) == (
        "12.3 GPU-hours", "4 GPU-minutes", "under a GPU-minute")
