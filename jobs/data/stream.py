"""The pretraining data stream on Ray Data: read -> clean -> tokenize -> pack -> corrupt.

    documents (jobs.data.corpus)  ->  packed blocks {"input_ids": (seq_len,) int32}  ->  corrupt per batch

Packing: the documents of one tokenize batch are joined into one token stream with [SEP] after
every document and cut into blocks of seq_len - 1 tokens, each block headed by [CLS]. A long
document simply continues in the next block, so no token is lost or repeated; only the last block
of each batch is padded with [PAD] (0.3% of the positions on the shipped corpus at T = 512).
Documents are encoded by the tokenizer directory's scheme (`jobs.data.schemes`: the platform's
tokenizer.json, or the authors' sp.model + dict.txt exactly as their tokenizer encodes), and
[CLS], [SEP], [PAD] and [MASK] are that scheme's ids (`Stream.special`, passed on to `corrupt`).
The scheme travels to the tasks pickled, with the UDF's module (`jobs.data.packing`): what every Ray Data
worker imports is numpy and the tokenizer alone, not this module (torch, Ray Train) and not the authors'
scheme (sentencepiece), which a run that encodes with it has its driver load.

Corruption (dynamic mask + crop, `model.corruption.make_pretraining_batch`) is applied per epoch
on the consumer side, because an epoch number cannot reach a Ray Data UDF once Ray Train has split
the stream. Each block gets its own generator seeded from (seed, epoch, hash of its tokens), so a
block's mask and crop depend on nothing else: the same seed gives every block the same corruption
however Ray schedules, orders, batches or splits the blocks, and a new epoch gives a new mask.
Each epoch is shuffled over `shuffle_buffer` blocks per worker, because the corpus is read file by
file: unshuffled, a model trains on one source after another and forgets the first (on the
shipped corpus the tiny demo's auxiliary MLM accuracy fell from 0.064 to 0.029 when its second
epoch went back from Wikipedia to Austen).

Order: the stream delivers its blocks in corpus order (`preserve_order`), and Ray Train's workers
read it so (`ingest_config`), so the same seed gives the same batches in the same order, run after
run. Without it Ray delivers blocks as its tasks finish: two runs of one seed, one alone and one
beside another run, differed in their loss by step 50 and ended on either side of the gate's [CLS]
bound (docs/design.md section 5.4), and a resumed run's skipped batches were not the ones consumed.
With several workers, Ray's streaming split then hands each block in order to the worker with the fewest
rows so far (locality off under `preserve_order`), so each worker's share is fixed as well.

In a Ray Train worker (any world size, 1 included):

    shard = ray.train.get_dataset_shard("train")  # trainer: datasets={"train": stream.blocks}, dataset_config=ingest_config()
    for batch in pretraining_batches(shard, cfg, epoch):  # the batch contract of model/corruption.py, torch CPU
        ...

or `shard.iter_torch_batches(batch_size=...)` and `corrupt(batch, epoch, cfg.seed, ...)` per batch:
Ray Data hands over numpy (int32 blocks), `corrupt` returns the contract's torch CPU tensors; the
loop moves them to its device.

Resources: every Ray Data task asks for `data_cpus` (0.25) logical CPUs, so the stream still gets a
budget when Train workers hold most CPUs; on a 2-core machine a whole CPU per read task plus the
workers' CPUs leaves Ray Data a budget of 0 and the job hangs silently (docs/design.md section 4).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import ray
import ray.train
import torch

from jobs.cli import UserError
from jobs.data.config import DataConfig
from jobs.data.corpus import corpus_paths, expand_paths, read_documents
from jobs.data.packing import tokenize_and_pack
from jobs.data.tokens import PlatformScheme, scheme_of
from model.config import SpecialTokens
from model.corruption import make_pretraining_batch


class Stream(NamedTuple):
    blocks: ray.data.Dataset  # packed blocks, column input_ids (seq_len,) int32
    skips: ray.actor.ActorHandle  # jobs.data.skips.SkipCounter: `skip_summary(skips)` after an epoch
    tokenizer_dir: Path  # saved with checkpoints; its vocabulary is the model's
    long_blocks: ray.data.Dataset | None = None  # the same documents in blocks of long_seq_len, if it is set
    special: SpecialTokens = SpecialTokens()  # the tokenizer's ids, which the blocks hold and corruption uses


def check_inputs(cfg: DataConfig, schemes: tuple[str, ...] = ("platform",)) -> None:
    """Missing local corpus paths and a tokenizer directory without a tokenizer of `schemes` are errors that
    name them, raised before Ray starts (cloud URIs are checked when Ray Data reads them). The stream packs
    and corrupts with either scheme; the pretraining job takes both, the packed-blocks tools (`jobs.data.pack`,
    the stream bench) read the platform's tokenizer.json alone."""
    expand_paths(corpus_paths(cfg))
    if not cfg.tokenizer_dir:
        return
    try:
        scheme = scheme_of(cfg.tokenizer_dir)
    except UserError as error:
        raise UserError(f"tokenizer directory {error}: train one with `python -m jobs.data.tokenizer --out DIR`, or "
                        f"leave --tokenizer out") from None
    if scheme not in schemes:
        raise UserError(f"tokenizer directory {cfg.tokenizer_dir} holds the authors' tokenizer (sp.model + dict.txt), "
                        f"and this tool reads a platform tokenizer.json; pretraining takes it (python -m "
                        f"jobs.pretraining --init-from their checkpoint)")


def build_stream(cfg: DataConfig, tokenizer_dir: Path, scheme=None) -> Stream:
    """The lazy dataset of packed blocks; nothing runs until it is iterated (or split by Ray Train).
    `tokenizer_dir` is `jobs.data.tokenizer.resolve_tokenizer(cfg)` and `scheme` the tokenizer it holds
    (`jobs.data.schemes.load_scheme`; None: its platform tokenizer.json), resolved by the caller so that
    the UDF's module (jobs.data.packing), which every Ray Data worker imports, imports no tokenizer
    training and no authors' scheme (sentencepiece, transformers, mlflow)."""
    # The tokenizer travels with the task, pickled, not as a path: the driver's cache dir may not exist on the
    # node that runs it.
    scheme = scheme or PlatformScheme(tokenizer_dir)
    documents, skips = read_documents(corpus_paths(cfg), cfg.max_record_chars, num_cpus=cfg.data_cpus)
    long_blocks = _packed(documents, cfg, scheme, cfg.long_seq_len) if cfg.long_seq_len else None
    return Stream(_packed(documents, cfg, scheme, cfg.seq_len), skips, tokenizer_dir, long_blocks,
                  scheme.special_tokens)


def _packed(documents: ray.data.Dataset, cfg: DataConfig, scheme, seq_len: int) -> ray.data.Dataset:
    """The documents in blocks of `seq_len`, in corpus order. A second length reads the corpus again (the skip
    counter sets each file's counts, so they are not doubled)."""
    blocks = documents.map_batches(
        tokenize_and_pack,
        batch_size=cfg.pack_batch_docs,
        batch_format="numpy",
        num_cpus=cfg.data_cpus,
        fn_kwargs={"scheme": scheme, "seq_len": seq_len},
    )
    blocks.context.target_max_block_size = cfg.block_bytes  # this dataset's context: applies to every stage
    blocks.context.execution_options.preserve_order = True  # corpus order when iterated here (Ray Train: ingest_config)
    return blocks


def ingest_config() -> ray.train.DataConfig:
    """Ray Train's ingest options with the stream's order kept: Ray Train replaces a dataset's own
    execution options by these (taken from the driver's global DataContext), so `build_stream`'s
    `preserve_order` alone would not reach the workers."""
    with warnings.catch_warnings():  # Ray 2.60's own call passes a deprecated option; nothing for the user to act on
        warnings.filterwarnings("ignore", message=".*exclude_resources")
        options = ray.train.DataConfig.default_ingest_options()
    options.preserve_order = True
    return ray.train.DataConfig(execution_options=options)


def block_seed(seed: int, epoch: int, block: np.ndarray) -> int:
    """A 63-bit seed from (seed, epoch, the block's tokens): independent of batching and order."""
    digest = hashlib.blake2b(np.asarray(block, dtype="<i4").tobytes(), digest_size=8, key=f"{seed}:{epoch}".encode())
    return int.from_bytes(digest.digest(), "little") >> 1


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of one epoch: a new order every epoch, the same for the same (seed, epoch)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def corrupt(
    batch: Mapping[str, np.ndarray | torch.Tensor],
    epoch: int,
    seed: int,
    mask_rate: float = 0.15,
    crop_fraction: float = 0.9,
    special: SpecialTokens = SpecialTokens(),
) -> dict[str, torch.Tensor]:
    """Packed blocks {"input_ids": (B, T)} -> the batch contract of model/corruption.py (CPU tensors), with
    the ids of the tokenizer that packed them (`Stream.special`).

    Each block draws from its own seeded generator (see module doc), in one `make_pretraining_batch` call.
    """
    blocks = np.asarray(batch["input_ids"])
    generators = [torch.Generator().manual_seed(block_seed(seed, epoch, block)) for block in blocks]
    return make_pretraining_batch(torch.as_tensor(blocks).long(), mask_rate, crop_fraction, generators, special)


def pretraining_batches(
    source: ray.data.Dataset | ray.data.DataIterator, cfg: DataConfig, epoch: int, drop_last: bool = False,
    skip: int = 0, special: SpecialTokens = SpecialTokens(),
) -> Iterator[dict[str, torch.Tensor]]:
    """One epoch of corrupted batches from the whole stream or from a worker's shard, shuffled over
    `cfg.shuffle_buffer` blocks with a seed of (seed, epoch). The first `skip` batches (consumed
    before a resume) are read past without being corrupted: the same seed puts the same blocks
    there, because the stream keeps its order (`build_stream`, `ingest_config`)."""
    batches = source.iter_batches(
        batch_size=cfg.batch_size, batch_format="numpy", drop_last=drop_last,
        local_shuffle_buffer_size=cfg.shuffle_buffer or None,
        local_shuffle_seed=epoch_seed(cfg.seed, epoch) if cfg.shuffle_buffer else None,
    )
    for index, batch in enumerate(batches):
        if index >= skip:
            yield corrupt(batch, epoch, cfg.seed, cfg.mask_rate, cfg.crop_fraction, special)


def _corrupt_numpy(batch: dict[str, np.ndarray], epoch: int, seed: int, mask_rate: float, crop_fraction: float,
                   special: SpecialTokens):
    return {k: v.numpy() for k, v in corrupt(batch, epoch, seed, mask_rate, crop_fraction, special).items()}


def corrupted(blocks: ray.data.Dataset, cfg: DataConfig, epoch: int,
              special: SpecialTokens = SpecialTokens()) -> ray.data.Dataset:
    """The same corruption as a Ray Data stage (numpy columns), for consumers outside Ray Train."""
    return blocks.map_batches(
        _corrupt_numpy,
        batch_size=cfg.batch_size,
        batch_format="numpy",
        num_cpus=cfg.data_cpus,
        fn_kwargs={"epoch": epoch, "seed": cfg.seed, "mask_rate": cfg.mask_rate, "crop_fraction": cfg.crop_fraction,
                   "special": special},
    )
