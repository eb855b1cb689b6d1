"""Continued pretraining of the authors' released COCO-LM (`--init-from` their checkpoint): the stream encodes
and packs with their tokenizer and their special ids, and a run trains from their converted weights."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from jobs.data.config import DataConfig
from jobs.data.corpus import clean_text, shipped_corpus
from jobs.data.schemes import load_scheme
from jobs.data.stream import build_stream, pretraining_batches
from jobs.pretraining import job
from jobs.pretraining.encoders import resolve_encoder
from jobs.pretraining.job import init_config, resolve_init
from jobs.pretraining.context import LoopContext
from model.classifier import load_encoder
from model.export import load_export

FIXTURE = Path(__file__).parent / "fixtures" / "official-cocolm"


def packed_by_hand(documents: list[list[int]], seq_len: int, cls: int, sep: int, pad: int) -> list[list[int]]:
    """The platform's packing written out: [SEP] after each document, blocks of seq_len - 1 under a [CLS],
    the last one padded."""
    tokens = [t for document in documents for t in (*document, sep)]
    body = seq_len - 1
    return [[cls, *tokens[i:i + body], *[pad] * (body - len(tokens[i:i + body]))] for i in range(0, len(tokens), body)]


@pytest.mark.timeout(180)
def test_the_stream_packs_each_document_as_the_authors_tokenizer_encodes_it(ray_local, tmp_path):
    with gzip.open(shipped_corpus()[-1], "rt", encoding="utf-8") as lines:
        texts = [json.loads(line)["text"] for _, line in zip(range(30), lines)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    scheme = load_scheme(FIXTURE)
    # One packing batch holds every document, so the blocks are one packing of the whole corpus, in order.
    cfg = DataConfig(paths=(str(tmp_path / "corpus.jsonl"),), tokenizer_dir=str(FIXTURE), seq_len=32,
                     pack_batch_docs=64, batch_size=8)
    stream = build_stream(cfg, FIXTURE, scheme)
    blocks = np.concatenate([b["input_ids"] for b in stream.blocks.iter_batches(batch_size=None, batch_format="numpy")])
    documents = [scheme.ids(clean_text(t)) for t in texts]
    assert blocks.tolist() == packed_by_hand(documents, 32, cls=0, sep=2, pad=1)  # the authors' [CLS] [SEP] [PAD]
    assert stream.special == scheme.special_tokens and stream.special.mask == 416
    batch = next(pretraining_batches(stream.blocks, cfg, epoch=0, special=stream.special))
    chosen = batch["mask_positions"]
    assert (batch["masked_ids"][chosen] == 416).all() and torch.equal(batch["attention_mask"], batch["input_ids"] != 1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_continued_pretraining_from_the_authors_checkpoint_trains_with_their_ids_and_exports_their_tokenizer(
        ray_local, small_corpus, home, tmp_path, monkeypatch):
    contexts, streams = [], []
    monkeypatch.setattr(job, "LoopContext", lambda *a, **k: contexts.append(LoopContext(*a, **k)) or contexts[-1])
    monkeypatch.setattr(job, "build_stream", lambda *a: streams.append(build_stream(*a)) or streams[-1])
    init = resolve_init(str(FIXTURE), None)
    converted = init.encoder.tokenizer_dir
    # A learning rate too small to move a weight by 1e-5 in two steps: the authors' weights are the source, still.
    overrides = [f"data.paths=[{str(small_corpus)!r}]", "data.seq_len=64", "train.max_steps=2", "train.peak_lr=1e-7",
                 "train.warmup_steps=1"]
    result = job.run(init_config("tiny", "cocolm", overrides, init), init=init)

    theirs = load_scheme(converted).special_tokens
    assert contexts[0].special == theirs and (theirs.cls, theirs.pad, theirs.mask) == (0, 1, 416)  # to the workers
    cfg = init_config("tiny", "cocolm", overrides, init)
    first = next(pretraining_batches(streams[0].blocks, cfg.data, epoch=0, special=streams[0].special))
    assert (first["input_ids"][:, 0] == 0).all() and (first["input_ids"][~first["attention_mask"]] == 1).all()
    client = MlflowClient(result.tracking_uri)
    params = client.get_run(result.run_id).data.params
    assert params["init_from"] == str(FIXTURE) and params["model.pad_token_id"] == "1"
    # The tokenizer's files alone, not the converted weights beside them in the source folder.
    kept = ["dict.txt", "sp.model"]
    assert sorted(Path(a.path).name for a in client.list_artifacts(result.run_id, "tokenizer")) == kept
    assert sorted(p.name for p in (Path(result.checkpoint) / "tokenizer").iterdir()) == kept
    export = Path(client.download_artifacts(result.run_id, "encoder", str(tmp_path / "download")))
    assert (export / "sp.model").is_file() and (export / "dict.txt").is_file()
    assert not (export / "tokenizer.json").exists() and not (export / "official_heads.safetensors").exists()
    expected = load_encoder(converted).state_dict()
    assert all(torch.allclose(v, expected[k], atol=1e-5) for k, v in load_encoder(export).state_dict().items())
    assert load_export(export).config.pad_token_id == 1  # transformers loads it, code checked
    again = resolve_encoder(result.run_id, result.tracking_uri, tmp_path / "sweep")  # fine-tuning's --from
    assert load_scheme(again.tokenizer_dir).special_tokens == theirs
