"""A read task: labelled splits, the rows skipped on the way, and the rule every reader applies to them.

    Task(spec, train, dev, test, skipped, notes)   Split(text, text_pair, labels, source)

**Malformed rows** (wrong number of fields, empty text, a label outside the task's label set, a
non-numeric regression label, broken JSON) are skipped *and reported*: every `Task` carries the
skipped rows with file and line number (1-based physical line in the file), and the sweep prints
them and logs them on its MLflow run. When more than `MAX_MALFORMED_FRACTION` of a file's rows
are malformed the file is not in the format we think it is, and reading it is an error instead.
The readers are glue.py, snli.py, user.py and squad.py beside this module.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobs.cli import UserError
from jobs.finetuning.tasks.specs import TaskSpec

SPLIT_SEED = 0  # every fixed-seed split and subset of the tasks: the same data for every trial and sweep
MAX_MALFORMED_FRACTION = 0.01  # above this a file is taken to be in the wrong format: an error, not skips


@dataclass(frozen=True)
class Split:
    text: list[str]
    text_pair: list[str] | None
    labels: list  # label ids (classification) or floats (regression)
    source: str  # file the rows came from, for messages

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, indices: Sequence[int]) -> Split:
        pair = None if self.text_pair is None else [self.text_pair[i] for i in indices]
        return Split([self.text[i] for i in indices], pair, [self.labels[i] for i in indices], self.source)


@dataclass(frozen=True)
class SkippedRow:
    path: str
    line: int | str  # 1-based physical line of the file (the record's last line for a quoted multi-line CSV
    # row), or the entry's position in a JSON file (data[3].paragraphs[0].qas[2])
    reason: str


@dataclass(frozen=True)
class Task:
    spec: TaskSpec
    train: Split
    dev: dict[str, Split]  # one per spec.dev_splits
    test: Split | None = None  # reported apart from dev (SNLI, a user folder's test file)
    skipped: tuple[SkippedRow, ...] = ()
    notes: tuple[str, ...] = ()  # how the data was made: holdouts, subsets

    def skip_report(self) -> str:
        """One line per file and reason, naming the line numbers; empty when nothing was skipped."""
        return skip_report(self.spec.display, self.skipped)


def skip_report(name: str, skipped: Sequence[SkippedRow]) -> str:
    groups: dict[tuple[str, str], list[int | str]] = {}
    for row in skipped:
        groups.setdefault((row.path, row.reason), []).append(row.line)
    return "\n".join(
        f"{name}: skipped {len(lines)} malformed row(s) of {path} ({reason}) at "
        f"{'line(s) ' if isinstance(lines[0], int) else ''}{', '.join(map(str, lines))}"
        for (path, reason), lines in groups.items()
    )


class Rows:
    """Collects one file's good rows and skipped ones, as every reader does; `finish` applies the
    malformed-fraction rule."""

    def __init__(self, path: str, spec: TaskSpec, paired: bool):
        self.path, self.spec = path, spec
        self.text: list[str] = []
        self.pair: list[str] | None = [] if paired else None
        self.labels: list = []
        self.skipped: list[SkippedRow] = []

    def add(self, line: int, text: str | None, pair: str | None, label: str | None) -> None:
        reason = _row_problem(self.spec, text, pair, label, self.pair is not None)
        if reason:
            self.skipped.append(SkippedRow(self.path, line, reason))
            return
        self.text.append(text)
        if self.pair is not None:
            self.pair.append(pair)
        self.labels.append(_label_value(self.spec, label))

    def skip(self, line: int, reason: str) -> None:
        self.skipped.append(SkippedRow(self.path, line, reason))

    def finish(self, check_fraction: bool = True) -> tuple[Split, list[SkippedRow]]:
        """The split and its skipped rows. `check_fraction=False` where the file is larger than this
        split (one user file split in two): its caller checks the whole file instead."""
        if not self.labels:
            raise UserError(f"{self.path}: no usable rows ({len(self.skipped)} malformed)\n"
                             + skip_report(self.spec.display, self.skipped))
        if check_fraction:
            check_malformed_fraction(self.path, self.spec, self.skipped, len(self.labels) + len(self.skipped))
        return Split(self.text, self.pair, self.labels, self.path), self.skipped


def check_malformed_fraction(path: str, spec: TaskSpec, skipped: Sequence[SkippedRow], total: int) -> None:
    """More than MAX_MALFORMED_FRACTION of a file's `total` rows malformed: the file is not in the
    format we think it is, and reading it is an error that shows the first skipped rows."""
    if len(skipped) > MAX_MALFORMED_FRACTION * total:
        raise UserError(
            f"{path}: {len(skipped)} of {total} rows are malformed, more than "
            f"{MAX_MALFORMED_FRACTION:.0%}: is this the {spec.display} format?\n"
            + skip_report(spec.display, list(skipped)[:20])
        )


def _row_problem(spec: TaskSpec, text, pair, label, paired: bool) -> str:
    if text is None or not str(text).strip() or (paired and (pair is None or not str(pair).strip())):
        return "empty text"
    if label is None or str(label).strip() == "":
        return "no label"
    if spec.kind == "classification" and str(label).strip() not in spec.labels:
        known = list(spec.labels) if len(spec.labels) <= 10 else [*spec.labels[:10], "..."]
        return f"label {str(label).strip()!r} not in {known}"
    if spec.kind == "regression":
        try:
            if not math.isfinite(float(label)):
                return f"label {label!r} is not a finite number"
        except (TypeError, ValueError):
            return f"label {label!r} is not a number"
    return ""


def _label_value(spec: TaskSpec, label) -> int | float:
    return spec.labels.index(str(label).strip()) if spec.kind == "classification" else float(label)


def read_text(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    try:
        return data.decode("utf-8-sig")  # MRPC's files start with a byte-order mark
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise UserError(f"{path}, line {line}: not UTF-8 (byte {data[error.start]:#04x}); save the file as "
                        f"UTF-8") from None


def jsonl_objects(text: str) -> Iterator[tuple[int, dict | None]]:
    """(line number, record) for each non-blank line of a JSON-lines text; the record is None where
    the line is not a JSON object (bad JSON, or a list, string or number). The one JSONL reader of
    the task files: every caller skips and counts a None the same way."""
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        yield line, record if isinstance(record, dict) else None

