"""Fixed-seed parts of a task: subsets of its rows (--max-train, --max-dev) and fractions of its training
labels (--label-fractions, paper Fig. 7c/d; docs/method.md section 7.7)."""

from __future__ import annotations

import random
from dataclasses import replace

from jobs.finetuning.tasks.task import SPLIT_SEED, Split, Task


def subsample(task: Task, max_train: int = 0, max_dev: int = 0) -> Task:
    """Fixed-seed subsets (0 = all) so every trial of a sweep sees the same rows; test is never cut."""
    def cut(split: Split, limit: int) -> Split:
        if not limit or len(split) <= limit:
            return split
        return split.take(sorted(random.Random(SPLIT_SEED).sample(range(len(split)), limit)))

    train = cut(task.train, max_train)
    dev = {name: cut(split, max_dev) for name, split in task.dev.items()}
    notes = list(task.notes)
    if len(train) < len(task.train):
        notes.append(f"{task.spec.display}: train cut to {len(train)} of {len(task.train)} rows (seed {SPLIT_SEED})")
    for name, split in dev.items():
        if len(split) < len(task.dev[name]):
            notes.append(f"{task.spec.display}: {name} cut to {len(split)} of {len(task.dev[name])} rows (seed {SPLIT_SEED})")
    return replace(task, train=train, dev=dev, notes=tuple(notes))


def label_subset(task: Task, fraction: float) -> Task:
    """Train on `fraction` of the training labels (paper Fig. 7c/d): the first `fraction` of each class's
    examples in one SPLIT_SEED order, at least one per class. So the subsets are the same for every trial,
    keep the classes' shares, and are nested: a smaller fraction's examples are all in a larger one's.
    Regression and span tasks (no classes) take the first `fraction` of one seeded order. Dev is whole."""
    if fraction >= 1:
        return task
    order = list(range(len(task.train)))
    random.Random(SPLIT_SEED).shuffle(order)
    groups: dict = {}
    for i in order:
        groups.setdefault(task.train.labels[i] if task.spec.kind == "classification" else None, []).append(i)
    keep = sorted(i for members in groups.values() for i in members[: max(1, round(fraction * len(members)))])
    note = (f"{task.spec.display}: {fraction:g} of the training labels: {len(keep)} of {len(task.train)} "
            f"{'(class-balanced, nested, seed ' if len(groups) > 1 else '(nested, seed '}{SPLIT_SEED})")
    return replace(task, train=task.train.take(keep), notes=(*task.notes, note))
