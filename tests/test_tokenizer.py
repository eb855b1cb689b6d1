"""The tokenizer job: SentencePiece BPE trained through Ray Data, loaded offline by AutoTokenizer."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from jobs.data.corpus import clean_text, shipped_corpus
from jobs.data.tokenizer import SPECIAL_TOKENS
from model.corruption import SpecialTokens

pytestmark = pytest.mark.timeout(180)


def _load(directory: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def _shipped_documents(count: int) -> list[str]:
    docs = []
    for path in shipped_corpus():
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            docs += [clean_text(json.loads(line)["text"]) for _, line in zip(range(count), lines)]
    return docs


def _small_corpus(folder: Path, documents: int = 60) -> Path:
    """Real text (the first Austen chapters), cased, as a .txt file of blank-line-separated documents."""
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(shipped_corpus()[0], "rt", encoding="utf-8") as lines:
        texts = [json.loads(line)["text"] for _, line in zip(range(documents), lines)]
    (folder / "austen.txt").write_text("\n\n".join(t.replace("\n", " ") for t in texts) + "\n", encoding="utf-8")
    return folder


def test_loads_offline_as_fast_tokenizer_with_special_ids_0_to_4(tokenizer_dir):
    tok = _load(tokenizer_dir)
    assert tok.is_fast
    ids = [tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id]
    assert ids == [0, 1, 2, 3, 4]
    assert SpecialTokens(*ids) == SpecialTokens()  # the ids the corruption maths assumes
    assert tok.convert_ids_to_tokens(list(range(5))) == list(SPECIAL_TOKENS)
    assert len(tok) == 1000
    encoded = tok("Hello world")["input_ids"]
    assert encoded[0] == tok.cls_token_id and encoded[-1] == tok.sep_token_id
    assert (tokenizer_dir / "spm.model").is_file() and (tokenizer_dir / "training_info.json").is_file()


def test_uncased_round_trip_is_the_lowercased_cleaned_text(tokenizer_dir):
    tok = _load(tokenizer_dir)
    text = '  The QUICK brown fox\tjumped over the Lazy dog;\n\n she said: "It is a truth universally acknowledged."  '
    ids = tok(text)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == clean_text(text).lower()


def test_fast_tokenizer_matches_sentencepiece_on_real_text(tokenizer_dir):
    import sentencepiece as spm

    tok = _load(tokenizer_dir)
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "spm.model"))
    documents = _shipped_documents(100)
    assert [tok(d, add_special_tokens=False)["input_ids"] for d in documents] == sp.encode(documents)


def test_cli_trains_cased_and_logs_the_directory_to_mlflow(ray_local, tmp_path, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    import jobs.data.tokenizer as tokenizer_job

    monkeypatch.setattr(tokenizer_job, "PROGRESS_EVERY", 50)
    corpus, out, db = _small_corpus(tmp_path / "corpus"), tmp_path / "tok", tmp_path / "mlruns" / "mlflow.db"
    tokenizer_job.main(["--corpus", str(corpus), "--vocab-size", "300", "--out", str(out), "--cased",
                        "--tracking-uri", f"sqlite:///{db}"])
    progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tokenizer: ")]
    assert progress[0].startswith("tokenizer: training SentencePiece BPE, vocab 300")  # no longer silent
    assert any(line.endswith(" s)") and "sentences read" in line for line in progress)
    assert any(line.startswith("tokenizer: trained on ") for line in progress)
    tok = _load(out)
    assert tok.decode(tok("Emma Woodhouse")["input_ids"], skip_special_tokens=True) == "Emma Woodhouse"
    info = json.loads((out / "training_info.json").read_text())
    assert info["cased"] is True and info["documents"] == 60 and info["skipped"] == {}
    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("tokenizers").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["vocab_size"] == "300"
    logged = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "tokenizer")}
    assert {"tokenizer.json", "tokenizer_config.json", "spm.model", "training_info.json"} <= logged


def test_cached_tokenizer_is_trained_once_per_checksum(ray_local, tmp_path, monkeypatch):
    import jobs.data.tokenizer as tokenizer_job

    monkeypatch.setenv("COCOLM_CACHE", str(tmp_path / "cache"))
    corpus = [str(_small_corpus(tmp_path / "corpus"))]
    first = tokenizer_job.cached_default_tokenizer(300, paths=corpus)
    assert first.parent == tmp_path / "cache" / "tokenizers" and (first / "tokenizer.json").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer was trained again")

    monkeypatch.setattr(tokenizer_job, "train_tokenizer", no_training)
    assert tokenizer_job.cached_default_tokenizer(300, paths=corpus) == first
    assert tokenizer_job.tokenizer_key(corpus, 301, False) != first.name  # vocab size is in the key
    assert tokenizer_job.tokenizer_key(corpus, 300, True) != first.name  # and case
    assert (tmp_path / "cache" / "tokenizers").stat().st_mode & 0o777 == 0o700  # owner-only cache


def test_the_cache_key_is_the_corpus_content_not_its_names_and_sizes(tmp_path):
    """A same-size edit (or the same bytes under another name) is judged by content, as is each
    object behind a URI, by its size and modification time as the store lists them."""
    import os

    import pyarrow.fs

    from jobs.data.tokenizer import object_listing, tokenizer_key

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat.\n")
    before = tokenizer_key([str(corpus)], 300, False)
    corpus.write_text("the dog sat on the mat.\n")  # same name, same size, other text
    assert tokenizer_key([str(corpus)], 300, False) != before
    renamed = tmp_path / "renamed.txt"
    renamed.write_text("the cat sat on the mat.\n")
    assert tokenizer_key([str(renamed)], 300, False) == before  # the bytes decide, not the name
    local = pyarrow.fs.LocalFileSystem()
    listed = object_listing(local, str(tmp_path))
    os.utime(renamed, ns=(10**18, 10**18))  # an object rewritten in place: same size, new time
    assert object_listing(local, str(tmp_path)) != listed


def test_a_tokenizer_directory_gives_its_own_files_alone(tokenizer_dir, tmp_path):
    """What a checkpoint and a run keep of a tokenizer directory, which may be a whole encoder directory
    (`--init-from` an export or the authors' converted checkpoint): never the weights beside it."""
    import shutil

    from jobs.data.tokens import tokenizer_files

    ours = tmp_path / "export"
    shutil.copytree(tokenizer_dir, ours)
    for other in ("model.safetensors", "config.json", "code_manifest.json", "lm_head.safetensors"):
        (ours / other).write_text("{}")
    assert sorted(p.name for p in tokenizer_files(ours)) == sorted(p.name for p in tokenizer_dir.iterdir())
    theirs = tmp_path / "converted"
    theirs.mkdir()
    for name in ("sp.model", "dict.txt", "pytorch_model.bin", "official_heads.safetensors"):
        (theirs / name).write_text("x")
    assert [p.name for p in tokenizer_files(theirs)] == ["sp.model", "dict.txt"]
