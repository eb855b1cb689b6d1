"""Tasks into the token sequences the model reads: `[CLS] A [SEP]` or `[CLS] A [SEP] [SEP] B [SEP]`, and for
SQuAD 2.0 `[CLS] question [SEP] [SEP] context window [SEP]` (jobs/finetuning/tasks/squad_windows.py); and
those sequences back into padded batches (`batches`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from jobs.data.schemes import Scheme, load_scheme

from jobs.finetuning.tasks.specs import TaskSpec
from jobs.finetuning.tasks.squad import Questions
from jobs.finetuning.tasks.squad_windows import SpanIndex, encode_questions
from jobs.finetuning.tasks.task import Split, Task


@dataclass(frozen=True)
class EncodedSplit:
    """Token ids of every example, ragged: example i is ids[offsets[i]:offsets[i + 1]]. For a span task an
    example is one window of a question, its label the (start, end) positions of the answer."""

    ids: np.ndarray  # (total tokens,) int32
    offsets: np.ndarray  # (N + 1,) int64
    labels: np.ndarray  # (N,) int64 or float32; (N, 2) int64 for a span task
    spans: SpanIndex | None = None  # a span task's way from windows back to answers

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True)
class EncodedTask:
    spec: TaskSpec
    train: EncodedSplit
    dev: dict[str, EncodedSplit]
    test: EncodedSplit | None
    pad_id: int
    max_length: int
    truncated: dict[str, int] = field(default_factory=dict)  # split -> examples (span: questions) cut


def encode_task(task: Task, tokenizer_dir: str | Path, max_length: int, doc_stride: int = 128,
                max_question_length: int = 64) -> EncodedTask:
    """`[CLS] A [SEP]` or `[CLS] A [SEP] [SEP] B [SEP]`, longest side cut first to max_length
    (docs/method.md section 7.1); a span task's questions in windows (`doc_stride`, `max_question_length`).
    With the tokenizer scheme `tokenizer_dir` holds (`jobs.data.schemes`): the authors' is encoded as
    their code encodes, ties and all."""
    scheme = load_scheme(tokenizer_dir)
    dtype = np.int64 if task.spec.kind == "classification" else np.float32
    splits = {"train": task.train, **task.dev, **({"test": task.test} if task.test is not None else {})}
    if task.spec.kind == "span":
        encoded = {name: encode_windows(scheme, split, max_length, doc_stride, max_question_length)
                   for name, split in splits.items()}
    else:
        encoded = {name: encode_split(scheme, split, max_length, dtype) for name, split in splits.items()}
    return EncodedTask(
        task.spec, encoded["train"][0], {k: encoded[k][0] for k in task.dev},
        encoded["test"][0] if task.test is not None else None, scheme.pad_id, max_length,
        {name: cut for name, (_, cut) in encoded.items()},
    )


def encode_split(scheme: Scheme, split: Split, max_length: int, label_dtype: type = np.int64
                 ) -> tuple[EncodedSplit, int]:
    """One split in the fine-tuning format (`Scheme.layout`), and how many of its sequences were cut."""
    first = scheme.batch_ids(split.text)
    second = scheme.batch_ids(split.text_pair) if split.text_pair is not None else [None] * len(first)
    laid = [scheme.layout(a, b, max_length) for a, b in zip(first, second)]
    return ragged([ids for ids, _ in laid], np.asarray(split.labels, dtype=label_dtype)), sum(cut for _, cut in laid)


def encode_windows(scheme: Scheme, questions: Questions, max_length: int, doc_stride: int,
                   max_question_length: int) -> tuple[EncodedSplit, int]:
    """A span task's split: one example per window, and how many questions were cut."""
    sequences, labels, spans, cut = encode_questions(scheme, questions, max_length, doc_stride, max_question_length)
    return ragged(sequences, labels, spans), cut


def ragged(sequences: list[list[int]], labels: np.ndarray, spans: SpanIndex | None = None) -> EncodedSplit:
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    tokens = np.fromiter((t for s in sequences for t in s), dtype=np.int32, count=int(lengths.sum()))
    return EncodedSplit(tokens, np.concatenate([[0], np.cumsum(lengths)]), labels, spans)


def batches(split: EncodedSplit, order: np.ndarray, batch_size: int, pad_id: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids (B, T), labels (B,) or (B, 2)) in `order`, each batch padded to its own longest example."""
    lengths = split.lengths()
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        ids = np.full((len(rows), int(lengths[rows].max())), pad_id, dtype=np.int64)
        for j, i in enumerate(rows):
            ids[j, : lengths[i]] = split.ids[split.offsets[i] : split.offsets[i + 1]]
        yield torch.from_numpy(ids), torch.from_numpy(split.labels[rows])
