"""Tokenizer job: SentencePiece BPE (the paper's choice) trained on a corpus read through Ray Data.

    python -m jobs.data.tokenizer [--corpus PATH ...] --vocab-size N --out DIR [--cased] [--tracking-uri URI]

The output directory loads offline with `transformers.AutoTokenizer.from_pretrained(DIR)` as a
fast tokenizer whose special tokens are [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, the order
`model.corruption.SpecialTokens` assumes; `encode` adds [CLS] ... [SEP]. It also keeps the raw
SentencePiece model (`spm.model`) and `training_info.json` (corpus, sentence count, skip counts).

Why a conversion: transformers 5's `AlbertTokenizer(vocab_file=...)` silently ignores the file,
so the trained SentencePiece model is rebuilt with the `tokenizers` library: the same pieces,
BPE merges ordered by piece score, SentencePiece's own precompiled normaliser (NFKC, plus case
folding when uncased) and its whitespace handling (Metaspace). The test suite checks the fast
tokenizer gives the same ids as SentencePiece on real text.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.fs
import ray
import sentencepiece as spm
from mlflow.tracking import MlflowClient
from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import generate_merges

from jobs.cli import AT_LEAST_ONE, OPEN_FRACTION, Range, UserError, option, parse_options, redact, run_main
from jobs.data.config import DEFAULT_MAX_RECORD_CHARS, DataConfig
from jobs.data.corpus import corpus_paths, expand_paths, is_uri, read_documents, shipped_corpus
from jobs.data.skips import skip_summary
from jobs.ray_session import init_ray
from jobs.tracking import check_tracking, end_run, experiment_id, log_params, private_files, private_folder

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4: model.corruption.SpecialTokens
SPM_FILE = "spm.model"
PROGRESS_EVERY = 100_000  # sentences between progress lines while the corpus streams in
INFO_FILE = "training_info.json"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# SentencePiece silently drops training sentences over max_sentence_length (4192 bytes by
# default), which would lose every long document; 1000 characters fit even at 4 bytes each.
_MAX_SENTENCE_CHARS = 1000


def split_sentences(text: str) -> list[str]:
    """Rough sentence split (after . ! ?), long pieces cut at a space, for SentencePiece's input."""
    sentences = []
    for piece in _SENTENCE_END.split(text):
        while len(piece) > _MAX_SENTENCE_CHARS:
            cut = piece.rfind(" ", 0, _MAX_SENTENCE_CHARS)
            cut = cut if cut > 0 else _MAX_SENTENCE_CHARS
            sentences.append(piece[:cut])
            piece = piece[cut:].lstrip()
        if piece:
            sentences.append(piece)
    return sentences


def _sentences_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Ray Data UDF: documents -> sentences."""
    sentences = [s for text in batch["text"] for s in split_sentences(str(text))]
    return {"text": np.array(sentences, dtype=object)}


def _training_sentences(
    paths: Sequence[str], max_sentences: int, sample_fraction: float, seed: int, max_record_chars: int
) -> tuple[Iterator[str], ray.actor.ActorHandle]:
    documents, counter = read_documents(paths, max_record_chars)
    sentences = documents.map_batches(_sentences_batch, batch_format="numpy", num_cpus=0.25)
    if sample_fraction < 1.0:  # a big corpus: sample across all files before the cap
        sentences = sentences.random_sample(sample_fraction, seed=seed)
    sentences = sentences.limit(max_sentences)
    # In file order, so that the same corpus and seed give the same tokenizer.
    sentences.context.execution_options.preserve_order = True
    return (row["text"] for row in sentences.iter_rows()), counter


def _train_spm(sentences: Iterator[str], vocab_size: int, model_file: Path, cased: bool, max_sentences: int) -> None:

    spm.set_random_generator_seed(0)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences,
            model_prefix=str(model_file.with_suffix("")),
            model_type="bpe",
            vocab_size=vocab_size,
            # nmt_nfkc_cf = NFKC + case folding: the uncased (lower-case) normalisation
            normalization_rule_name="nmt_nfkc" if cased else "nmt_nfkc_cf",
            pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
            control_symbols=list(SPECIAL_TOKENS[2:]),  # ids 2, 3, 4, right after pad and unk
            input_sentence_size=max_sentences,
            shuffle_input_sentence=True,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as error:
        raise UserError(f"SentencePiece training failed (vocab {vocab_size} too big for the corpus?): {error}") from error


def to_fast_tokenizer(model_file: Path, cased: bool) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer with the same pieces, merges and normalisation as `model_file`."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    scores = [(p.piece, p.score) for p in proto.pieces]
    vocab = {piece: i for i, (piece, _) in enumerate(scores)}
    merges = generate_merges(vocab, scores, skip_tokens=SPECIAL_TOKENS)  # SentencePiece merges by piece score
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="[UNK]", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
        normalizers.Strip(),  # SentencePiece's remove_extra_whitespaces
        normalizers.Replace(Regex(" {2,}"), " "),
    ])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", do_lower_case=not cased, model_max_length=512,
    )


def train_tokenizer(
    paths: Sequence[str],
    vocab_size: int,
    out_dir: str | Path,
    cased: bool = False,
    max_sentences: int = 2_000_000,
    sample_fraction: float = 1.0,
    seed: int = 0,
    max_record_chars: int = DEFAULT_MAX_RECORD_CHARS,
) -> Path:
    """Train SentencePiece BPE on at most `max_sentences` sentences of the corpus; save to `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    say(f"tokenizer: training SentencePiece BPE, vocab {vocab_size}, on up to {max_sentences:,} sentences of "
        f"{len(paths)} corpus path(s) -> {out_dir}")
    sentences, counter = _training_sentences(paths, max_sentences, sample_fraction, seed, max_record_chars)
    used = 0

    def counted() -> Iterator[str]:
        nonlocal used
        for sentence in sentences:
            used += 1
            if used % PROGRESS_EVERY == 0:
                say(f"tokenizer: {used:,} sentences read ({time.perf_counter() - started:.0f} s)")
            yield sentence

    _train_spm(counted(), vocab_size, out_dir / SPM_FILE, cased, max_sentences)
    to_fast_tokenizer(out_dir / SPM_FILE, cased).save_pretrained(str(out_dir))
    say(f"tokenizer: trained on {used:,} sentences in {time.perf_counter() - started:.0f} s")
    summary = skip_summary(counter)  # covers the files read before the sentence cap was reached
    info = {
        "vocab_size": vocab_size, "cased": cased, "model_type": "bpe", "sentences": used,
        "max_sentences": max_sentences, "sample_fraction": sample_fraction, "seed": seed,
        "corpus": [redact(p) for p in paths], "files_read": summary.files, "documents": summary.documents,
        "skipped": summary.skipped, "skipped_files": summary.skipped_files,
    }
    (out_dir / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return out_dir


def say(line: str) -> None:
    print(line, flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("COCOLM_CACHE", Path.home() / ".cache" / "cocolm-ray"))


def tokenizer_key(paths: Sequence[str], vocab_size: int, cased: bool) -> str:
    """Checksum of what determines the tokenizer: the corpus's content (fingerprint), vocab size, case.
    Not file names and sizes: an edit that keeps a file's size, or a changed object behind the same
    URI, must train a new tokenizer."""
    files = [fingerprint(f) for f in expand_paths(paths)]
    blob = json.dumps({"files": files, "vocab_size": vocab_size, "cased": cased, "format": 2}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def fingerprint(path: str) -> list:
    """A local file's SHA-256 (its bytes, whatever its name); a URI's objects as its store lists them,
    each with its size and modification time (reading a remote corpus twice to hash it would cost
    what training the tokenizer does)."""
    if not is_uri(path):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return ["sha256", digest.hexdigest()]
    try:
        fs, root = pyarrow.fs.FileSystem.from_uri(path)
        return ["listing", redact(path), object_listing(fs, root)]
    except (OSError, ValueError) as error:
        raise UserError(f"corpus {redact(path)}: cannot list it ({error})") from None


def object_listing(fs: pyarrow.fs.FileSystem, root: str) -> list[tuple[str, int, int]]:
    """(path, size, modification time in ns) of the file `root`, or of every file under the folder `root`."""
    info = fs.get_file_info(root)
    if info.type == pyarrow.fs.FileType.Directory:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))
    elif info.type == pyarrow.fs.FileType.File:
        infos = [info]
    else:
        raise FileNotFoundError(f"no object at {root}")
    return sorted((i.path, i.size, i.mtime_ns or 0) for i in infos if i.type == pyarrow.fs.FileType.File)


def cached_default_tokenizer(vocab_size: int, cased: bool = False, paths: Sequence[str] | None = None) -> Path:
    """The tokenizer for the shipped corpus (or `paths`), trained once and cached by checksum. The cache
    is owner-only: a tokenizer someone else could replace would decide what every run reads."""
    paths = list(paths) if paths else shipped_corpus()
    target = private_folder(cache_dir() / "tokenizers") / tokenizer_key(paths, vocab_size, cased)
    if (target / "tokenizer.json").exists():
        return target
    staging = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    with private_files():
        train_tokenizer(paths, vocab_size, staging, cased=cased)
    try:
        staging.rename(target)  # atomic: a reader never sees a half-written tokenizer
    except OSError:  # another process finished first; its copy is identical in content
        shutil.rmtree(staging, ignore_errors=True)
    return target


def log_tokenizer(out_dir: Path, tracking_uri: str, experiment: str = "tokenizers") -> str:
    """Log the tokenizer directory as an MLflow artifact (`tokenizer/`); returns the run id."""
    info = json.loads((out_dir / INFO_FILE).read_text())
    check_tracking(tracking_uri)
    client = MlflowClient(tracking_uri)
    case = "cased" if info["cased"] else "uncased"
    run_id = client.create_run(experiment_id(client, experiment, tracking_uri),
                               run_name=f"spm-bpe-{info['vocab_size']}-{case}").info.run_id
    ok = False
    try:
        log_params(client, run_id, {k: info[k] for k in ("vocab_size", "cased", "model_type", "max_sentences",
                                                          "sample_fraction", "seed", "corpus")})
        for key in ("sentences", "documents", "files_read"):
            client.log_metric(run_id, key, info[key])
        for reason, count in info["skipped"].items():
            client.log_metric(run_id, f"skipped_{reason}", count)
        client.log_artifacts(run_id, str(out_dir), artifact_path="tokenizer")
        ok = True
    finally:
        end_run(client, run_id, ok)  # never leave a RUNNING run behind
    return run_id


def resolve_tokenizer(cfg: DataConfig) -> Path:
    """The configured tokenizer directory, else the cached one for the corpus (trained on first use)."""
    if cfg.tokenizer_dir:
        return Path(cfg.tokenizer_dir)
    return cached_default_tokenizer(cfg.vocab_size, cased=cfg.cased, paths=corpus_paths(cfg))


@dataclass(frozen=True)
class TokenizerOptions:
    vocab_size: int = field(metadata=option("pieces in the vocabulary, special tokens included", bounds=Range(8)))
    out: str = field(metadata=option("directory to write the tokenizer to"))
    corpus: tuple[str, ...] = field(default=(), metadata=option(
        "files, folders, globs or URIs (default: data/corpus)", many=True))
    cased: bool = field(default=False, metadata=option("keep case (default: lower-case)"))
    max_sentences: int = field(default=2_000_000, metadata=option("cap on training sentences", bounds=AT_LEAST_ONE))
    sample_fraction: float = field(default=1.0, metadata=option("sample this fraction of sentences first", bounds=OPEN_FRACTION))
    tracking_uri: str | None = field(default=None, metadata=option(
        "MLflow tracking URI: log the tokenizer as an artifact"))


def run(opts: TokenizerOptions) -> Path:
    init_ray()
    out = train_tokenizer(opts.corpus or shipped_corpus(), opts.vocab_size, opts.out, opts.cased, opts.max_sentences,
                          opts.sample_fraction)
    info = json.loads((out / INFO_FILE).read_text())
    print(f"tokenizer: {out} (vocab {opts.vocab_size}, {'cased' if opts.cased else 'uncased'}, "
          f"{info['sentences']} sentences)")
    print(f"documents kept: {info['documents']} from {info['files_read']} files; skipped: {info['skipped'] or 'nothing'}")
    for reason, files in info["skipped_files"].items():
        print(f"  {reason}: {', '.join(files)}")
    if opts.tracking_uri:
        print(f"logged to MLflow run {log_tokenizer(out, opts.tracking_uri)}")
    return out


def main(argv: list[str] | None = None) -> Path:
    return run(parse_options("python -m jobs.data.tokenizer", __doc__, TokenizerOptions, argv))

if __name__ == "__main__":
    run_main(main)
