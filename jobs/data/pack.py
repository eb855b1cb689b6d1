"""Pack a corpus once into a folder of blocks (`jobs.data.blocks_folder`), for the Ray-free learning-curve probe.

    python -m jobs.data.pack --seq-len 128 --vocab-size 8192 --out work/blocks-study [--corpus PATH ...] [--tokenizer DIR]

The blocks come from the pretraining job's own Ray Data stream (read -> clean -> tokenize -> pack) and
tokenizer (trained for the corpus and cached when none is given, as the job does), so the probe
trains on what the job would: give the preset's data.seq_len and data.vocab_size. Ray delivers
blocks in any order; they are sorted before saving, so the same corpus and settings always write
the same file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import ray

from jobs.cli import Range, UserError, option, parse_options, redact, run_main
from jobs.data.config import DataConfig
from jobs.data.blocks_folder import check_out_folder, save_blocks
from jobs.data.skips import skip_summary
from jobs.data.stream import build_stream, check_inputs
from jobs.data.tokenizer import resolve_tokenizer
from jobs.data.tokens import load_tokenizer
from jobs.ray_session import init_ray


@dataclass(frozen=True)
class PackOptions:
    seq_len: int = field(metadata=option("block length T, [CLS] included (the preset's data.seq_len)", bounds=Range(2)))
    out: str = field(metadata=option("folder to write blocks.npy, blocks.json and tokenizer.json to"))
    corpus: tuple[str, ...] = field(default=(), metadata=option(
        "files, folders, globs or URIs (default: data/corpus)", many=True))
    tokenizer: str | None = field(default=None, metadata=option(
        "tokenizer directory (default: train or reuse the cached one for the corpus)"))
    vocab_size: int = field(default=32768, metadata=option("for the default tokenizer only (the preset's data.vocab_size)", bounds=Range(8)))


def pack_corpus(cfg: DataConfig, folder: Path) -> dict:
    """Every block of the stream, sorted, into `folder`; the folder's description."""
    check_inputs(cfg)
    check_out_folder(folder)
    started = not ray.is_initialized()
    init_ray()
    tokenizer_dir = resolve_tokenizer(cfg)
    stream = build_stream(cfg, tokenizer_dir)
    parts = [b["input_ids"] for b in stream.blocks.iter_batches(batch_size=None, batch_format="numpy")]
    print(skip_summary(stream.skips).format())
    if started:  # a session the caller opened stays open
        ray.shutdown()
    if not parts:
        raise UserError(f"the corpus {[redact(p) for p in cfg.paths] or 'data/corpus'} gave no blocks")
    blocks = np.concatenate(parts)
    blocks = blocks[np.lexsort(blocks.T[::-1])]
    meta = save_blocks(blocks, tokenizer_dir, load_tokenizer(str(tokenizer_dir)).get_vocab_size(),
                       [redact(p) for p in cfg.paths] or "shipped", folder)
    print(f"packed {meta['blocks']:,} blocks of {meta['seq_len']} ({meta['tokens']:,} tokens, vocabulary "
          f"{meta['vocab_size']:,}) into {folder}")
    return meta


def run(opts: PackOptions) -> dict:
    cfg = DataConfig(paths=opts.corpus, tokenizer_dir=opts.tokenizer, vocab_size=opts.vocab_size, seq_len=opts.seq_len)
    return pack_corpus(cfg, Path(opts.out))


def main(argv: list[str] | None = None) -> dict:
    return run(parse_options("python -m jobs.data.pack", __doc__, PackOptions, argv))


if __name__ == "__main__":
    run_main(main)
