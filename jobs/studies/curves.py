"""Learning curves of a pretraining recipe with plain PyTorch: the probe for presets whose heads learn
within a short study (docs/design.md section 5.4).

    python -m jobs.data.pack --seq-len 128 --vocab-size 8192 --out work/blocks-study       # once, with Ray
    python -m jobs.studies.curves --preset study --blocks work/blocks-study [--variant cocolm] [--set key=value ...]
        [--long-blocks work/blocks-study-long] [--out work/curves/NAME.csv] [--device cuda]
    python -m jobs.studies.curves --plot work/curves/a.csv work/curves/b.csv --out curves.png

The blocks are packed once by the job's own Ray Data stream (`jobs.data.pack`); the probe reads them
with numpy and needs neither Ray, MLflow nor pandas, so a GPU machine with only torch and transformers
installed runs it: copy the folder there. Training is the job's: the preset, variant and `--set`
overrides resolve as `python -m jobs.pretraining` resolves them, and every step is
`model.step.TrainingStep` (bf16 autocast where the job's runs it, accumulation, clipping, AdamW,
warm-up and linear decay) on the variant's objective. Only the batching differs: the blocks are
shuffled per epoch here, and each batch is corrupted with one generator instead of one per block.

A recipe with a long phase (`train.long_steps` steps on blocks of `data.long_seq_len`, as the job runs
them) needs those blocks too, packed once into a second folder (`--long-blocks`) with the same
tokenizer; its steps draw from it, the held-out blocks stay the short ones (one curve from step 0 to
the end). The two folders are packed separately from the same corpus, so in the long phase the
held-out blocks' text also sits inside some training blocks: the last `train.long_steps` held-out
values may read slightly high.

A line per `train.log_every` steps gives the step, epoch, loss, held-out accuracies (a fixed, seeded
5% of the blocks, at most 512, in eval mode), tokens/s and the time left; the CSV holds the same
interval's means on the training batches and on the held-out blocks, and a figure of the
accuracies goes next to it when matplotlib is installed. At the end each head's held-out accuracy is
judged against `LEFT_PRIOR`: the first logged step above it, or "never".
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from jobs.cli import UserError, option, parse_options, run_main
from jobs.data.blocks_folder import TOKENIZER_FILE, load_blocks
from jobs.pretraining.config import PretrainConfig, resolve, with_vocab_size
from jobs.studies.figures import pyplot, save
from model import build_pretraining_model, make_pretraining_batch
from model.encoder import compile_encoders
from model.objective import to_device
from model.step import Interval, TrainingStep, build_optimizer, fp32_fallback_note, step_precision

HELDOUT_FRACTION, HELDOUT_MAX = 0.05, 512  # blocks kept out of training for the held-out accuracies
# A head has left its prior once its held-out accuracy passes these. The MLM-style accuracies start at
# the unigram plateau (5-6% on the shipped corpus: the most frequent pieces), so 0.10 is about twice
# it; the copy head starts by calling every token original (0 on replaced tokens), so half of the
# replaced tokens found is clear learning.
LEFT_PRIOR = {"aux_mlm_accuracy": 0.10, "mlm_accuracy": 0.10, "lm_accuracy_replaced": 0.10,
              "copy_accuracy_replaced": 0.5}
SHOWN = ("aux_mlm_accuracy", "mlm_accuracy", "copy_accuracy_replaced", "lm_accuracy_replaced")  # in progress lines
HEARTBEAT_SECONDS = 30  # a progress line at least this often, even between log intervals
PLOTTED = ("aux_mlm_accuracy", "mlm_accuracy", "copy_accuracy_replaced", "copy_accuracy_original",
           "lm_accuracy_replaced", "lm_accuracy_original", "scl_positive_cosine", "scl_negative_cosine")


@dataclass(frozen=True)
class CurvesOptions:
    preset: str = field(default="tiny", metadata=option("platform/presets/<name>.yaml"))
    variant: str = field(default="cocolm", metadata=option("built-in variant or platform/variants/<name>.yaml"))
    overrides: tuple[str, ...] = field(default=(), metadata=option(
        "override a config key, as the pretraining job takes it", flag="--set", repeat=True, metavar="KEY=VALUE"))
    blocks: str = field(default="work/blocks", metadata=option(
        "folder of packed blocks from `python -m jobs.data.pack` at the preset's data.seq_len"))
    long_blocks: str | None = field(default=None, metadata=option(
        "folder of packed blocks at data.long_seq_len, for a recipe with a long phase (train.long_steps)"))
    out: str | None = field(default=None, metadata=option(
        "CSV of the curves (default: work/curves/<preset>-<variant>.csv); with --plot, the figure"))
    device: str | None = field(default=None, metadata=option("cuda or cpu (default: cuda when there is one)"))
    plot: tuple[str, ...] = field(default=(), metadata=option(
        "draw these CSVs into one figure (--out) instead of training", many=True))


# ---------------------------------------------------------------- held-out blocks


def split_heldout(blocks: np.ndarray, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(training blocks, held-out blocks): a seeded draw of HELDOUT_FRACTION of them, at most HELDOUT_MAX."""
    order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(seed))
    held = min(HELDOUT_MAX, max(1, int(HELDOUT_FRACTION * len(blocks))))
    ids = torch.from_numpy(blocks).long()
    return ids[order[held:]], ids[order[:held]]


# ---------------------------------------------------------------- training


def epoch_batches(blocks: torch.Tensor, batch_size: int, generator: torch.Generator):
    """Endless micro-batches of `batch_size` blocks: a fresh shuffle per epoch, the ragged tail dropped."""
    while True:
        order = torch.randperm(len(blocks), generator=generator)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield blocks[order[start : start + batch_size]]


def corrupted(ids: torch.Tensor, cfg: PretrainConfig, generator: torch.Generator, device: torch.device) -> dict:
    return to_device(make_pretraining_batch(ids, cfg.data.mask_rate, cfg.data.crop_fraction, generator), device)


@torch.no_grad()
def heldout_metrics(model, batches: list[dict], autocast) -> dict[str, float]:
    """Mean metrics over the fixed held-out batches, in eval mode (no dropout)."""
    model.eval()
    interval = Interval()
    with autocast:
        for batch in batches:
            interval.add(model(batch).values())
    model.train()
    return interval.means()


def train(cfg: PretrainConfig, blocks: np.ndarray, out: Path, device: torch.device,
          long_blocks: np.ndarray | None = None) -> list[dict]:
    """Train as the job does and write one CSV row per log interval; the rows. With a long phase its
    steps draw from `long_blocks`, and a log interval ends where it starts, as in the job."""
    torch.manual_seed(cfg.train.seed)
    model = build_pretraining_model(cfg.model, cfg.objective).to(device)
    if cfg.train.compile:
        compile_encoders(model)
    optimizer, scheduler = build_optimizer(model, cfg.train, device)
    accumulation = cfg.train.global_batch // cfg.data.batch_size
    precision = step_precision(device, cfg.train.bf16, cfg.train.bf16_on_cpu)  # the job's, and printed
    note = fp32_fallback_note(device, cfg.train.bf16, cfg.train.bf16_on_cpu)
    print(f"steps in {precision}" + (f" ({note})" if note else ""))
    step = TrainingStep(model, model.parameters(), optimizer, scheduler, device, clip_norm=cfg.train.clip_norm,
                        accumulation=accumulation, bf16=cfg.train.bf16, bf16_on_cpu=precision == "bf16")
    training, heldout = split_heldout(blocks, cfg.data.seed)
    generator = torch.Generator().manual_seed(cfg.data.seed)
    held_generator = torch.Generator().manual_seed(cfg.data.seed + 1)  # the same corruption at every evaluation
    held_batches = [corrupted(ids, cfg, held_generator, device) for ids in heldout.split(cfg.data.batch_size)]
    source = epoch_batches(training, cfg.data.batch_size, generator)
    corpus_tokens = len(training) * cfg.data.seq_len
    print(f"{cfg.preset} / {cfg.variant}: {cfg.train.max_steps:,} steps of {cfg.train.global_batch} x {cfg.data.seq_len} "
          + (f"(the last {cfg.train.long_steps:,} of {cfg.train.global_batch} x {cfg.data.long_seq_len}, from "
             f"{len(long_blocks):,} blocks) " if cfg.train.long_steps else "")
          + f"= {cfg.tokens_left(0) / corpus_tokens:.1f} epochs of {len(training):,} blocks "
          f"({len(heldout)} held out), on {device}")
    rows, interval, started = [], Interval(), time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        # Step 0 first: the heads' priors on the held-out blocks, and a CSV with a row from the start,
        # so a run stopped before its first interval still leaves what it measured.
        writer = csv.DictWriter(handle, fieldnames=csv_columns(model, held_batches, step.autocast), extrasaction="ignore")
        writer.writeheader()
        first = {"step": 0, "epoch": 0.0, "seconds": 0.0,
                 **{f"heldout_{k}": v for k, v in heldout_metrics(model, held_batches, step.autocast).items()}}
        writer.writerow(first)
        handle.flush()
        rows.append(first)
        print(f"step 0/{cfg.train.max_steps} | held-out before training: " + held_out_text(first), flush=True)
        heartbeat = time.perf_counter()
        for number in range(1, cfg.train.max_steps + 1):
            if cfg.train.long_steps and number == cfg.long_from + 1:  # the long phase: its blocks from here
                source = epoch_batches(torch.from_numpy(long_blocks).long(), cfg.data.batch_size, generator)
            seq_len = cfg.seq_len_at(number - 1)
            step_tokens = cfg.train.global_batch * seq_len
            result = step(corrupted(next(source), cfg, generator, device) for _ in range(accumulation))
            for values in result.values:
                interval.add(values)
            interval.record(number, result.grad_norm)
            switch = bool(cfg.train.long_steps) and number == cfg.long_from  # no interval spans two lengths
            if number % cfg.train.log_every and number != cfg.train.max_steps and not switch:
                if time.perf_counter() - heartbeat >= HEARTBEAT_SECONDS:  # slow shapes: a sign of life
                    print(heartbeat_line(number, cfg, interval, step_tokens), flush=True)
                    heartbeat = time.perf_counter()
                continue
            bad = interval.nonfinite()  # read once per log line: the step itself never waits for the device
            if bad:
                step_number, norm = bad[0]
                raise FloatingPointError(f"non-finite gradient at step {step_number} (norm {norm}); its update was skipped")
            seconds = time.perf_counter() - interval.started
            epoch = (cfg.tokens_left(0) - cfg.tokens_left(number)) / corpus_tokens
            row = {"step": number, "epoch": epoch, "seq_len": seq_len,
                   "seconds": time.perf_counter() - started, "tokens_per_second": interval.steps * step_tokens / seconds,
                   "learning_rate": scheduler.get_last_lr()[0], "grad_norm": result.grad_norm.item(),
                   **interval.means(),
                   **{f"heldout_{k}": v for k, v in heldout_metrics(model, held_batches, step.autocast).items()}}
            writer.writerow(row)
            handle.flush()
            rows.append(row)
            print(progress_line(row, cfg), flush=True)
            interval, heartbeat = Interval(), time.perf_counter()
    return rows


def csv_columns(model, held_batches: list[dict], autocast) -> list[str]:
    """The CSV's columns: the step's bookkeeping, the training means and the held-out means of every value
    the variant computes (one forward pass on a held-out batch names them)."""
    model.eval()
    with torch.no_grad(), autocast:
        names = list(model(held_batches[0]).values())
    model.train()
    return ["step", "epoch", "seq_len", "seconds", "tokens_per_second", "learning_rate", "grad_norm", *names,
            *(f"heldout_{name}" for name in names)]


def held_out_text(row: dict) -> str:
    return " ".join(f"{k.replace('_accuracy', '')} {row[f'heldout_{k}']:.3f}" for k in SHOWN if f"heldout_{k}" in row)


def heartbeat_line(number: int, cfg: PretrainConfig, interval: Interval, step_tokens: int) -> str:
    """Between log intervals: the step, the interval's mean loss so far, tokens/s, the time left and when
    the next held-out line comes."""
    seconds = time.perf_counter() - interval.started
    loss = interval.means().get("loss", math.nan)
    rate = interval.steps * step_tokens / seconds
    max_steps, log_every = cfg.train.max_steps, cfg.train.log_every
    next_log = min(max_steps, (number // log_every + 1) * log_every)
    if cfg.train.long_steps and number < cfg.long_from:
        next_log = min(next_log, cfg.long_from)
    return (f"step {number}/{max_steps} | loss {loss:.3f} (running) | {rate:,.0f} tok/s | "
            f"{cfg.tokens_left(number) / rate / 60:.1f} min left | held-out next at step {next_log}")


def progress_line(row: dict, cfg: PretrainConfig) -> str:
    """The logged interval; the time left at its rate, the long phase's longer steps counted at their length."""
    left = cfg.tokens_left(row["step"]) / row["tokens_per_second"]
    return (f"step {row['step']}/{cfg.train.max_steps} | epoch {row['epoch']:.2f} | loss {row['loss']:.3f} | held-out "
            + held_out_text(row) + f" | {row['tokens_per_second']:,.0f} tok/s | {left / 60:.1f} min left")


def left_prior(rows: list[dict]) -> dict[str, int | None]:
    """Per head the variant trains, the first logged step whose held-out accuracy passes LEFT_PRIOR (None: never)."""
    firsts: dict[str, int | None] = {}
    for metric, threshold in LEFT_PRIOR.items():
        key = f"heldout_{metric}"
        if rows and key in rows[0]:
            firsts[metric] = next((r["step"] for r in rows if r[key] > threshold), None)
    return firsts


# ---------------------------------------------------------------- figure


def read_curves(path: Path) -> dict[str, np.ndarray]:
    """A probe CSV as columns of floats (empty cells, such as a head a variant lacks, as NaN)."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {key: np.array([float(r[key]) if r[key] else math.nan for r in rows]) for key in (rows[0] if rows else {})}


def plot(paths: list[Path], out: Path) -> Path:
    """One panel per plotted accuracy (held-out where logged), a line per CSV in the same colour in every
    panel, one legend for the figure; points are marked, so a curve of one logged interval shows."""
    curves = {path.stem: read_curves(path) for path in paths}
    metrics = [m for m in PLOTTED if any(f"heldout_{m}" in c or m in c for c in curves.values())]
    plt = pyplot()
    columns, lines = min(3, len(metrics)), math.ceil(len(metrics) / 3)
    fig, axes = plt.subplots(lines, columns, figsize=(4.2 * columns, 3.2 * lines + 0.3), squeeze=False)
    colours = {label: f"C{i % 10}" for i, label in enumerate(curves)}
    for ax, metric in zip(axes.flat, metrics):
        for label, columns_of in curves.items():
            key = f"heldout_{metric}" if f"heldout_{metric}" in columns_of else metric
            if key in columns_of:
                ax.plot(columns_of["step"], columns_of[key], marker="o", markersize=2.5, color=colours[label])
        if metric in LEFT_PRIOR:
            ax.axhline(LEFT_PRIOR[metric], color="grey", linestyle=":", linewidth=1)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    handles = [plt.Line2D([], [], color=colours[label], marker="o", markersize=3) for label in curves]
    fig.legend(handles, list(curves), loc="lower center", ncol=min(3, len(curves)), fontsize=8)
    return save(fig, "held-out accuracies against step (dotted: left the prior)", out,
                bottom=0.03 + 0.025 * math.ceil(len(curves) / 3))


# ---------------------------------------------------------------- command


def run(opts: CurvesOptions) -> list[dict]:
    if opts.plot:
        missing = [p for p in opts.plot if not Path(p).is_file()]
        if missing:
            raise UserError(f"no such CSV: {', '.join(missing)}")
        print(plot([Path(p) for p in opts.plot], Path(opts.out or "curves.png")))
        return []
    cfg = resolve(opts.preset, opts.variant, list(opts.overrides))  # checks global_batch against batch_size
    blocks, meta = load_blocks(Path(opts.blocks), cfg.data.seq_len)
    long_blocks = load_long_blocks(opts, cfg, meta)
    cfg = with_vocab_size(cfg, meta["vocab_size"])
    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = Path(opts.out or f"work/curves/{opts.preset}-{opts.variant}.csv")
    rows = train(cfg, blocks, out, device, long_blocks)
    for metric, first in left_prior(rows).items():
        print(f"{metric}: held-out {rows[-1][f'heldout_{metric}']:.3f} at step {rows[-1]['step']}; above "
              f"{LEFT_PRIOR[metric]} " + (f"from step {first}" if first else "never"))
    print(f"curves: {out}")
    try:
        print(f"figure: {plot([out], out.with_suffix('.png'))}")
    except ImportError:  # matplotlib is optional: a bare GPU machine has none
        print("figure: skipped (no matplotlib here; `--plot` draws it where there is)")
    return rows


def load_long_blocks(opts: CurvesOptions, cfg: PretrainConfig, meta: dict) -> np.ndarray | None:
    """The long phase's blocks where the recipe has one: packed at data.long_seq_len from the same corpus
    with the same tokenizer as --blocks (else the two phases would read different pieces)."""
    if not cfg.train.long_steps:
        if opts.long_blocks:
            raise UserError(f"--long-blocks {opts.long_blocks}: this recipe has no long phase (train.long_steps=0)")
        return None
    length = cfg.data.long_seq_len
    if not opts.long_blocks:
        raise UserError(f"the recipe's last {cfg.train.long_steps} steps train on blocks of {length} (train.long_steps, "
                        f"data.long_seq_len): pack them once with `python -m jobs.data.pack --seq-len {length} "
                        f"--vocab-size {meta['vocab_size']} --out {opts.blocks}-{length}` and pass "
                        f"--long-blocks {opts.blocks}-{length}")
    long_blocks, long_meta = load_blocks(Path(opts.long_blocks), length)
    same = ((Path(opts.blocks) / TOKENIZER_FILE).read_bytes() == (Path(opts.long_blocks) / TOKENIZER_FILE).read_bytes()
            and long_meta["corpus"] == meta["corpus"])
    if not same:
        raise UserError(f"{opts.blocks} and {opts.long_blocks} were packed from different corpora or tokenizers: "
                        "pack both from the same ones")
    return long_blocks


def main(argv: list[str] | None = None) -> list[dict]:
    return run(parse_options("python -m jobs.studies.curves", __doc__, CurvesOptions, argv))


if __name__ == "__main__":
    run_main(main)
