"""Micro-benchmark of full COCO-LM training steps (forward, backward, optimizer) on random tokens.

    python -m model.bench --preset tiny|small|base|base++|large++ --seq-len L --batch B --steps N [--variant NAME]

Prints tokens/s, step time, peak memory and model FLOPs per step; on a GPU also MFU against the
device's dense bf16 peak. The FLOP count is `model.flops.step_flops` (its docstring states the
formula). Runs with plain torch: no Ray, no MLflow.
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import dataclass

import torch

from .config import ObjectiveConfig, model_size
from .corruption import SpecialTokens, make_pretraining_batch
from .flops import device_peak_flops, step_flops
from .objective import build_pretraining_model
from .variants import variant


@dataclass(frozen=True)
class BenchResult:
    device: str
    tokens_per_second: float
    step_seconds: float
    peak_memory_bytes: int
    flops_per_step: float
    mfu: float | None  # None where the device's peak is unknown (CPUs)

    def report(self) -> str:
        mfu = f"{100 * self.mfu:.1f}%" if self.mfu is not None else "n/a (no known bf16 peak for this device)"
        return "\n".join([
            f"device            {self.device}",
            f"tokens/s          {self.tokens_per_second:,.0f}",
            f"step time         {1000 * self.step_seconds:.1f} ms",
            f"peak memory       {self.peak_memory_bytes / 2**20:,.0f} MiB",
            f"model FLOPs/step  {self.flops_per_step / 1e12:.3f} TFLOP",
            f"achieved          {self.flops_per_step / self.step_seconds / 1e12:.2f} TFLOP/s",
            f"MFU               {mfu}",
        ])


def random_batch(batch: int, seq_len: int, vocab_size: int, crop_fraction: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Packed blocks of uniform random tokens (no padding, as the stream packs them), masked and cropped."""
    generator = torch.Generator().manual_seed(seed)
    first_regular = SpecialTokens.mask + 1
    ids = torch.randint(first_regular, vocab_size, (batch, seq_len), generator=generator)
    ids[:, 0] = SpecialTokens.cls
    return make_pretraining_batch(ids, crop_fraction=crop_fraction, generator=generator)


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(
    preset: str = "tiny", seq_len: int = 128, batch: int = 8, steps: int = 10, warmup: int = 2,
    variant_name: str = "cocolm", device: str | None = None,
) -> BenchResult:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    chosen = variant(variant_name)
    model_cfg, objective_cfg = chosen.apply(model_size(preset), ObjectiveConfig())
    crop_fraction = chosen.data.get("crop_fraction", 0.9)
    model = build_pretraining_model(model_cfg, objective_cfg).to(dev).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01, fused=dev.type == "cuda"
    )
    data = {k: v.to(dev) for k, v in random_batch(batch, seq_len, model_cfg.vocab_size, crop_fraction).items()}
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")

    def step() -> None:
        with autocast:
            loss = model(data).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    _sync(dev)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(dev)
    step_seconds = (time.perf_counter() - start) / steps
    flops = step_flops(model_cfg, objective_cfg, seq_len, batch, crop_fraction=crop_fraction)
    peak = device_peak_flops(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else None
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    return BenchResult(
        device=name,
        tokens_per_second=batch * seq_len / step_seconds,
        step_seconds=step_seconds,
        peak_memory_bytes=_peak_memory(dev),
        flops_per_step=flops,
        mfu=flops / step_seconds / peak if peak else None,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", help="model size: tiny, small, base, base++, large++")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--variant", default="cocolm")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    args = parser.parse_args(argv)
    result = run(args.preset, args.seq_len, args.batch, args.steps, args.warmup, args.variant, args.device)
    print(f"COCO-LM training step: preset={args.preset} variant={args.variant} seq_len={args.seq_len} batch={args.batch}")
    print(result.report())


if __name__ == "__main__":
    main()
