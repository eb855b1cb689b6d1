"""One few-shot trial: plain PyTorch, callable without Ray (`few_shot`), run by Ray Tune in the few-shot job
(`tune_trial`, in a trial actor: this module stays light, see `actor.py`).

A trial is one (method, learning rate, k-shot split) of `jobs/finetuning/fewshot.py`: `cfg.steps` optimizer
steps through the sweep's step engine (`engine.py`), dev accuracy every `cfg.eval_every` steps, and the best
evaluation's weights scored on test. `SplitData` is one split's data in both methods' forms, as the driver
puts it in Ray's object store.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import torch
import torch.nn.functional as F
from ray import tune

from model.classifier import SequenceClassifier
from model.step import AdamW

from jobs.pretraining.pretrained import PretrainedEncoder
from jobs.finetuning.encoding import EncodedSplit, batches
from jobs.finetuning.engine import Batch, Schedule, bf16_autocast, pick_device, train
from jobs.finetuning.prompts import PromptClassifier, PromptData, prompt_input, sample_demos

EVAL_BATCH = 64


@dataclass(frozen=True)
class SplitData:
    """One (task, data seed): the k-shot train and dev sets and the test set, in both methods' forms."""

    task: str
    seed: int
    prompt: dict[str, PromptData] | None  # train, dev, test; None when prompts do not apply
    head: dict[str, EncodedSplit]  # train, dev, test in the [CLS] format
    pad_id: int
    num_classes: int
    notes: tuple[str, ...] = ()  # label words scored by their first token


@dataclass(frozen=True)
class FewShotConfig:
    method: str
    lr: float
    steps: int = 1000
    batch_size: int = 8
    eval_every: int = 100
    max_length: int = 256
    adamw: AdamW = field(default_factory=AdamW)  # (0.9, 0.98), eps 1e-6, weight decay 0.01, as the sweep's


def few_shot(cfg: FewShotConfig, data: SplitData, encoder: PretrainedEncoder,
             on_eval: Callable[[dict[str, float]], None] | None = None, device: str | None = None) -> dict[str, float]:
    """Train `cfg.steps` steps (linear decay, no warm-up, as LM-BFF), evaluate dev every `eval_every` steps,
    score test with the best dev evaluation's weights. Seeded by the data seed."""
    started = time.perf_counter()
    device = pick_device(device)
    autocast = bf16_autocast(device)
    torch.manual_seed(data.seed)
    rng = random.Random(data.seed)
    model, inputs = _method(cfg, data, encoder)
    schedule = Schedule(cfg.lr, cfg.steps, 0, frozenset([*range(cfg.eval_every, cfg.steps + 1, cfg.eval_every),
                                                         cfg.steps]))
    best = {"dev_accuracy": -1.0}

    def on_dev(model: torch.nn.Module, metrics: dict[str, float]) -> bool:
        dev = accuracy(model, inputs, "dev", len(data.head["dev"]), device, autocast)
        improved = dev > best["dev_accuracy"]
        if improved:
            best.update(dev_accuracy=dev, best_step=metrics["step"])
        metrics.update({"dev.accuracy": dev, "best.dev.accuracy": best["dev_accuracy"]})
        return improved

    train(model, _draws(inputs, len(data.head["train"]), cfg.batch_size, rng), F.cross_entropy, schedule, cfg.adamw,
          device, autocast, on_dev, on_eval=on_eval)
    test = accuracy(model, inputs, "test", len(data.head["test"]), device, autocast)
    return {**best, "test_accuracy": test, "seconds": time.perf_counter() - started}


def _draws(inputs, n_train: int, batch_size: int, rng: random.Random) -> Iterator[Batch]:
    """Training batches without end: shuffled epochs of the k-shot training set, run on across epochs."""
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            order += rng.sample(range(n_train), n_train)
        rows, order = order[:batch_size], order[batch_size:]
        yield inputs("train", rows, rng)


def _method(cfg: FewShotConfig, data: SplitData, encoder: PretrainedEncoder):
    """The model and `inputs(split, rows, rng) -> (model arguments, labels)` of a method."""
    if cfg.method == "head":
        model = SequenceClassifier(encoder.build(), data.num_classes)

        def head_inputs(split: str, rows: list[int], rng) -> tuple[tuple, torch.Tensor]:
            ids, labels = next(batches(data.head[split], np.asarray(rows), len(rows), data.pad_id))
            return (ids, ids != data.pad_id), labels
        return model, head_inputs
    encoder_module, head = encoder.build_with_lm_head()
    prompts = data.prompt
    model = PromptClassifier(encoder_module, head, prompts["train"].label_ids)

    def prompt_inputs(split: str, rows: list[int], rng) -> tuple[tuple, torch.Tensor]:
        built = []
        for i in rows:  # training draws new demonstrations each time; evaluation a fixed set per example
            demo_rng = rng if split == "train" else random.Random(data.seed * 1_000_003 + i)
            demos = sample_demos(prompts["train"], demo_rng, exclude=i if split == "train" else None)
            built.append(prompt_input(prompts[split], i, demos, prompts["train"], cfg.max_length))
        ids = torch.full((len(built), max(len(b[0]) for b in built)), data.pad_id, dtype=torch.long)
        for j, (seq, _) in enumerate(built):
            ids[j, : len(seq)] = torch.tensor(seq)
        positions = torch.tensor([p for _, p in built])
        return (ids, ids != data.pad_id, positions), torch.from_numpy(prompts[split].labels[rows])
    return model, prompt_inputs


@torch.no_grad()
def accuracy(model, inputs, split: str, n: int, device, autocast) -> float:
    model.eval()
    correct = 0
    for start in range(0, n, EVAL_BATCH):
        args, labels = inputs(split, list(range(start, min(n, start + EVAL_BATCH))), None)
        with autocast:
            predicted = model(*(a.to(device) for a in args)).argmax(-1).cpu()
        correct += int((predicted == labels).sum())
    model.train()
    return correct / n


# ----------------------------------------------------------------------------- in a Tune actor


def trial_name(config: dict[str, Any]) -> str:
    t = config["trial"]
    return f"{t['task']}-{t['method']}-lr{t['lr']:g}-split{t['split']}"


def tune_trial(config: dict[str, Any], data: dict[str, ray.ObjectRef], encoder: PretrainedEncoder,
               settings: dict[str, Any]) -> None:
    """One few-shot trial in a Tune actor; `settings` are the options every trial shares (steps, ...)."""
    t = config["trial"]
    cfg = FewShotConfig(t["method"], t["lr"], **settings)
    result = few_shot(cfg, ray.get(data[f"{t['task']}/{t['split']}"]), encoder, on_eval=tune.report)
    tune.report({"done": 1, "best.dev.score": result["dev_accuracy"], "test.accuracy": result["test_accuracy"],
                 "best_step": result["best_step"], "trial_seconds": result["seconds"]})
