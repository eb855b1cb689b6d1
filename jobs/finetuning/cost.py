"""What a sweep will cost on a GPU, estimated from its own data before anything runs (the plan's notes).

Per trial, the encoder's model FLOPs (`model.flops.encoder_forward_flops`, 3x for a training pass): every
epoch's training batches, each padded to its own longest example as `jobs.finetuning.encoding.batches`
pads them (the batches of one fixed shuffle), and `EVALS_PER_EPOCH` forward passes over the dev splits
(batches of `EVAL_BATCH`). The heads and the optimizer are left out. Divided by `MEASURED_RATE`, the FLOP rate the platform's
pretraining step reached on an H200. Fine-tuning's short sequences make smaller matrix products than
that step's 512 tokens, so they run slower: read the hours as a lower bound, an estimate until a sweep
of the task has been timed on the GPU.
"""

from __future__ import annotations

import numpy as np

from model.config import EncoderConfig
from model.flops import encoder_forward_flops

from jobs.finetuning.encoding import EncodedTask
from jobs.finetuning.trial import EVAL_BATCH, EVALS_PER_EPOCH
from jobs.names import fraction_target

# bf16 FLOP/s of the base training step as one CUDA-graph step at 512 tokens on an H200: 24.9% of its
# 989 TFLOP/s peak (docs/measurements/h200-gpu-report-first, docs/design.md section 7.2).
MEASURED_RATE = 0.249 * 989e12
RATE_SOURCE = f"the base pretraining step's measured bf16 rate on an H200, {MEASURED_RATE / 1e12:.0f} TFLOP/s"
SHUFFLE_SEED = 0


def padded_batch_flops(cfg: EncoderConfig, lengths: np.ndarray, batch_size: int, passes: int) -> float:
    """`passes` x the forward FLOPs of `lengths` in batches of `batch_size` (one fixed shuffle), each
    batch padded to its longest sequence."""
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(lengths))
    total = 0.0
    for start in range(0, len(order), batch_size):
        batch = lengths[order[start : start + batch_size]]
        total += len(batch) * encoder_forward_flops(cfg, int(batch.max()))
    return passes * total


def trial_flops(cfg: EncoderConfig, task: EncodedTask, epochs: int, batch_size: int) -> float:
    """Model FLOPs of one trial: `epochs` training passes (3x forward) and the dev evaluations."""
    train = padded_batch_flops(cfg, task.train.lengths(), batch_size, 3 * epochs)
    dev = sum(padded_batch_flops(cfg, split.lengths(), EVAL_BATCH, epochs * EVALS_PER_EPOCH)
              for split in task.dev.values())
    return train + dev


def gpu_hours_line(cfg: EncoderConfig, encoded: dict[str, EncodedTask], points: list[dict], seeds: int) -> str:
    """One line: per target the estimated GPU-hours of all its trials, and the total."""
    hours: dict[str, float] = {}
    flops: dict[tuple, float] = {}  # points that differ only in learning rate or warm-up cost the same
    for point in points:
        target = fraction_target(point["task"], point["label_fraction"])
        shape = (target, point["epochs"], point["batch_size"])
        if shape not in flops:
            flops[shape] = trial_flops(cfg, encoded[target], point["epochs"], point["batch_size"])
        hours[target] = hours.get(target, 0.0) + seeds * flops[shape] / MEASURED_RATE / 3600
    each = ", ".join(f"{target} {gpu_time(h)}" for target, h in hours.items())
    return (f"estimate: {gpu_time(sum(hours.values()))} for the sweep on one GPU ({each}): the encoder's model FLOPs "
            f"on this data at {RATE_SOURCE}; shorter sequences run slower, so a lower bound, not a measurement")


def gpu_time(hours: float) -> str:
    if hours >= 0.1:
        return f"{hours:,.1f} GPU-hours"
    return f"{hours * 60:.0f} GPU-minutes" if hours * 60 >= 1 else "under a GPU-minute"
