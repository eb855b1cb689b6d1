"""A user's own task: a file or a folder of files, read into a `Task`.

    read_user_task(path, kind=None, score=None) -> Task

A .jsonl / .csv / .tsv file (optionally .gz), or a folder with `train.*` and `dev.*` (and optionally
`test.*`), with columns `text`, optional `text_pair`, and `label`. Classification unless the labels
are numbers that are not all integers (override with `kind`); classes are the sorted distinct train
labels (numerically when they are numbers), and for two classes F1 is that of the second (e.g. "1"
of 0/1, "yes" of no/yes). Score: accuracy, or Spearman for regression (override with `score`). A
single file is split into train/dev with a fixed seed.
"""

from __future__ import annotations

import csv
import io
import math
import random
from dataclasses import dataclass
from pathlib import Path

from jobs.cli import UserError, short_repr
from jobs.finetuning.tasks.specs import TaskSpec
from jobs.finetuning.tasks.task import SPLIT_SEED, Rows, Task, check_malformed_fraction, jsonl_objects, read_text

USER_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")
USER_DEV_FRACTION = 0.1  # a single user file: this much of it becomes dev


def read_user_task(path: str | Path, kind: str | None = None, score: str | None = None) -> Task:
    """A file split into train/dev with SPLIT_SEED, or a folder with train.* and dev.* (and test.*)."""
    path = Path(path)
    if path.is_dir():
        found = {stem: _user_file(path, stem) for stem in ("train", "dev", "validation", "test")}
        dev_file = found["dev"] or found["validation"]
        if not (found["train"] and dev_file):
            raise UserError(f"{path}: a task folder needs train.<ext> and dev.<ext> (ext one of {USER_SUFFIXES})")
        raw = {"train": _read_user_rows(found["train"]), "dev": _read_user_rows(dev_file)}
        if found["test"]:
            raw["test"] = _read_user_rows(found["test"])
        name, notes = path.name, ()
    elif path.is_file():
        rows = _read_user_rows(path)
        order = list(range(len(rows)))
        random.Random(SPLIT_SEED).shuffle(order)
        n_dev = max(1, round(USER_DEV_FRACTION * len(rows)))
        raw = {"dev": [rows[i] for i in sorted(order[:n_dev])], "train": [rows[i] for i in sorted(order[n_dev:])]}
        name = path.name.split(".")[0]
        notes = (f"{name}: {path.name} split into train {len(raw['train'])} / dev {n_dev} rows (seed {SPLIT_SEED})",)
    else:
        raise UserError(f"task file or folder {path} not found")
    spec = _user_spec(name, raw["train"], kind, score)
    splits, skipped = {}, []
    one_file = path.is_file()  # split here into train and dev: the malformed rule is the whole file's
    for split, rows in raw.items():
        collected = Rows(rows[0].path if rows else str(path), spec, any(r.pair is not None for r in raw["train"]))
        for r in rows:
            if r.problem:
                collected.skip(r.line, r.problem)
            else:
                collected.add(r.line, r.text, r.pair, r.label)
        splits[split], more = collected.finish(check_fraction=not one_file)
        skipped += more
    if one_file:
        check_malformed_fraction(str(path), spec, sorted(skipped, key=lambda r: r.line),
                                 sum(len(rows) for rows in raw.values()))
    return Task(spec, splits["train"], {"dev": splits["dev"]}, splits.get("test"), tuple(skipped), notes)


@dataclass(frozen=True)
class _UserRow:
    path: str
    line: int
    text: str | None
    pair: str | None
    label: str | None
    problem: str = ""  # set when the row could not even be parsed (bad JSON, wrong field count)


def _user_file(folder: Path, stem: str) -> Path | None:
    for suffix in USER_SUFFIXES:
        for candidate in (folder / f"{stem}{suffix}", folder / f"{stem}{suffix}.gz"):
            if candidate.is_file():
                return candidate
    return None


def _read_user_rows(path: Path) -> list[_UserRow]:
    suffix = path.suffixes[-2] if path.suffix == ".gz" and len(path.suffixes) > 1 else path.suffix
    if suffix not in USER_SUFFIXES:
        raise UserError(f"{path}: a task file is one of {USER_SUFFIXES} (optionally .gz)")
    text = read_text(path)
    if suffix in (".jsonl", ".json"):
        return _user_jsonl(str(path), text)
    reader = csv.reader(io.StringIO(text), delimiter="\t" if suffix == ".tsv" else ",")
    try:
        return _csv_rows(path, reader)
    except csv.Error as error:  # a field over csv's limit (128 KiB), a NUL byte, an unclosed quote at the end
        raise UserError(f"{path}, line {reader.line_num}: not a readable CSV row ({error})") from None


def _csv_rows(path: Path, reader) -> list[_UserRow]:
    header = next(reader, None)
    if header is None or "text" not in header or "label" not in header:
        raise UserError(f"{path}: the header must name columns 'text' and 'label' (and optionally 'text_pair'), "
                         f"got {header}")
    where = {c: header.index(c) for c in ("text", "text_pair", "label") if c in header}
    rows = []
    for fields in reader:
        line = reader.line_num
        if not fields:
            continue
        if len(fields) != len(header):
            rows.append(_UserRow(str(path), line, None, None, None, f"expected {len(header)} fields, got {len(fields)}"))
            continue
        get = {c: fields[i] for c, i in where.items()}
        rows.append(_UserRow(str(path), line, get["text"], get.get("text_pair"), get["label"]))
    return rows


def _user_jsonl(path: str, text: str) -> list[_UserRow]:
    rows = []
    for line, record in jsonl_objects(text):
        if record is None:
            rows.append(_UserRow(path, line, None, None, None, "not a JSON object"))
            continue
        for column in ("text", "text_pair"):
            if record.get(column) is not None and not isinstance(record[column], str):
                raise UserError(f"{path}, line {line}: {column!r} is {short_repr(record[column])}, not a string: "
                                f"quote it (\"{column}\": \"...\")")
        label = record.get("label")
        rows.append(_UserRow(path, line, record.get("text"), record.get("text_pair"),
                             None if label is None else str(label)))
    return rows



def _user_spec(name: str, rows: list[_UserRow], kind: str | None, score: str | None) -> TaskSpec:
    labels = [r.label.strip() for r in rows if not r.problem and r.label is not None and r.label.strip()]
    if not labels:
        raise UserError(f"task {name}: no labelled rows in train")
    numbers = _as_numbers(labels)
    if numbers is not None:
        _check_finite(rows)
    if kind is None:
        kind = "regression" if numbers is not None and any(v != int(v) for v in numbers) else "classification"
    if kind == "regression":
        return TaskSpec(name, name, "regression", (), ("spearman", "pearson"), score or "spearman")
    distinct = sorted(set(labels), key=float) if numbers is not None else sorted(set(labels))
    metrics = ("accuracy", "f1", "matthews_corr") if len(distinct) == 2 else ("accuracy", "matthews_corr")
    return TaskSpec(name, name, "classification", tuple(distinct), metrics, score or "accuracy")


def _check_finite(rows: list[_UserRow]) -> None:
    """Number labels are finite: a `nan` or `inf` among them is neither a class nor a score."""
    for r in rows:
        if not r.problem and r.label is not None and r.label.strip() and not math.isfinite(float(r.label)):
            raise UserError(f"{r.path}, line {r.line}: label {r.label.strip()!r} is not a finite number")


def _as_numbers(labels: list[str]) -> list[float] | None:
    try:
        return [float(v) for v in labels]
    except ValueError:
        return None
