"""One fine-tuning trial: plain PyTorch, callable without Ray (`fine_tune`), run by Ray Tune in a sweep.

A trial is one (task, lr, batch size, epochs, warm-up, seed) (docs/method.md section 7.2): the pretrained main
encoder plus the [CLS] head (the start/end head for SQuAD 2.0, section 7.6), AdamW (0.9, 0.98), eps 1e-6, weight decay 0.01, linear warm-up then
linear decay to 0, no gradient clipping, dropout 0.1; dev is evaluated every half epoch and the best
evaluation is kept (per dev set: MNLI-m and MNLI-mm each keep their own best). A task with a test
split (SNLI) is scored on it once, with the weights of the best evaluation on its first dev set.
The same seed gives the same result: it seeds the head, dropout and the shuffling.

Where the encoder comes from (`resolve_encoder`): a pretraining MLflow run id (its "encoder"
artifact is downloaded), an exported encoder directory, or a pretraining checkpoint directory
(model.pt + config.yaml + tokenizer/, `jobs/pretraining/checkpoint.py`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from model import Encoder, EncoderConfig
from model.classifier import SequenceClassifier, SpanExtractor, lm_head
from model.step import param_groups, warmup_linear_decay

from jobs.finetuning.encoding import EncodedSplit, EncodedTask
from jobs.finetuning.specs import SPAN_METRICS, TaskSpec, evaluate
from jobs.finetuning.squad_features import best_answers
from jobs.finetuning.squad_metric import evaluate as squad_evaluate
from jobs.names import best_split_metric

EVAL_BATCH = 128


@dataclass(frozen=True)
class TrialConfig:
    task: str
    lr: float
    batch_size: int
    epochs: int
    warmup: float  # fraction of the total optimizer steps spent warming up
    seed: int
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-6
    dropout: float = 0.1  # head dropout; the encoder keeps its own config's (0.1)
    evals_per_epoch: int = 2
    bf16: bool = True  # autocast on GPU; CPU runs fp32


@dataclass(frozen=True)
class PretrainedEncoder:
    """What every trial starts from. Weights travel as a state dict (Ray's object store), so trials
    on other nodes need no shared file system; the tokenizer is used by the driver only."""

    cfg: EncoderConfig
    state: dict[str, torch.Tensor]
    tokenizer_dir: Path
    source: str  # what the user passed: a run id or a directory
    pretraining_run: str = ""  # MLflow run id when known
    preset: str = ""  # the pretraining preset when known (large++ selects the large++ learning rates)
    variant: str = ""  # the pretraining variant when known
    lm_head_kind: str = ""  # "clm" | "mlm" when the export kept its language-model head, else ""
    lm_head_state: dict[str, torch.Tensor] | None = None

    def build(self) -> Encoder:
        encoder = Encoder(self.cfg)
        encoder.load_state_dict(self.state, strict=True)
        return encoder

    def build_with_lm_head(self) -> tuple[Encoder, torch.nn.Module]:
        """The encoder and its language-model head, tied to its token embeddings (prompt-based fine-tuning)."""
        if self.lm_head_state is None:
            raise ValueError(f"{self.source}: no language-model head (variant {self.variant or 'unknown'} trains none)")
        encoder = self.build()
        return encoder, lm_head(self.lm_head_kind, encoder, self.lm_head_state)


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


# ----------------------------------------------------------------------------- batches


def batches(split: EncodedSplit, order: np.ndarray, batch_size: int, pad_id: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids (B, T), labels (B,) or (B, 2)) in `order`, each batch padded to its own longest example."""
    lengths = split.lengths()
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        ids = np.full((len(rows), int(lengths[rows].max())), pad_id, dtype=np.int64)
        for j, i in enumerate(rows):
            ids[j, : lengths[i]] = split.ids[split.offsets[i] : split.offsets[i + 1]]
        yield torch.from_numpy(ids), torch.from_numpy(split.labels[rows])


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
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(cfg.seed)  # head initialisation and dropout
    shuffle = torch.Generator().manual_seed(cfg.seed)
    model = build_model(task.spec, encoder.build(), cfg.dropout).to(device)
    model.train()
    steps_per_epoch = math.ceil(len(task.train) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                                  betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(round(cfg.warmup * total), total))
    eval_at = _eval_steps(steps_per_epoch, cfg.epochs, cfg.evals_per_epoch)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda" and cfg.bf16)
    best: dict[str, dict[str, float]] = {}
    best_state, history, step, losses = None, [], 0, []
    for _ in range(cfg.epochs):
        order = torch.randperm(len(task.train), generator=shuffle).numpy()
        for ids, labels in batches(task.train, order, cfg.batch_size, task.pad_id):
            ids, labels = ids.to(device), labels.to(device)
            with autocast:
                logits = model(ids, ids != task.pad_id).float()  # (B, C), or (B, T, 2) for a span task
            loss = task_loss(task.spec, logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append(loss.item())
            if step not in eval_at:
                continue
            metrics = {"eval": len(history) + 1, "step": step, "epoch": step / steps_per_epoch,
                       "train_loss": float(np.mean(losses)), "lr": scheduler.get_last_lr()[0]}
            losses = []
            if evaluate_dev(model, task, device, autocast, metrics, best) and task.test is not None:
                best_state = copy.deepcopy(model.state_dict())  # the weights the test split is scored with
            history.append(metrics)
            if on_eval is not None:
                on_eval(metrics)
    test = None
    if task.test is not None:
        model.load_state_dict(best_state)
        test = score(model, task.test, task, device, autocast)
    return TrialResult(best, test, history, step, time.perf_counter() - started)


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


def _eval_steps(steps_per_epoch: int, epochs: int, per_epoch: int) -> set[int]:
    """Optimizer steps after which dev is evaluated: every 1/per_epoch of an epoch, always at each epoch's end."""
    return {epoch * steps_per_epoch + max(1, round(k * steps_per_epoch / per_epoch))
            for epoch in range(epochs) for k in range(1, per_epoch + 1)}
