"""Stream benchmark: can the Ray Data stream feed a GPU?

    python -m jobs.data.stream_bench [--corpus PATH ...] [--tokenizer DIR] --seq-len L

Prints what the cleaning skipped, the whole pipeline's tokens/s (read -> clean -> tokenize -> pack
-> corrupt, all in Ray Data), the tokens/s of tokenization and of corruption alone on one core,
the cores used, and the goal: per 8 CPU cores the stream should deliver at least 3x the tokens/s
one H100 consumes training the base model at 45% MFU,

    H100 tokens/s = 0.45 * 989e12 / model.flops.flops_per_token(SIZES['base'], ObjectiveConfig(), 512)

"Tokens" are block positions (B * T), the unit the GPU consumes; the real (non-[PAD]) share is
printed next to it. Epoch 1 includes starting Ray's workers; the goal uses the last epoch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import ray

from jobs.cli import AT_LEAST_ONE, POSITIVE, Range, option, parse_options, run_main
from jobs.data.config import DataConfig
from jobs.data.corpus import corpus_paths, read_documents
from jobs.data.skips import skip_summary
from jobs.data.stream import build_stream, corrupt, corrupted
from jobs.data.tokenizer import resolve_tokenizer
from jobs.data.tokens import load_tokenizer
from jobs.ray_session import init_ray
from model import SIZES, ObjectiveConfig, flops_per_token

H100_BF16_PEAK = 989e12
MFU = 0.45
GOAL_RATIO = 3.0


def h100_tokens_per_second() -> float:
    return MFU * H100_BF16_PEAK / flops_per_token(SIZES["base"], ObjectiveConfig(), 512)


def pipeline_epoch(cfg: DataConfig, blocks, epoch: int) -> tuple[float, int, int]:
    """Seconds, positions and real tokens of one full pass through the corrupted stream."""
    start, positions, real = time.perf_counter(), 0, 0
    for batch in corrupted(blocks, cfg, epoch).iter_batches(batch_size=None, batch_format="numpy"):
        positions += batch["input_ids"].size
        real += int(batch["attention_mask"].sum())
    return time.perf_counter() - start, positions, real


def tokenize_alone(cfg: DataConfig, tokenizer_dir: str, max_docs: int = 20_000) -> float:
    """Tokens/s of the fast tokenizer in this process, one core, on the corpus's first documents."""
    documents, _ = read_documents(corpus_paths(cfg), cfg.max_record_chars)
    texts = [row["text"] for row in documents.limit(max_docs).take_all()]
    tokenizer = load_tokenizer(tokenizer_dir)
    start = time.perf_counter()
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False))
    return tokens / (time.perf_counter() - start)


def corrupt_alone(cfg: DataConfig, blocks, rounds: int = 5) -> float:
    """Positions/s of `corrupt` in this process, one core, on real packed blocks."""
    batch = next(iter(blocks.iter_batches(batch_size=cfg.batch_size, batch_format="numpy")))
    start = time.perf_counter()
    for epoch in range(rounds):
        corrupt(batch, epoch, cfg.seed, cfg.mask_rate, cfg.crop_fraction)
    return rounds * batch["input_ids"].size / (time.perf_counter() - start)


def cores_used() -> tuple[float, int]:
    """(Ray's logical CPUs, this machine's cores); on a local cluster the stream uses the smaller."""
    return ray.cluster_resources().get("CPU", 0.0), len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class StreamBenchOptions:
    seq_len: int = field(metadata=option("block length T", bounds=Range(2)))
    corpus: tuple[str, ...] = field(default=(), metadata=option(
        "files, folders, globs or URIs (default: data/corpus)", many=True))
    tokenizer: str | None = field(default=None, metadata=option(
        "tokenizer directory (default: train or reuse the cached one)"))
    vocab_size: int = field(default=32768, metadata=option("for the default tokenizer only", bounds=Range(8)))
    batch_size: int = field(default=64, metadata=option("blocks per corrupted batch", bounds=AT_LEAST_ONE))
    epochs: int = field(default=2, metadata=option("passes over the corpus", bounds=AT_LEAST_ONE))
    num_cpus: float | None = field(default=None, metadata=option("logical CPUs of the local Ray (default: all cores)", bounds=POSITIVE))


def run(opts: StreamBenchOptions) -> dict[str, float]:
    init_ray(num_cpus=opts.num_cpus)
    cfg = DataConfig(paths=opts.corpus, tokenizer_dir=opts.tokenizer, vocab_size=opts.vocab_size, seq_len=opts.seq_len,
                     batch_size=opts.batch_size)
    stream = build_stream(cfg, resolve_tokenizer(cfg))
    print(f"tokenizer: {stream.tokenizer_dir}")
    rates = []
    for epoch in range(opts.epochs):
        seconds, positions, real = pipeline_epoch(cfg, stream.blocks, epoch)
        rates.append(positions / seconds)
        print(f"epoch {epoch + 1}: {positions:,} positions ({real / positions:.1%} real tokens) in {seconds:.2f} s "
              f"= {positions / seconds:,.0f} tokens/s through read -> clean -> tokenize -> pack -> corrupt")
    print(skip_summary(stream.skips).format())
    logical, machine = cores_used()
    cores = min(logical, machine) if not os.environ.get("RAY_ADDRESS") else logical
    tokenize_rate = tokenize_alone(cfg, str(stream.tokenizer_dir))
    corrupt_rate = corrupt_alone(cfg, stream.blocks)
    per_8_cores = rates[-1] / cores * 8
    goal = h100_tokens_per_second()
    print(f"tokenization alone: {tokenize_rate:,.0f} tokens/s on 1 core")
    print(f"corruption alone:   {corrupt_rate:,.0f} tokens/s on 1 core (seq_len {opts.seq_len})")
    print(f"cores: Ray has {logical:g} logical CPUs, the machine {machine} cores -> {cores:g} used")
    print(f"stream per 8 cores: {rates[-1]:,.0f} / {cores:g} * 8 = {per_8_cores:,.0f} tokens/s")
    print(f"goal: one H100 consumes {MFU} * {H100_BF16_PEAK:.3g} / flops_per_token(SIZES['base'], ObjectiveConfig(), 512)"
          f" = {MFU} * {H100_BF16_PEAK:.3g} / {flops_per_token(SIZES['base'], ObjectiveConfig(), 512):.4g}"
          f" = {goal:,.0f} tokens/s")
    ratio = per_8_cores / goal
    print(f"ratio: {per_8_cores:,.0f} / {goal:,.0f} = {ratio:.2f}x (target >= {GOAL_RATIO:g}x: "
          f"{'met' if ratio >= GOAL_RATIO else 'NOT met'})")
    return {"stream_tokens_per_s": rates[-1], "tokenize_tokens_per_s": tokenize_rate, "corrupt_tokens_per_s": corrupt_rate,
            "cores": cores, "stream_per_8_cores": per_8_cores, "h100_tokens_per_s": goal, "ratio": ratio}


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run(parse_options("python -m jobs.data.stream_bench", __doc__, StreamBenchOptions, argv))

if __name__ == "__main__":
    run_main(main)
