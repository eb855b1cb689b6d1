"""GLUE's eight tasks (docs/method.md section 7.5) read into `Task`s.

    read_glue_task(name, data_dir) | read_glue_hub(name) -> Task

From the standard GLUE directory layout (`<data_dir>/MNLI/train.tsv`, `dev_matched.tsv`,
`dev_mismatched.tsv`, `<data_dir>/CoLA/...`), or from the Hugging Face hub through `datasets` when no
`data_dir` is given (needs network and the `datasets` package, imported only then). GLUE's test sets
carry no labels: dev is reported. What each task is (labels, metrics, file columns) is in specs.py.
"""

from __future__ import annotations

from pathlib import Path

from jobs.cli import UserError
from jobs.finetuning.tasks.specs import GLUE, GLUE_ALIASES, GlueFormat, TaskSpec
from jobs.finetuning.tasks.task import Rows, SkippedRow, Split, Task, read_text


def read_glue_tsv(path: Path, spec: TaskSpec, fmt: GlueFormat) -> tuple[Split, list[SkippedRow]]:
    """One GLUE TSV, split on tabs line by line (GLUE's files are not CSV-quoted: MNLI's text has
    bare quotes), columns by header name, or by index for CoLA's header-less files."""
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    first = 0
    if fmt.header:
        if not lines:
            raise UserError(f"{path}: empty file, expected a header")
        header = lines[0].rstrip("\r").split("\t")
        missing = [c for c in (fmt.text, fmt.text_pair, fmt.label) if c is not None and c not in header]
        if missing:
            raise UserError(f"{path}: header {header} lacks column(s) {missing} of the {spec.display} format")
        columns = [header.index(c) if c is not None else None for c in (fmt.text, fmt.text_pair, fmt.label)]
        width, first = len(header), 1
    else:
        columns, width = [fmt.text, fmt.text_pair, fmt.label], 4
    rows = Rows(str(path), spec, fmt.text_pair is not None)
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
        raise UserError(f"{folder} not found: --data-dir must hold the GLUE folders ({fmt.folder}/train.tsv, ...)")
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
        rows = Rows(f"hub:nyu-mll/glue/{fmt.hub_config}/{hub_split}", spec, fmt.hub_fields[1] is not None)
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
        raise UserError(f"unknown GLUE task {name!r}; the tasks are {sorted(GLUE)} (and 'glue' for all eight)")
    return key
