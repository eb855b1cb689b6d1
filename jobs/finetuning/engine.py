"""The fine-tuning step engine, one loop for both kinds of trial: the [CLS] (or span) trial of a sweep
(trial.py) and the prompt-based or head-based few-shot trial (fewshot.py).

    train(model, batches, loss, schedule, adamw, device, autocast, evaluate) -> the evaluations' metrics

Each step: forward under bf16 autocast on GPU (fp32 on CPU), the float logits into the trial's loss,
AdamW, the linear warm-up and decay schedule, no gradient clipping. After each planned step it
evaluates dev through the trial's `evaluate`, which says whether this evaluation is the best so far;
the best evaluation's weights are kept and put back at the end, for the test split. A trial brings only
what differs: the model (head), its batches, its loss and its evaluation. Plain PyTorch, no Ray.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from model.step import AdamW, warmup_linear_decay

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]  # the model's arguments, the labels
Evaluate = Callable[[torch.nn.Module, dict[str, float]], bool]  # adds dev scores to the metrics; True if best


@dataclass(frozen=True)
class Schedule:
    """`steps` optimizer steps at peak learning rate `lr`, warmed up linearly over `warmup` steps and then
    decayed linearly to 0; dev is evaluated after each step in `eval_at`."""

    lr: float
    steps: int
    warmup: int
    eval_at: frozenset[int]


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The GPU where there is one (Ray gives a trial only the GPUs it asked for), else the CPU."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def bf16_autocast(device: torch.device, enabled: bool = True) -> torch.autocast:
    """bf16 autocast on GPU, as the paper's mixed precision; CPU runs stay fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda")


def train(model: torch.nn.Module, batches: Iterator[Batch], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
          schedule: Schedule, adamw: AdamW, device: torch.device, autocast: torch.autocast, evaluate: Evaluate,
          keep_best: bool = True, on_eval: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """Train `model` for `schedule.steps` steps of `batches`, evaluating at `schedule.eval_at`; returns each
    evaluation's metrics (`eval`, `step`, `train_loss` since the last one, `lr`, and what `evaluate` added),
    which `on_eval` also gets. With `keep_best`, the model ends with the weights of the best evaluation."""
    model.to(device).train()
    optimizer = adamw.build(model, schedule.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(schedule.warmup, schedule.steps))
    history, losses, best_state = [], [], None
    for step, (args, labels) in enumerate(itertools.islice(batches, schedule.steps), start=1):
        with autocast:
            logits = model(*(a.to(device) for a in args)).float()
        value = loss(logits, labels.to(device))
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        scheduler.step()
        losses.append(value.item())
        if step not in schedule.eval_at:
            continue
        metrics = {"eval": len(history) + 1, "step": step, "train_loss": float(np.mean(losses)),
                   "lr": scheduler.get_last_lr()[0]}
        losses = []
        if evaluate(model, metrics) and keep_best:
            best_state = copy.deepcopy(model.state_dict())
        history.append(metrics)
        if on_eval is not None:
            on_eval(metrics)
    if best_state is not None:
        model.load_state_dict(best_state)
    return history
