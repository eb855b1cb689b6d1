"""Prompt-based few-shot fine-tuning with the main encoder's language-model head (paper Table 4, LM-BFF's
manual prompts with demonstrations; docs/method.md section 7.8).

A **prompt** is a template with one `[MASK]` and a label word per class. The input is the template
filled with the example, `[SEP]`, then one demonstration per class: the template filled with a
training example of that class and its label word in place of `[MASK]`. The model's score for a class
is the language-model head's logit of the class's label word at the `[MASK]` position, and training
is cross-entropy over those logits. The head is the one pretraining trained: COCO-LM's CLM head
(`h . E^T + b` over the shared embeddings), or roberta_mlm's MLM head. The encoder sees `[MASK]` as any
other token: pretraining never fed it one (the auxiliary fills every masked position), and nothing
here special-cases it.

Everything the trial needs is tokenized on the driver (`encode_prompts`): the fields of every
example, the template's literal pieces, the label words. Trials assemble sequences from those ids,
so they need no tokenizer.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from jobs.cli import UserError
from jobs.data.tokens import Scheme
from jobs.finetuning.tasks.task import Split, Task

MASK = "[MASK]"
FIELDS = ("text", "text_pair")
# LM-BFF's manual templates and label words (their Table 1). Where the template turns the first sentence into a
# question ("{text} ?"), LM-BFF's "sent-" drops its final punctuation (`Prompt.asks`).
_NLI = ("{text} ? [MASK] , {text_pair}", {"entailment": "Yes", "neutral": "Maybe", "contradiction": "No"})
_YES_NO = ("{text} ? [MASK] , {text_pair}", {"entailment": "Yes", "not_entailment": "No"})
BUILT_IN = {
    "snli": _NLI, "mnli": _NLI, "rte": _YES_NO, "qnli": _YES_NO,
    "mrpc": ("{text} [MASK] , {text_pair}", {"0": "No", "1": "Yes"}),
    "qqp": ("{text} [MASK] , {text_pair}", {"0": "No", "1": "Yes"}),
    "sst-2": ("{text} It was [MASK] .", {"0": "terrible", "1": "great"}),
    "cola": ("{text} This is [MASK] .", {"0": "incorrect", "1": "correct"}),
}
SPLIT_SEEDS = (13, 21, 42, 87, 100)  # LM-BFF's five data seeds


@dataclass(frozen=True)
class Prompt:
    template: str  # with {text}, optionally {text_pair}, and exactly one [MASK]
    label_words: dict[str, str]  # label -> word

    def __post_init__(self) -> None:
        if self.template.count(MASK) != 1 or "{text}" not in self.template:
            raise UserError(f"a template needs {{text}} and exactly one {MASK}: {self.template!r}")
        unknown = set(re.findall(r"{(\w+)}", self.template)) - set(FIELDS)
        if unknown:
            raise UserError(f"template {self.template!r}: unknown field(s) {sorted(unknown)}; use {FIELDS}")

    @property
    def asks(self) -> bool:
        """The template asks about the first sentence ("{text} ? ..."): that sentence loses its final punctuation."""
        return "{text} ?" in self.template


def prompt_for(task: Task, path: str | Path | None = None) -> Prompt:
    """The task's prompt: a `prompt.json` next to a user task (`{"template": ..., "label_words": {...}}`,
    in the folder or as `<file stem>.prompt.json`), else LM-BFF's for GLUE and SNLI."""
    if path is not None:
        found = Path(path) / "prompt.json" if Path(path).is_dir() else Path(path).with_name(
            Path(path).name.split(".")[0] + ".prompt.json")
        if found.is_file():
            raw = json.loads(found.read_text())
            return _checked(Prompt(raw["template"], {str(k): str(v) for k, v in raw["label_words"].items()}), task)
    if task.spec.name not in BUILT_IN:
        raise UserError(f"task {task.spec.name!r} has no prompt: write a prompt.json next to it with a template "
                         f"({{text}} ... [MASK] ...) and label_words (one per label of {list(task.spec.labels)})")
    return _checked(Prompt(*BUILT_IN[task.spec.name]), task)


def _checked(prompt: Prompt, task: Task) -> Prompt:
    if set(prompt.label_words) != set(task.spec.labels):
        raise UserError(f"{task.spec.name}: label words for {sorted(prompt.label_words)}, but the labels are "
                         f"{sorted(task.spec.labels)}")
    return prompt


# ----------------------------------------------------------------------------- k-shot splits


def few_shot_split(task: Task, shots: int, seed: int) -> tuple[list[int], list[int]]:
    """LM-BFF's sampling: `shots` training and `shots` dev examples per class from the training set, disjoint,
    drawn with `seed`. Returns train indices and dev indices into `task.train`."""
    order = list(range(len(task.train)))
    random.Random(seed).shuffle(order)
    by_class: dict[int, list[int]] = {}
    for i in order:
        by_class.setdefault(task.train.labels[i], []).append(i)
    short = {task.spec.labels[c]: len(v) for c, v in by_class.items() if len(v) < 2 * shots}
    if short or len(by_class) < len(task.spec.labels):
        raise UserError(f"{task.spec.name}: {shots} training + {shots} dev examples per class need "
                         f"{2 * shots} of each label; the training split has {short or 'a label missing'}")
    train = sorted(i for members in by_class.values() for i in members[:shots])
    dev = sorted(i for members in by_class.values() for i in members[shots : 2 * shots])
    return train, dev


# ----------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class PromptData:
    """A split's fields as token ids, and the prompt's pieces: everything a trial assembles inputs from."""

    fields: list[tuple[list[int], ...]]  # per example, the ids of each field the template uses
    labels: np.ndarray  # (N,) class ids
    pieces: list[str | list[int]]  # the template: field names and literal token ids, MASK where the label goes
    label_ids: list[int]  # per class, its label word's token id
    special: dict[str, int]  # [CLS], [SEP], [MASK], [PAD]


def encode_prompts(scheme: Scheme, prompt: Prompt, task: Task, split: Split) -> tuple[PromptData, list[str]]:
    """A split's prompt data, and notes (label words that are several tokens are scored by their first),
    with the scheme's ids: the authors' tokenizer gives their pieces, [MASK] and specials."""
    special = {"[CLS]": scheme.cls_id, "[SEP]": scheme.sep_id, MASK: scheme.mask_id, "[PAD]": scheme.pad_id}
    pieces: list[str | list[int]] = []
    for part in re.split(r"({text}|{text_pair}|\[MASK\])", prompt.template):
        if part in ("{text}", "{text_pair}"):
            pieces.append(part[1:-1])
        elif part == MASK:
            pieces.append(MASK)
        elif part.strip():
            pieces.append(scheme.ids(part.strip()))
    notes, label_ids = [], []
    for label in task.spec.labels:
        word = prompt.label_words[label]
        ids = scheme.ids(word)
        if len(ids) > 1:
            notes.append(f"label word {word!r} is {len(ids)} tokens here; scored by its first "
                         f"({scheme.token(ids[0])!r})")
        label_ids.append(ids[0])
    if len(set(label_ids)) < len(label_ids):
        raise UserError(f"label words {prompt.label_words} share a first token in this tokenizer: pick others")
    used = [p for p in pieces if p in FIELDS]
    texts = {"text": split.text, "text_pair": split.text_pair}
    if any(texts[f] is None for f in used):
        raise UserError(f"template {prompt.template!r} uses {used} but the task has no text_pair")
    strip = {f: prompt.asks and f == "text" for f in used}
    columns = [scheme.batch_ids([t.rstrip().rstrip(".?!") if strip[f] else t for t in texts[f]]) for f in used]
    return PromptData(list(zip(*columns)), np.asarray(split.labels, dtype=np.int64), pieces, label_ids, special), notes


def render(data: PromptData, i: int, fill: int, budget: int) -> list[int]:
    """Example i in the template, `fill` ([MASK] or a label word id) at the mask, at most `budget` tokens:
    the longest field is cut first."""
    fields = [list(f) for f in data.fields[i]]
    fixed = sum(len(p) if isinstance(p, list) else p == MASK for p in data.pieces)
    while fixed + sum(map(len, fields)) > budget and any(fields):
        max(fields, key=len).pop()
    out, next_field = [], iter(fields)
    for piece in data.pieces:
        out += piece if isinstance(piece, list) else [fill] if piece == MASK else next(next_field)
    return out


def prompt_input(data: PromptData, i: int, demos: Sequence[int], demo_data: PromptData, max_length: int
                 ) -> tuple[list[int], int]:
    """`[CLS] example-with-[MASK] [SEP] demo_1 [SEP] ...`: each segment gets an equal share of max_length.
    Returns the ids and the position of [MASK]."""
    share = (max_length - 1) // (1 + len(demos)) - 1  # each segment ends with its [SEP]
    query = render(data, i, data.special[MASK], share)
    ids = [data.special["[CLS]"], *query, data.special["[SEP]"]]
    for d in demos:
        ids += [*render(demo_data, d, demo_data.label_ids[demo_data.labels[d]], share), data.special["[SEP]"]]
    return ids, 1 + query.index(data.special[MASK])


def sample_demos(data: PromptData, rng: random.Random, exclude: int | None = None) -> list[int]:
    """One demonstration per class, drawn from `data` (the k-shot training set), never the example itself."""
    by_class: dict[int, list[int]] = {}
    for j, label in enumerate(data.labels.tolist()):
        if j != exclude:
            by_class.setdefault(label, []).append(j)
    return [rng.choice(by_class[c]) for c in sorted(by_class)]


# ----------------------------------------------------------------------------- the model


class PromptClassifier(nn.Module):
    """Encoder + its language-model head, read at [MASK] and restricted to the label words: (B, classes)."""

    def __init__(self, encoder: nn.Module, lm_head: nn.Module, label_ids: Sequence[int]):
        super().__init__()
        self.encoder, self.lm_head = encoder, lm_head
        self.register_buffer("label_ids", torch.tensor(list(label_ids)), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask_positions: torch.Tensor
                ) -> torch.Tensor:
        h = self.encoder(input_ids, attention_mask)  # (B, T, H)
        at_mask = h[torch.arange(len(h), device=h.device), mask_positions]  # (B, H)
        return self.lm_head(at_mask)[:, self.label_ids]  # (B, C): the label words' vocabulary logits
