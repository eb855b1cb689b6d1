"""SNLI from the shipped `data/snli/*.jsonl.gz`, read into a `Task`.

    read_snli() -> Task

It has no dev split here, so a fixed part of train is held out for model selection, whole premises at
a time (SNLI writes three hypotheses per premise: a random row split would put the same premise on
both sides). Test is reported apart.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

from jobs.finetuning.tasks.specs import SNLI, TaskSpec
from jobs.finetuning.tasks.task import SPLIT_SEED, Rows, SkippedRow, Split, Task, jsonl_objects, read_text

SNLI_DIR = Path(__file__).resolve().parents[3] / "data" / "snli"
SNLI_DEV_PAIRS = 5000  # held out of SNLI train for model selection (whole premises; about 5%)


def read_snli(snli_dir: str | Path = SNLI_DIR, dev_pairs: int = SNLI_DEV_PAIRS) -> Task:
    """Shipped SNLI: dev = whole premises drawn with SPLIT_SEED until `dev_pairs` pairs, rest train; test apart.

    Read once per process while its files stay as they were (1.2 s a read: a study reads it for every sweep,
    probe and [CLS] readout). The Task is shared, so it is never changed in place: every reader of it makes
    new splits (`Split.take`, `subsample`)."""
    files = (Path(snli_dir) / "train.jsonl.gz", Path(snli_dir) / "test.jsonl.gz")
    return _read_snli(files, tuple(_stamp(path) for path in files), dev_pairs)


def _stamp(path: Path) -> tuple[int, int] | None:
    """What tells a file's contents changed: its modification time and size; None for a missing file (the
    read says so)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=2)
def _read_snli(files: tuple[Path, Path], stamps: tuple, dev_pairs: int) -> Task:
    full, skipped = _read_jsonl(files[0], SNLI, "premise", "hypothesis", "label")
    test, more = _read_jsonl(files[1], SNLI, "premise", "hypothesis", "label")
    premises = sorted(set(full.text))
    random.Random(SPLIT_SEED).shuffle(premises)
    rows_of: dict[str, list[int]] = {}
    for i, premise in enumerate(full.text):
        rows_of.setdefault(premise, []).append(i)
    dev_rows: list[int] = []
    for premise in premises:
        if len(dev_rows) >= dev_pairs:
            break
        dev_rows += rows_of[premise]
    held = set(dev_rows)
    train_rows = [i for i in range(len(full)) if i not in held]
    note = (f"SNLI dev = {len(dev_rows)} pairs of train held out by premise (seed {SPLIT_SEED}); "
            f"train {len(train_rows)} pairs; test {len(test)} pairs reported apart")
    return Task(SNLI, full.take(train_rows), {"dev": full.take(sorted(dev_rows))}, test,
                tuple(skipped + more), (note,))



def _read_jsonl(path: Path, spec: TaskSpec, text: str, pair: str | None, label: str) -> tuple[Split, list[SkippedRow]]:
    rows = Rows(str(path), spec, pair is not None)
    for number, record in jsonl_objects(read_text(path)):
        if record is None:
            rows.skip(number, "not a JSON object")
            continue
        rows.add(number, record.get(text), record.get(pair) if pair else None, record.get(label))
    return rows.finish()
