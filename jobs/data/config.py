"""What the corpus reader and the stream are configured with (the `data` section of a run config)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_RECORD_CHARS = 1_000_000  # longer corpus records are skipped and counted (jobs.data.corpus)


@dataclass(frozen=True)
class DataConfig:
    """What the stream reads and how it builds batches."""

    paths: tuple[str, ...] = ()  # files, folders, globs or URIs; empty: the shipped corpus
    tokenizer_dir: str | None = None  # None: the cached tokenizer for the corpus (trained on first use)
    vocab_size: int = 32768  # the one vocabulary size: trains the default tokenizer; the job then sets it, and
    #                          model.vocab_size, from the tokenizer it loads (jobs.pretraining.config.with_vocab_size)
    cased: bool = False  # likewise
    seq_len: int = 512  # block length T, [CLS] included
    long_seq_len: int = 0  # the block length of the last train.long_steps steps (BERT's 90/10 recipe: most
    #                        steps on short blocks, the last tenth on the readouts' length, so the absolute
    #                        position embeddings past seq_len are trained); 0 = every step on seq_len
    mask_rate: float = 0.15
    crop_fraction: float = 0.9  # SCL crop length int(crop_fraction * T)
    max_record_chars: int = DEFAULT_MAX_RECORD_CHARS  # longer records are skipped and counted
    seed: int = 0
    pack_batch_docs: int = 256  # documents tokenized and packed together; only their last block is padded
    batch_size: int = 32  # blocks per training batch, per worker
    # Blocks each worker shuffles over, afresh every epoch (seeded by seed and epoch); 0 keeps the
    # stream's order. The stream reads files in order, so without it training drifts from one
    # source to the next. The default holds the whole shipped corpus at any seq_len (27,918 blocks
    # at T=128), so the demo's epochs are shuffled whole; a larger corpus gets a window this size
    # (64 MB of int32 per worker at T=512): raise it, or shuffle the documents across files first.
    shuffle_buffer: int = 32_768
    data_cpus: float = 0.25  # logical CPUs per Ray Data task: fractional so Train workers never starve it
    block_bytes: int = 8 << 20  # Ray Data block target; streaming_split deals whole blocks, so smaller
    #                              blocks spread a small corpus over more tasks and Train workers
