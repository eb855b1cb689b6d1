"""One fine-tuning trial: plain PyTorch, callable without Ray (`fine_tune`), run by Ray Tune in a sweep
(`tune_trial`, in a trial actor: this module stays light, see `actor.py`).

A trial is one (task, lr, batch size, epochs, warm-up, seed) (docs/method.md section 7.2): the pretrained main
encoder plus the [CLS] head (the start/end head for SQuAD 2.0, section 7.6), AdamW (0.9, 0.98), eps 1e-6, weight decay 0.01, linear warm-up then
linear decay to 0, no gradient clipping, dropout 0.1; dev is evaluated every half epoch and the best
evaluation is kept (per dev set: MNLI-m and MNLI-mm each keep their own best). A task with a test
split (SNLI) is scored on it once, with the weights of the best evaluation on its first dev set.
The same seed gives the same result: it seeds the head, dropout and the shuffling.

The loop itself is engine.py's, shared with the few-shot trial; this module brings the head, the
loss, the batches and the scoring. The encoder comes from encoders.py (`resolve_encoder`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import ray
import torch
import torch.nn.functional as F
from ray import tune

from model import Encoder
from model.classifier import SequenceClassifier, SpanExtractor
from model.step import AdamW

from jobs.pretraining.pretrained import PretrainedEncoder
from jobs.finetuning.encoding import EncodedSplit, EncodedTask, batches
from jobs.finetuning.engine import Batch, Schedule, bf16_autocast, pick_device, train
from jobs.finetuning.grid import data_key
from jobs.finetuning.tasks.specs import SPAN_METRICS, TaskSpec, evaluate
from jobs.finetuning.tasks.squad_eval import evaluate as squad_evaluate
from jobs.finetuning.tasks.squad_windows import best_answers
from jobs.names import best_split_metric

EVAL_BATCH = 128
EVALS_PER_EPOCH = 2  # dev evaluations per epoch (the best is kept)


@dataclass(frozen=True)
class TrialConfig:
    task: str
    lr: float
    batch_size: int
    epochs: int
    warmup: float  # fraction of the total optimizer steps spent warming up
    seed: int
    adamw: AdamW = field(default_factory=AdamW)  # (0.9, 0.98), eps 1e-6, weight decay 0.01
    dropout: float = 0.1  # head dropout; the encoder keeps its own config's (0.1)
    evals_per_epoch: int = EVALS_PER_EPOCH
    bf16: bool = True  # autocast on GPU; CPU runs fp32


@dataclass
class TrialResult:
    best: dict[str, dict[str, float]]  # dev split -> its metrics at its best evaluation (+ "eval", "epoch")
    test: dict[str, float] | None
    history: list[dict[str, float]] = field(default_factory=list)  # one entry per evaluation
    steps: int = 0
    seconds: float = 0.0

    def flat(self) -> dict[str, float]:
        """`best.<split>.<metric>` and `test.<metric>` keys, as the trial reports them."""
        out = {best_split_metric(split, k): v for split, metrics in self.best.items() for k, v in metrics.items()}
        out.update({f"test.{k}": v for k, v in (self.test or {}).items()})
        return out


# ----------------------------------------------------------------------------- head, loss, scores


def build_model(spec: TaskSpec, encoder: Encoder, dropout: float) -> torch.nn.Module:
    return SpanExtractor(encoder) if spec.kind == "span" else SequenceClassifier(encoder, spec.num_outputs, dropout)


def task_loss(spec: TaskSpec, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over classes, squared error for regression, and for a span task the mean of the
    start and the end position's cross-entropy over the window's positions (BERT's SQuAD loss)."""
    if spec.kind == "span":
        return (F.cross_entropy(logits[..., 0], labels[:, 0]) + F.cross_entropy(logits[..., 1], labels[:, 1])) / 2
    return F.mse_loss(logits[:, 0], labels) if spec.kind == "regression" else F.cross_entropy(logits, labels)


@torch.no_grad()
def outputs(model: torch.nn.Module, split: EncodedSplit, pad_id: int, device: torch.device,
            autocast) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """(example indices, float logits on the CPU) in batches of similar lengths, which pad little."""
    model.eval()
    order = np.argsort(split.lengths(), kind="stable")
    position = 0
    for ids, _ in batches(split, order, EVAL_BATCH, pad_id):
        with autocast:
            logits = model(ids.to(device), (ids != pad_id).to(device)).float()
        yield order[position : position + len(ids)], logits.cpu()
        position += len(ids)
    model.train()


def predict(model: SequenceClassifier, split: EncodedSplit, pad_id: int, device: torch.device,
            regression: bool, autocast) -> np.ndarray:
    """Predicted class ids (or values) in the split's order."""
    out = np.empty(len(split), dtype=np.float64 if regression else np.int64)
    for rows, logits in outputs(model, split, pad_id, device, autocast):  # logits (B, C)
        out[rows] = (logits[:, 0] if regression else logits.argmax(-1)).numpy()
    return out


def predict_answers(model: SpanExtractor, split: EncodedSplit, pad_id: int, device: torch.device,
                    autocast) -> tuple[dict[str, str], dict[str, float]]:
    """Per question id: the answer text ("" for no answer) and the no-answer probability."""
    start, end = [None] * len(split), [None] * len(split)
    lengths = split.lengths()
    for rows, logits in outputs(model, split, pad_id, device, autocast):  # logits (B, T, 2)
        for j, i in enumerate(rows):
            start[i], end[i] = logits[j, : lengths[i], 0].numpy(), logits[j, : lengths[i], 1].numpy()
    return best_answers(split.spans, start, end)


def score(model, split: EncodedSplit, task: EncodedTask, device, autocast) -> dict[str, float]:
    if task.spec.kind == "span":
        predictions, na_probs = predict_answers(model, split, task.pad_id, device, autocast)
        official = squad_evaluate(split.spans.gold, predictions, na_probs)
        out = {ours: official.get(theirs, math.nan) / 100 for ours, theirs in SPAN_METRICS.items()}
        return {**out, "score": out[task.spec.score]}
    regression = task.spec.kind == "regression"
    predictions = predict(model, split, task.pad_id, device, regression, autocast)
    return evaluate(task.spec, predictions.tolist(), split.labels.tolist())


# ----------------------------------------------------------------------------- the trial


def fine_tune(
    cfg: TrialConfig, task: EncodedTask, encoder: PretrainedEncoder,
    on_eval: Callable[[dict[str, float]], None] | None = None, device: str | torch.device | None = None,
) -> TrialResult:
    """Train, evaluate every half epoch, keep the best; `on_eval` gets each evaluation's flat metrics."""
    started = time.perf_counter()
    device = pick_device(device)
    autocast = bf16_autocast(device, cfg.bf16)
    torch.manual_seed(cfg.seed)  # head initialisation and dropout
    model = build_model(task.spec, encoder.build(), cfg.dropout)
    steps_per_epoch = math.ceil(len(task.train) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    schedule = Schedule(cfg.lr, total, round(cfg.warmup * total),
                        _eval_steps(steps_per_epoch, cfg.epochs, cfg.evals_per_epoch))
    best: dict[str, dict[str, float]] = {}

    def on_dev(model: torch.nn.Module, metrics: dict[str, float]) -> bool:
        metrics["epoch"] = metrics["step"] / steps_per_epoch
        return evaluate_dev(model, task, device, autocast, metrics, best)

    history = train(model, _shuffled(task, cfg), partial(task_loss, task.spec), schedule, cfg.adamw, device,
                    autocast, on_dev, keep_best=task.test is not None,  # the weights the test split is scored with
                    on_eval=on_eval)
    test = score(model, task.test, task, device, autocast) if task.test is not None else None
    return TrialResult(best, test, history, total, time.perf_counter() - started)


def _shuffled(task: EncodedTask, cfg: TrialConfig) -> Iterator[Batch]:
    """Every epoch's training batches in a new order from the trial's own seeded generator."""
    shuffle = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.epochs):
        order = torch.randperm(len(task.train), generator=shuffle).numpy()
        for ids, labels in batches(task.train, order, cfg.batch_size, task.pad_id):
            yield (ids, ids != task.pad_id), labels


def evaluate_dev(model, task: EncodedTask, device, autocast, metrics: dict[str, float],
                 best: dict[str, dict[str, float]]) -> bool:
    """Score every dev split into `metrics` (`<split>.<metric>`, `best.<split>.<metric>`), updating each
    split's best on its own. True when the first dev split improved."""
    improved = False
    for name, split in task.dev.items():
        result = score(model, split, task, device, autocast)
        metrics.update({f"{name}.{k}": v for k, v in result.items()})
        if name not in best or result["score"] > best[name]["score"]:
            best[name] = {**result, "eval": metrics["eval"], "epoch": metrics["epoch"]}
            improved |= name == task.spec.dev_splits[0]
        metrics.update({best_split_metric(name, k): v for k, v in best[name].items()})
    return improved


def _eval_steps(steps_per_epoch: int, epochs: int, per_epoch: int) -> frozenset[int]:
    """Optimizer steps after which dev is evaluated: every 1/per_epoch of an epoch, always at each epoch's end."""
    return frozenset(epoch * steps_per_epoch + max(1, round(k * steps_per_epoch / per_epoch))
                     for epoch in range(epochs) for k in range(1, per_epoch + 1))


# ----------------------------------------------------------------------------- the trial (in a Tune actor)


def tune_trial(config: dict[str, Any], data: dict[str, ray.ObjectRef], encoder: PretrainedEncoder) -> None:
    """One fine-tuning run, each half-epoch evaluation reported. `data` maps data keys to object refs of
    the encoded tasks: a trial fetches only its own."""
    point = config["point"]
    trial = TrialConfig(task=point["task"], lr=point["lr"], batch_size=point["batch_size"], epochs=point["epochs"],
                        warmup=point["warmup"], seed=config["seed"])
    result = fine_tune(trial, ray.get(data[data_key(point)]), encoder, on_eval=tune.report)
    tune.report({**result.history[-1], **result.flat(), "done": 1, "trial_seconds": result.seconds})
