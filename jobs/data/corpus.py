"""Reading and cleaning the pretraining corpus with Ray Data, counting everything that is dropped.

Inputs are local files, folders (walked recursively; names starting with "." or "_" are ignored,
as Spark/Arrow writers use them for markers such as `_SUCCESS`), globs, or URIs of any filesystem
pyarrow knows (s3://, gs://, hdfs://, ...), which are passed through to Ray Data untouched.
Each local file gets its own read task (Ray's own estimate would put a small corpus in one task
and leave cores idle); a URI *folder* is listed by Ray, and then several of its files may share a
read task: pass file URIs where that matters.
Local paths must be visible to the node that reads them: on a multi-node cluster use shared or
object storage. Every file is read whole as one binary row (shard big corpora into files of at
most a few hundred MB) by Ray Data's binary reader minus its decompression (see `_RawBytes`), and
decoded here rather than by Ray's format readers, so that a bad file or line is skipped and
counted instead of failing the whole job.

Record formats, by file name (a trailing .gz means gzip, decompressed here):

    .jsonl / .json   one JSON object a line with a string field `text`; blank lines are not records
    .txt             documents separated by blank lines (the BERT / fairseq convention); the lines
                     of a document are joined with a space. Undecodable lines are dropped one by one.
    .parquet         a string column `text`, one record a row

Cleaning (`clean_text`): Unicode NFKC; control, format, surrogate and private-use characters
removed; every run of whitespace (newlines included) collapsed to one space; stripped.

Skip reasons. File-level ones count files and list them; the others count records (lines for
`bad_utf8`, since a broken line is all that is dropped):

    unreadable_file     unreadable, or a .gz / .parquet that does not open
    binary_file         NUL bytes in the (decompressed) content, or more undecodable lines than
                        good ones: not text
    unsupported_format  a file name none of the formats above matches
    empty_file          no content at all (zero bytes or only whitespace, or a parquet file of no rows)
    bad_utf8            a line that is not valid UTF-8
    bad_json            a .jsonl line that does not parse
    no_text             a JSON object or parquet row without a string `text`
    empty               nothing left after cleaning
    too_long            more than `max_record_chars` characters before cleaning
"""

from __future__ import annotations

import codecs
import collections
import functools
import glob
import gzip
import io
import json
import os
import re
import unicodedata
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.data.datasource import FileBasedDatasource

from jobs.cli import UserError
from jobs.data.config import DEFAULT_MAX_RECORD_CHARS, DataConfig
from jobs.data.skips import new_skip_counter, skip_summary

SHIPPED_CORPUS_DIR = Path(__file__).resolve().parents[2] / "data" / "corpus"

_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".txt": "txt", ".parquet": "parquet"}


SHIPPED = "shipped"  # a corpus path naming the shipped corpus on purpose (`--corpus shipped`)


def shipped_corpus() -> list[str]:
    """The real corpus shipped in data/corpus (see data/README.md)."""
    return [str(p) for p in sorted(SHIPPED_CORPUS_DIR.glob("*.jsonl.gz"))]


# ---------------------------------------------------------------- paths


def is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _walk(folder: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found += [os.path.join(root, f) for f in sorted(files) if not f.startswith((".", "_"))]
    return found


def expand_paths(paths: Sequence[str]) -> list[str]:
    """Local folders and globs become sorted absolute file paths; URIs pass through for Ray Data.

    A local path or glob that matches nothing raises FileNotFoundError naming it.
    """
    files: list[str] = []
    for path in paths:
        if is_uri(path):
            files.append(path)
            continue
        local = os.path.expanduser(path.removeprefix("file://"))
        is_glob = any(c in local for c in "*?[")
        matches = sorted(glob.glob(local, recursive=True)) if is_glob else [local] * os.path.exists(local)
        if not matches:
            raise UserError(f"corpus path not found: {path}")
        for match in matches:
            files += _walk(match) if os.path.isdir(match) else [match]
    return list(dict.fromkeys(os.path.abspath(f) if not is_uri(f) else f for f in files))


# ---------------------------------------------------------------- cleaning


@functools.cache
def _unwanted_chars() -> re.Pattern:
    """Control (except whitespace, which the collapse handles), format, surrogate and private-use
    characters. Built once per process from the running Python's Unicode tables (~0.5 s)."""
    ranges: list[list[int]] = []
    for code in range(0x110000):
        char = chr(code)
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co") and not char.isspace():
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    return re.compile("[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges) + "]")


def clean_text(text: str) -> str:
    """NFKC, unwanted characters removed, whitespace runs collapsed to one space, stripped."""
    if not text.isascii():  # NFKC is the identity on ASCII, the common case
        text = unicodedata.normalize("NFKC", text)
    return " ".join(_unwanted_chars().sub("", text).split())


# ---------------------------------------------------------------- parsing one file


def _format_of(path: str) -> tuple[str | None, bool]:
    name = path.lower()
    gzipped = name.endswith(".gz")
    return _FORMATS.get(os.path.splitext(name.removesuffix(".gz"))[1]), gzipped


def _decode_lines(data: bytes) -> tuple[list[str], int]:
    """Lines of a UTF-8 text and the number of lines that did not decode (dropped, not the file).

    Split at "\n" only: str.splitlines() also splits at U+2028 and friends, which JSON allows
    unescaped inside strings.
    """
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return [line.removesuffix("\r") for line in data.decode("utf-8").split("\n")], 0
    except UnicodeDecodeError:
        pass
    lines, bad = [], 0
    for raw in data.split(b"\n"):
        try:
            lines.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError:
            bad += 1
    return lines, bad


def _txt_records(lines: list[str]) -> Iterator[str]:
    """Blank-line-separated documents, their lines joined with a space."""
    paragraph: list[str] = []
    for line in [*lines, ""]:  # the sentinel blank line closes the last document
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            yield " ".join(paragraph)
            paragraph = []


def _jsonl_records(lines: list[str], skipped: collections.Counter) -> Iterator[str]:
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            skipped["bad_json"] += 1
            continue
        text = row.get("text") if isinstance(row, dict) else None
        if isinstance(text, str):
            yield text
        else:
            skipped["no_text"] += 1


def _parquet_records(data: bytes, skipped: collections.Counter) -> list[str]:
    table = pq.read_table(io.BytesIO(data))
    values = table.column("text").to_pylist() if "text" in table.column_names else [None] * table.num_rows
    skipped["no_text"] += sum(not isinstance(v, str) for v in values)
    return [v for v in values if isinstance(v, str)]


def _keep(records: Iterable[str], max_record_chars: int, skipped: collections.Counter) -> tuple[list[str], dict[str, int]]:
    docs = []
    for raw in records:
        if len(raw) > max_record_chars:  # checked before cleaning: NFKC on a 100 MB "record" is wasted work
            skipped["too_long"] += 1
        elif text := clean_text(raw):
            docs.append(text)
        else:
            skipped["empty"] += 1
    return docs, {reason: n for reason, n in skipped.items() if n}


def parse_file(path: str, data: bytes, max_record_chars: int = DEFAULT_MAX_RECORD_CHARS) -> tuple[list[str], dict[str, int]]:
    """Cleaned documents of one file's raw bytes, and what was skipped by reason. Never raises on content."""
    kind, gzipped = _format_of(path)
    if kind is None:
        return [], {"unsupported_format": 1}
    skipped: collections.Counter = collections.Counter()
    try:
        data = gzip.decompress(data) if gzipped else data
        if kind == "parquet":
            records = _parquet_records(data, skipped)
            empty = not records and not sum(skipped.values())  # no rows at all
            return ([], {"empty_file": 1}) if empty else _keep(records, max_record_chars, skipped)
    except (OSError, EOFError, zlib.error, pa.ArrowException):  # a broken archive or parquet file
        return [], {"unreadable_file": 1}
    if not data.strip():
        return [], {"empty_file": 1}
    if b"\x00" in data:
        return [], {"binary_file": 1}
    lines, bad = _decode_lines(data)
    if bad > sum(1 for line in lines if line.strip()):  # mostly undecodable: not text at all
        return [], {"binary_file": 1}
    skipped["bad_utf8"] = bad
    records = _txt_records(lines) if kind == "txt" else _jsonl_records(lines, skipped)
    return _keep(records, max_record_chars, skipped)


class _RawBytes(FileBasedDatasource):
    """`ray.data.read_binary_files` without its transparent decompression.

    read_binary_files decompresses .gz inside the read task (the compression is inferred from the
    file name and cannot be turned off), so a truncated archive, the commonest broken download,
    would fail the whole read. Raw bytes let `parse_file` count it as `unreadable_file` instead.
    """

    def resolve_compression(self, path: str, open_args: dict) -> None:
        return None

    def _read_stream(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        yield pa.table({"bytes": pa.array([f.readall()], pa.large_binary())})

    def _rows_per_file(self) -> int:
        return 1


def _clean_file(row: dict, counter: ray.actor.ActorHandle, max_record_chars: int) -> list[dict[str, str]]:
    """Ray Data flat_map UDF: one file row (bytes, path) -> its document rows (text)."""
    path = str(row["path"])
    docs, skipped = parse_file(path, row["bytes"], max_record_chars)
    # Wait for the report: when a pass ends, every count is in the counter.
    ray.get(counter.report.remote(path, len(docs), skipped))
    return [{"text": doc} for doc in docs]


def read_documents(
    paths: Sequence[str],
    max_record_chars: int = DEFAULT_MAX_RECORD_CHARS,
    num_cpus: float = 0.25,
    check_not_empty: bool = True,
) -> tuple[ray.data.Dataset, ray.actor.ActorHandle]:
    """A Ray dataset of cleaned documents (column `text`) and the SkipCounter that tallies drops.

    `num_cpus` is per Ray Data task: fractional, so a data stream next to Train workers that hold
    most CPUs still gets a budget (see docs/design.md section 4: on 2 cores Ray Data otherwise gets none and hangs).
    With `check_not_empty`, one document is pulled right away, file by file until one has it, so that a
    corpus with nothing usable fails here, with the counts, instead of as an empty epoch later.
    """
    files = expand_paths(paths)
    counter = new_skip_counter()
    readable = []
    for path in files:
        if is_uri(path) or os.access(path, os.R_OK):
            readable.append(path)
        else:
            ray.get(counter.report.remote(path, 0, {"unreadable_file": 1}))
    if not readable:
        raise UserError(f"corpus is empty: no readable file in {list(paths)}\n{skip_summary(counter).format()}")

    # One file at a time, not a `take(1)` over the corpus: that would start a read per file and cancel
    # the rest once it has its row. Ray cancels with SIGINT, which a background job's workers inherit
    # ignored, and Ray 2.60 then logs each cancelled read as `_clean_file ... TypeError: 'Handlers'
    # object is not callable`, like a file that failed (docs/design.md section 5.2).
    def has_a_document(path: str) -> bool:
        return bool(_documents([path], counter, max_record_chars, num_cpus).take(1))

    if check_not_empty and not any(has_a_document(path) for path in readable):
        raise UserError(f"corpus is empty after cleaning: {list(paths)}\n{skip_summary(counter).format()}")
    return _documents(readable, counter, max_record_chars, num_cpus), counter


def _documents(
    paths: list[str], counter: ray.actor.ActorHandle, max_record_chars: int, num_cpus: float
) -> ray.data.Dataset:
    """The cleaned documents of `paths`, one file per task."""
    return ray.data.read_datasource(
        _RawBytes(paths, include_paths=True),
        num_cpus=num_cpus,
        override_num_blocks=len(paths),  # one file per read task (see module doc for URI folders)
    ).flat_map(
        # A flat_map, not map_batches: Ray fuses a map_batches into the next one and then bundles
        # batch_size *files* into one task; flat_map keeps one file per task.
        _clean_file,
        num_cpus=num_cpus,
        fn_kwargs={"counter": counter, "max_record_chars": max_record_chars},
    )


def corpus_paths(cfg: DataConfig) -> list[str]:
    """The configured paths (a single string from a `--set data.paths=...` override too), `SHIPPED` standing
    for the shipped corpus's files; none: the shipped corpus (the presets sized for it: `jobs.pretraining.job.
    check_corpus` refuses the others)."""
    paths = [cfg.paths] if isinstance(cfg.paths, str) else list(cfg.paths)
    return [file for path in paths for file in (shipped_corpus() if path == SHIPPED else [path])] or shipped_corpus()
