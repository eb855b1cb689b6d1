"""The Ray Data stream: reading and cleaning with counted skips, packing, dynamic corruption, splitting."""

from __future__ import annotations

import collections
import gzip
import json
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch

from jobs.cli import UserError
from jobs.data import corpus as corpus_module
from jobs.data.config import DataConfig
from jobs.data.corpus import clean_text, read_documents, shipped_corpus
from jobs.data.packing import pack
from jobs.data.skips import skip_summary
from jobs.data.stream import build_stream, corrupt, pretraining_batches
from jobs.data.tokenizer import resolve_tokenizer
from model.corruption import SpecialTokens

pytestmark = pytest.mark.timeout(120)
SPECIAL = SpecialTokens()
SEQ_LEN = 64


def _shipped_texts(count: int, skip: int = 0) -> list[str]:
    """Real documents from the shipped corpus (Wikipedia leads), raw."""
    with gzip.open(shipped_corpus()[-1], "rt", encoding="utf-8") as lines:
        rows = [json.loads(line)["text"] for _, line in zip(range(skip + count), lines)]
    return rows[skip:]


def _write_jsonl(path: Path, rows: list[object]) -> None:
    lines = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(lines) if path.suffix == ".gz" else lines)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    """A folder of real text in every format, and its documents after cleaning."""
    folder = tmp_path_factory.mktemp("corpus")
    texts = _shipped_texts(240)
    _write_jsonl(folder / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts[:60])])
    _write_jsonl(folder / "b.jsonl.gz", [{"text": t} for t in texts[60:120]])
    (folder / "c.txt").write_text("\n\n".join(t.replace("\n", " ") for t in texts[120:180]) + "\n")
    pq.write_table(pa.table({"text": texts[180:]}), folder / "d.parquet")
    return folder, [clean_text(t.replace("\n", " ")) for t in texts]


@pytest.fixture(scope="module")
def stream(ray_local, corpus, tokenizer_dir):
    cfg = DataConfig(paths=(str(corpus[0]),), tokenizer_dir=str(tokenizer_dir), seq_len=SEQ_LEN, pack_batch_docs=16,
                     batch_size=32, seed=7, block_bytes=16 << 10,  # small blocks: several per shard
                     long_seq_len=2 * SEQ_LEN)  # a long phase's blocks, lazy: read only where a test reads them
    return cfg, build_stream(cfg, resolve_tokenizer(cfg))


@pytest.fixture(scope="module")
def blocks(stream) -> np.ndarray:
    return np.concatenate([b["input_ids"] for b in stream[1].blocks.iter_batches(batch_size=None, batch_format="numpy")])


def _documents_in(blocks: np.ndarray) -> list[tuple[int, ...]]:
    """Undo packing: drop [CLS] and [PAD], split the token stream at [SEP]."""
    tokens = blocks[:, 1:].reshape(-1)
    tokens = tokens[tokens != SPECIAL.pad]
    ends = np.flatnonzero(tokens == SPECIAL.sep)
    starts = np.concatenate([[0], ends[:-1] + 1])
    assert len(ends) and ends[-1] == len(tokens) - 1, "every document ends with [SEP]"
    return [tuple(tokens[s:e]) for s, e in zip(starts, ends)]


# ---------------------------------------------------------------- packing


def test_pack_keeps_every_token_in_order():
    rng = random.Random(0)
    documents = [[rng.randrange(5, 999) for _ in range(rng.choice([0, 1, 5, 40, 63, 64, 200]))] for _ in range(300)]
    blocks = pack(documents, 16)
    assert blocks.shape[1] == 16 and blocks.dtype == np.int32
    assert (blocks[:, 0] == SPECIAL.cls).all() and (blocks[:, 1:] != SPECIAL.cls).all()
    assert (blocks[:-1] != SPECIAL.pad).all(), "only the last block is padded"
    assert _documents_in(blocks) == [tuple(d) for d in documents]


def test_stream_keeps_every_token_of_every_document(stream, blocks, corpus, tokenizer_dir):
    from jobs.data.tokens import load_tokenizer

    expected = [tuple(e.ids) for e in load_tokenizer(str(tokenizer_dir)).encode_batch(corpus[1], add_special_tokens=False)]
    assert blocks.shape[1] == SEQ_LEN and (blocks[:, 0] == SPECIAL.cls).all()
    # Undoing the packing needs the blocks in packing order: the stream keeps it (preserve_order), though
    # Ray splits one pack call's output into several Ray blocks (block_bytes) that it could deliver in any order.
    assert collections.Counter(_documents_in(blocks)) == collections.Counter(expected)
    summary = skip_summary(stream[1].skips)
    assert (summary.files, summary.documents, summary.skipped) == (4, 240, {})


def test_the_long_phase_stream_packs_the_same_documents_in_longer_blocks(stream, blocks):
    long = np.concatenate([b["input_ids"] for b in stream[1].long_blocks.iter_batches(batch_size=None,
                                                                                       batch_format="numpy")])
    assert long.shape[1] == 2 * SEQ_LEN and (long[:, 0] == SPECIAL.cls).all()
    assert _documents_in(long) == _documents_in(blocks)  # every document, in corpus order
    summary = skip_summary(stream[1].skips)  # a second pass over the files sets their counts, never adds
    assert (summary.files, summary.documents) == (4, 240)


# ---------------------------------------------------------------- corruption


def test_mask_rate_is_15_percent_and_never_cls_or_padding(blocks):
    batch = corrupt({"input_ids": blocks}, epoch=0, seed=0)
    positions, lengths = batch["mask_positions"], batch["attention_mask"].sum(1)
    counts = positions.sum(1)
    floor = (0.15 * lengths.double()).floor().long()
    assert ((counts == floor) | (counts == floor + 1)).all()  # int(0.15 * length + U[0, 1)) per block
    assert abs(counts.sum().item() / (0.15 * lengths.sum().item()) - 1) < 0.01
    assert not positions[:, 0].any() and not (positions & ~batch["attention_mask"]).any()
    assert torch.equal(batch["masked_ids"][positions], torch.full_like(batch["masked_ids"][positions], SPECIAL.mask))
    assert torch.equal(batch["masked_ids"][~positions], batch["input_ids"][~positions])


def test_crops_have_length_int_09_t_and_keep_cls_first(blocks):
    batch = corrupt({"input_ids": blocks}, epoch=0, seed=0)
    crop_ids, crop_mask = batch["crop_ids"], batch["crop_attention_mask"]
    assert crop_ids.shape == (len(blocks), int(0.9 * SEQ_LEN))
    lengths = batch["attention_mask"].sum(1)
    assert torch.equal(crop_mask.sum(1), (0.9 * lengths.double()).floor().long())
    assert (crop_ids[:, 0] == SPECIAL.cls).all()
    for row, crop, length in zip(batch["input_ids"], crop_ids, crop_mask.sum(1)):  # a contiguous span
        span, source = crop[1:length].tolist(), row[1:].tolist()
        assert any(source[i : i + len(span)] == span for i in range(len(source) - len(span) + 1))


def test_same_seed_same_batches_whatever_the_order(blocks):
    batch = {"input_ids": blocks[:64]}
    first, again = corrupt(batch, 0, 7), corrupt(batch, 0, 7)
    reordered = corrupt({"input_ids": blocks[:64][::-1].copy()}, 0, 7)
    for key in first:
        assert torch.equal(first[key], again[key]) and torch.equal(first[key], reordered[key].flip(0))
    assert not torch.equal(first["mask_positions"], corrupt(batch, 1, 7)["mask_positions"])  # a new epoch, a new mask
    assert not torch.equal(first["mask_positions"], corrupt(batch, 0, 8)["mask_positions"])


def test_two_passes_of_the_ray_stream_give_the_same_batches(stream):
    cfg, (blocks, *_) = stream

    def by_block(epoch: int) -> dict[bytes, bytes]:
        return {row.numpy().tobytes(): masked.numpy().tobytes()
                for batch in pretraining_batches(blocks, cfg, epoch)
                for row, masked in zip(batch["input_ids"], batch["masked_ids"])}

    first = by_block(0)
    assert by_block(0) == first
    assert by_block(1) != first


def test_each_epoch_is_shuffled_afresh_across_sources_and_keeps_every_block(ray_local):
    """The corpus arrives file by file; an epoch must mix the files (here two sources of 20 blocks,
    in order), hold every block once, repeat for the same (seed, epoch) and differ for the next."""
    blocks = ray.data.from_items([{"input_ids": np.full(8, 10 + i, dtype=np.int32)} for i in range(40)])
    cfg = DataConfig(seq_len=8, batch_size=4, seed=3)

    def order(epoch: int, config: DataConfig = cfg) -> list[int]:
        return [int(row[0]) for b in pretraining_batches(blocks, config, epoch) for row in b["input_ids"]]

    first = order(0)
    assert sorted(first) == list(range(10, 50))
    first_half = first[:20]
    assert any(i < 30 for i in first_half) and any(i >= 30 for i in first_half)  # both sources early on
    assert order(0) == first and order(1) != first
    assert order(0, DataConfig(seq_len=8, batch_size=4, shuffle_buffer=0)) == list(range(10, 50))


def test_skip_resumes_an_epoch_after_the_consumed_batches(ray_local):
    blocks = ray.data.from_items([{"input_ids": np.full(8, 10 + i, dtype=np.int32)} for i in range(10)])
    cfg = DataConfig(seq_len=8, batch_size=2)
    whole = [b["input_ids"] for b in pretraining_batches(blocks, cfg, epoch=0)]
    resumed = list(pretraining_batches(blocks, cfg, epoch=0, skip=3))
    assert len(whole) == 5 and len(resumed) == 2
    assert all(torch.equal(a, b["input_ids"]) for a, b in zip(whole[3:], resumed))


# ---------------------------------------------------------------- splitting for Ray Train


def test_two_workers_get_disjoint_shards_that_cover_the_corpus(stream, blocks):
    # equal=False: equal=True may drop rows to even the shards out, which would lose tokens.
    shards = stream[1].blocks.streaming_split(2, equal=False)
    seen: list[list[bytes]] = [[], []]

    def consume(rank: int) -> None:  # the iterators must be consumed concurrently, or the split stalls
        for batch in shards[rank].iter_batches(batch_size=8, batch_format="numpy"):
            seen[rank] += [row.tobytes() for row in batch["input_ids"]]

    threads = [threading.Thread(target=consume, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    whole = collections.Counter(row.tobytes() for row in blocks)
    assert max(whole.values()) == 1
    assert seen[0] and seen[1]
    assert not set(seen[0]) & set(seen[1])
    assert collections.Counter(seen[0] + seen[1]) == whole


@pytest.mark.slow
def test_a_ray_train_worker_reads_the_stream_in_corpus_order(stream, blocks, tmp_path):
    """The same seed must give the same batches: Ray Train replaces the dataset's own execution options
    with its ingest options, so the job passes `ingest_config()`, which keeps the stream's order."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from jobs.data.stream import ingest_config

    assert ingest_config()._resolve_execution_options("train").preserve_order
    assert stream[1].blocks.context.execution_options.preserve_order  # iterated directly (pack, curves)

    def loop(config: dict) -> None:
        import ray.train

        shard = ray.train.get_dataset_shard("train")
        rows = [row.tobytes().hex() for b in shard.iter_batches(batch_size=8, batch_format="numpy") for row in b["input_ids"]]
        Path(config["out"], "order.json").write_text(json.dumps(rows))

    TorchTrainer(
        loop, train_loop_config={"out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
        datasets={"train": stream[1].blocks}, dataset_config=ingest_config(),
        run_config=RunConfig(name="order-test", storage_path=str(tmp_path / "ray")),
    ).fit()
    read = json.loads((tmp_path / "order.json").read_text())
    assert read == [row.tobytes().hex() for row in blocks]  # the blocks fixture: iterated in corpus order


# ---------------------------------------------------------------- bad input


def test_each_kind_of_bad_input_is_skipped_and_counted(ray_local, tmp_path):
    good = _shipped_texts(4, skip=300)
    _write_jsonl(tmp_path / "mixed.jsonl", [
        {"text": good[0]},
        '{"text": "a broken line',  # bad_json
        {"text": "   \n\t "},  # empty
        {"text": "\u200b\x00\x07"},  # empty after removing control and format characters
        {"text": "x" * 1001},  # too_long
        {"title": "no text field"},  # no_text
        {"text": None},  # no_text
        {"text": good[1]},
    ])
    with open(tmp_path / "mixed.jsonl", "ab") as f:
        f.write(b'{"text": "caf\xe9 latin-1 is not UTF-8"}\n')  # bad_utf8
    (tmp_path / "broken.txt").write_bytes(  # 2x bad_utf8: a few broken lines in a text file drop only those lines
        good[2].encode() + b"\n\xff\xfe broken line\n\n" + good[3].encode() + b"\n\n\xc3\x28\n")
    (tmp_path / "junk.txt").write_bytes(bytes(range(256)) * 4)  # binary_file: NUL bytes
    (tmp_path / "latin.txt").write_bytes(bytes(range(128, 256)) * 8)  # binary_file: no line decodes
    (tmp_path / "truncated.jsonl.gz").write_bytes(gzip.compress(b'{"text": "cut short"}\n' * 50)[:40])  # unreadable
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # unsupported_format
    pq.write_table(pa.table({"text": ["parquet row", None]}), tmp_path / "rows.parquet")  # + no_text
    (tmp_path / "nothing.txt").write_bytes(b"")  # empty_file
    (tmp_path / "blank.jsonl.gz").write_bytes(gzip.compress(b"\n  \n"))  # empty_file: whitespace only

    documents, counter = read_documents([str(tmp_path)], max_record_chars=1000)
    kept = sorted(documents.to_pandas()["text"])
    assert kept == sorted([clean_text(t) for t in good] + ["parquet row"])
    summary = skip_summary(counter)
    assert summary.skipped == {"bad_json": 1, "empty": 2, "too_long": 1, "no_text": 3, "bad_utf8": 3,
                               "binary_file": 2, "unreadable_file": 1, "unsupported_format": 1, "empty_file": 2}
    assert summary.skipped_files == {"binary_file": [str(tmp_path / "junk.txt"), str(tmp_path / "latin.txt")],
                                     "unreadable_file": [str(tmp_path / "truncated.jsonl.gz")],
                                     "unsupported_format": [str(tmp_path / "picture.png")],
                                     "empty_file": [str(tmp_path / "blank.jsonl.gz"), str(tmp_path / "nothing.txt")]}
    assert (summary.files, summary.documents) == (9, 5)
    assert "skipped bad_utf8: 3" in summary.format()


def test_a_corpus_with_nothing_usable_is_a_clear_error(ray_local, tmp_path):
    _write_jsonl(tmp_path / "blank.jsonl", [{"text": " "}, {"text": "\x00"}])
    (tmp_path / "junk.txt").write_bytes(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="corpus is empty") as error:
        read_documents([str(tmp_path)])
    assert str(tmp_path) in str(error.value) and "skipped empty: 2" in str(error.value)
    assert "skipped binary_file: 1" in str(error.value)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match="corpus is empty"):
        read_documents([str(tmp_path / "nothing")])


def test_the_empty_corpus_check_reads_one_file_at_a_time_until_one_has_a_document(ray_local, tmp_path, monkeypatch):
    """A `take(1)` over several files would start a read per file and cancel the rest (see the next test)."""
    _write_jsonl(tmp_path / "a_blank.jsonl", [{"text": " "}])
    for name in ("b.jsonl", "c.jsonl"):
        _write_jsonl(tmp_path / name, [{"text": t} for t in _shipped_texts(2)])
    asked = []
    documents_of = corpus_module._documents

    def recorded(paths, *args):
        asked.append([Path(p).name for p in paths])
        return documents_of(paths, *args)

    monkeypatch.setattr(corpus_module, "_documents", recorded)
    documents, _ = read_documents([str(tmp_path)])
    assert asked == [["a_blank.jsonl"], ["b.jsonl"], ["a_blank.jsonl", "b.jsonl", "c.jsonl"]]
    assert documents.count() == 4


@pytest.mark.slow
def test_a_job_started_in_the_background_by_a_script_reports_no_cancelled_file(tmp_path):
    """A script's `job &` inherits SIGINT ignored, and so do its Ray workers; Ray cancels a task with
    SIGINT, and a cancelled task in such a worker is logged as `TypeError: 'Handlers' object is not
    callable` from `_clean_file`, as if a file had failed. The check that the corpus is not empty must
    start no read it then cancels: a small file first, then the shipped corpus's three large ones, which
    a `take(1)` over every file would still be reading when the small one gave its row (and then either
    finish, SIGINT being ignored, or fail so)."""
    _write_jsonl(tmp_path / "small.jsonl", [{"text": "A first document, quickly read."}])
    script = (
        "import time\n"
        "import ray\n"
        "from jobs.data.corpus import read_documents, shipped_corpus\n"
        "from jobs.data.skips import skip_summary\n"
        "ray.init(address='local', num_cpus=2, include_dashboard=False)\n"
        f"documents, counter = read_documents([{str(tmp_path / 'small.jsonl')!r}, *shipped_corpus()])\n"
        "time.sleep(8)  # a read started and not cancelled (SIGINT ignored) reports its file meanwhile\n"
        "print('checked', skip_summary(counter).files, 'files', flush=True)\n"
        "print('read', documents.count(), 'documents of', skip_summary(counter).files, 'files', flush=True)\n"
    )
    job = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parents[1], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert job.returncode == 0, job.stderr[-3000:]
    assert "checked 1 files" in job.stdout and "of 4 files" in job.stdout  # the check read the small file alone
    assert "not callable" not in job.stderr and "Unhandled error" not in job.stderr, job.stderr[-3000:]


def test_a_missing_path_is_named(tmp_path):
    for missing in (tmp_path / "no-such-file.jsonl", tmp_path / "no-such-*.txt"):
        with pytest.raises(UserError, match=str(missing).replace("*", r"\*")):
            read_documents([str(missing)])


def test_clean_text():
    assert clean_text("  ﬁne\u00a0day\x00,\u200b\tnew\n\nline  ") == "fine day, new line"
    assert clean_text("\x7f \ufeff") == ""
