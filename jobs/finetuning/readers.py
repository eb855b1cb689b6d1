"""Fine-tuning task readers: GLUE, SNLI and a user's own files, each into a `Task` of labelled splits.

    read_glue_task(name, data_dir) | read_glue_hub(name) | read_snli() | read_user_task(path) -> Task

- **GLUE** (the eight tasks of docs/method.md section 7.5) from the standard GLUE directory layout
  (`<data_dir>/MNLI/train.tsv`, `dev_matched.tsv`, `dev_mismatched.tsv`, `<data_dir>/CoLA/...`),
  or from the Hugging Face hub through `datasets` when no `data_dir` is given (needs network and
  the `datasets` package, imported only then). GLUE's test sets carry no labels: dev is reported.
- **SNLI** from the shipped `data/snli/*.jsonl.gz`. It has no dev split here, so a fixed part of
  train is held out for model selection, whole premises at a time (SNLI writes three hypotheses per
  premise: a random row split would put the same premise on both sides). Test is reported apart.
- **User-defined**: a .jsonl / .csv / .tsv file (optionally .gz), or a folder with `train.*` and
  `dev.*` (and optionally `test.*`), with columns `text`, optional `text_pair`, and `label`.
  Classification unless the labels are numbers that are not all integers (override with `kind`);
  classes are the sorted distinct train labels (numerically when they are numbers), and for two
  classes F1 is that of the second (e.g. "1" of 0/1, "yes" of no/yes). Score: accuracy, or Spearman
  for regression (override with `score`). A single file is split into train/dev with a fixed seed.

**Malformed rows** (wrong number of fields, empty text, a label outside the task's label set, a
non-numeric regression label, broken JSON) are skipped *and reported*: every `Task` carries the
skipped rows with file and line number (1-based physical line in the file), and the sweep prints
them and logs them on its MLflow run. When more than `MAX_MALFORMED_FRACTION` of a file's rows
are malformed the file is not in the format we think it is, and reading it is an error instead.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from jobs.finetuning.specs import GLUE, GLUE_ALIASES, SNLI, GlueFormat, TaskSpec

SNLI_DIR = Path(__file__).resolve().parents[2] / "data" / "snli"
SNLI_DEV_PAIRS = 5000  # held out of SNLI train for model selection (whole premises; about 5%)
SPLIT_SEED = 0  # every fixed-seed split and subset in this module: the same data for every trial and sweep
USER_DEV_FRACTION = 0.1  # a single user file: this much of it becomes dev
MAX_MALFORMED_FRACTION = 0.01  # above this a file is taken to be in the wrong format: an error, not skips


# ----------------------------------------------------------------------------- data containers


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


class _Rows:
    """Collects good rows and skipped ones for one file; `finish` applies the malformed-fraction rule."""

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
            raise ValueError(f"{self.path}: no usable rows ({len(self.skipped)} malformed)\n"
                             + skip_report(self.spec.display, self.skipped))
        if check_fraction:
            check_malformed_fraction(self.path, self.spec, self.skipped, len(self.labels) + len(self.skipped))
        return Split(self.text, self.pair, self.labels, self.path), self.skipped


def check_malformed_fraction(path: str, spec: TaskSpec, skipped: Sequence[SkippedRow], total: int) -> None:
    """More than MAX_MALFORMED_FRACTION of a file's `total` rows malformed: the file is not in the
    format we think it is, and reading it is an error that shows the first skipped rows."""
    if len(skipped) > MAX_MALFORMED_FRACTION * total:
        raise ValueError(
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


# ----------------------------------------------------------------------------- GLUE


def read_glue_tsv(path: Path, spec: TaskSpec, fmt: GlueFormat) -> tuple[Split, list[SkippedRow]]:
    """One GLUE TSV, split on tabs line by line (GLUE's files are not CSV-quoted: MNLI's text has
    bare quotes), columns by header name, or by index for CoLA's header-less files."""
    lines = _read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    first = 0
    if fmt.header:
        if not lines:
            raise ValueError(f"{path}: empty file, expected a header")
        header = lines[0].rstrip("\r").split("\t")
        missing = [c for c in (fmt.text, fmt.text_pair, fmt.label) if c is not None and c not in header]
        if missing:
            raise ValueError(f"{path}: header {header} lacks column(s) {missing} of the {spec.display} format")
        columns = [header.index(c) if c is not None else None for c in (fmt.text, fmt.text_pair, fmt.label)]
        width, first = len(header), 1
    else:
        columns, width = [fmt.text, fmt.text_pair, fmt.label], 4
    rows = _Rows(str(path), spec, fmt.text_pair is not None)
    for number, line in enumerate(lines[first:], start=first + 1):
        fields = line.rstrip("\r").split("\t")
        if len(fields) != width:
            rows.skip(number, f"expected {width} tab-separated fields, got {len(fields)}")
            continue
        text, pair, label = (fields[c] if c is not None else None for c in columns)
        rows.add(number, text, pair, label)
    return rows.finish()


def read_glue_task(name: str, data_dir: str | Path) -> Task:
    spec, fmt = GLUE[_glue_name(name)]
    folder = Path(data_dir) / fmt.folder
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} not found: --data-dir must hold the GLUE folders ({fmt.folder}/train.tsv, ...)")
    train, skipped = read_glue_tsv(folder / "train.tsv", spec, fmt)
    dev = {}
    for split, filename in zip(spec.dev_splits, fmt.dev_files):
        dev[split], more = read_glue_tsv(folder / filename, spec, fmt)
        skipped += more
    return Task(spec, train, dev, skipped=tuple(skipped))


def read_glue_hub(name: str) -> Task:
    """A GLUE task from the Hugging Face hub (`nyu-mll/glue`); needs network and `datasets`."""
    spec, fmt = GLUE[_glue_name(name)]
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"reading {spec.display} from the Hugging Face hub needs the `datasets` package: "
            f"`pip install datasets` (and network), or pass --data-dir with the GLUE files"
        ) from None
    loaded = datasets.load_dataset("nyu-mll/glue", fmt.hub_config)
    names = getattr(loaded["train"].features["label"], "names", None)

    def split(hub_split: str) -> tuple[Split, list[SkippedRow]]:
        rows = _Rows(f"hub:nyu-mll/glue/{fmt.hub_config}/{hub_split}", spec, fmt.hub_fields[1] is not None)
        for number, row in enumerate(loaded[hub_split], start=1):  # "line" = row number in the hub split
            label = row["label"]
            if spec.kind == "classification":  # hub ids -> our label strings, by name where the names are ours
                label = names[label] if names and set(names) <= set(spec.labels) and label >= 0 else str(label)
            rows.add(number, row[fmt.hub_fields[0]], row[fmt.hub_fields[1]] if fmt.hub_fields[1] else None, label)
        return rows.finish()

    train, skipped = split("train")
    dev = {}
    for ours, theirs in zip(spec.dev_splits, fmt.hub_dev):
        dev[ours], more = split(theirs)
        skipped += more
    return Task(spec, train, dev, skipped=tuple(skipped))


def _glue_name(name: str) -> str:
    key = GLUE_ALIASES.get(name.lower(), name.lower())
    if key not in GLUE:
        raise ValueError(f"unknown GLUE task {name!r}; the tasks are {sorted(GLUE)} (and 'glue' for all eight)")
    return key


# ----------------------------------------------------------------------------- SNLI


def read_snli(snli_dir: str | Path = SNLI_DIR, dev_pairs: int = SNLI_DEV_PAIRS) -> Task:
    """Shipped SNLI: dev = whole premises drawn with SPLIT_SEED until `dev_pairs` pairs, rest train; test apart."""
    snli_dir = Path(snli_dir)
    full, skipped = _read_jsonl(snli_dir / "train.jsonl.gz", SNLI, "premise", "hypothesis", "label")
    test, more = _read_jsonl(snli_dir / "test.jsonl.gz", SNLI, "premise", "hypothesis", "label")
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


# ----------------------------------------------------------------------------- user-defined tasks


USER_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")


def read_user_task(path: str | Path, kind: str | None = None, score: str | None = None) -> Task:
    """A file split into train/dev with SPLIT_SEED, or a folder with train.* and dev.* (and test.*)."""
    path = Path(path)
    if path.is_dir():
        found = {stem: _user_file(path, stem) for stem in ("train", "dev", "validation", "test")}
        dev_file = found["dev"] or found["validation"]
        if not (found["train"] and dev_file):
            raise FileNotFoundError(f"{path}: a task folder needs train.<ext> and dev.<ext> (ext one of {USER_SUFFIXES})")
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
        raise FileNotFoundError(f"task file or folder {path} not found")
    spec = _user_spec(name, raw["train"], kind, score)
    splits, skipped = {}, []
    one_file = path.is_file()  # split here into train and dev: the malformed rule is the whole file's
    for split, rows in raw.items():
        collected = _Rows(rows[0].path if rows else str(path), spec, any(r.pair is not None for r in raw["train"]))
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
        raise ValueError(f"{path}: a task file is one of {USER_SUFFIXES} (optionally .gz)")
    text = _read_text(path)
    if suffix in (".jsonl", ".json"):
        return _user_jsonl(str(path), text)
    reader = csv.reader(io.StringIO(text), delimiter="\t" if suffix == ".tsv" else ",")
    header = next(reader, None)
    if header is None or "text" not in header or "label" not in header:
        raise ValueError(f"{path}: the header must name columns 'text' and 'label' (and optionally 'text_pair'), "
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
        label = record.get("label")
        rows.append(_UserRow(path, line, record.get("text"), record.get("text_pair"),
                             None if label is None else str(label)))
    return rows


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


def _user_spec(name: str, rows: list[_UserRow], kind: str | None, score: str | None) -> TaskSpec:
    labels = [r.label.strip() for r in rows if not r.problem and r.label is not None and r.label.strip()]
    if not labels:
        raise ValueError(f"task {name}: no labelled rows in train")
    numbers = _as_numbers(labels)
    if kind is None:
        kind = "regression" if numbers is not None and any(v != int(v) for v in numbers) else "classification"
    if kind == "regression":
        return TaskSpec(name, name, "regression", (), ("spearman", "pearson"), score or "spearman")
    distinct = sorted(set(labels), key=float) if numbers is not None else sorted(set(labels))
    metrics = ("accuracy", "f1", "matthews_corr") if len(distinct) == 2 else ("accuracy", "matthews_corr")
    return TaskSpec(name, name, "classification", tuple(distinct), metrics, score or "accuracy")


def _as_numbers(labels: list[str]) -> list[float] | None:
    try:
        return [float(v) for v in labels]
    except ValueError:
        return None


# ----------------------------------------------------------------------------- common


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8-sig")  # MRPC's files start with a byte-order mark


def _read_jsonl(path: Path, spec: TaskSpec, text: str, pair: str | None, label: str) -> tuple[Split, list[SkippedRow]]:
    rows = _Rows(str(path), spec, pair is not None)
    for number, record in jsonl_objects(_read_text(path)):
        if record is None:
            rows.skip(number, "not a JSON object")
            continue
        rows.add(number, record.get(text), record.get(pair) if pair else None, record.get(label))
    return rows.finish()


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
