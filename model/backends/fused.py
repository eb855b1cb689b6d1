"""Our fused Triton kernel (`model.kernels.attention`) as a backend: the bias by distance (heads, 2S + 1)
read per tile, padding keys as a (B, T) mask, attention dropout with Philox inside the kernel, and the
bias gradient reduced inside the kernel; no (B, heads, T, T) tensor in forward or backward, with or
without dropout. It needs triton (an optional import inside model.kernels) and a CUDA device, or
Triton's interpreter on CPU (the tests).

On a GPU each shape (`TritonShape`: T, padding, dropout, with or without gradients, ...) is probed
eagerly before its first call (`probe_triton`; `model.step.TrainingStep.warm_up` does it before a
compiled step is traced); where that fails, that shape alone falls back, with one warning naming it
and the cause, to what 'auto' picks (`model.backends.dispatch.fallback_attention`). `kernel_variants`
counts the binaries the probes and warm-up of a set of shapes compile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..kernels import attention as kernels
from .probes import own_random_state


@dataclass(frozen=True)
class TritonBias:
    """What the Triton kernel reads in place of the dense additive mask."""

    distance_bias: torch.Tensor | None  # (heads, 2S + 1) fp32, `RelativePositionBias.by_distance`; None without it
    key_mask: torch.Tensor | None  # (B, T) bool, True on real keys; None: no padding anywhere
    blocks: tuple[int, int] | None = None  # fixed tiles (`PROBE_BLOCKS`); None: each kernel's tuned tiles
    every: torch.Tensor | None = None  # (heads, 2T - 1), the lookup the kernels read; None: built per call


def triton_bias(distance_bias: torch.Tensor | None, key_mask: torch.Tensor | None,
                blocks: tuple[int, int] | None, seq_len: int) -> TritonBias:
    """The `TritonBias` of one encoder pass: the bias's lookup for every distance built here, once for
    all the layers, rather than by each layer's call, forward and backward."""
    every = None if distance_bias is None else kernels.every_distance(distance_bias, seq_len)
    return TritonBias(distance_bias, key_mask, blocks, every)


# The tiles the probe and every pass without gradients run at, fixed (no autotuning): 64 x 64, which the
# kernels launch with 4 warps and 2 stages, the first entry of every `TILES` list, so tuning a shape the
# probe has compiled reuses the probe's binary instead of compiling it again. Passes without gradients
# (sampling, evaluation) are forward only and a small share of a step: they are not worth a tuning each.
PROBE_BLOCKS = (64, 64)


def triton_relative_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: TritonBias, dropout_p: float = 0.0
) -> torch.Tensor:
    """The fused Triton kernel (`model.kernels.attention`); (B, heads, T, d) in and out, the output laid
    out as (B, T, heads, d) in memory. Each call draws its dropout seed on the device from torch's
    generator. Without triton it raises, naming the cause."""
    return kernels.relative_attention(q, k, v, bias.distance_bias, bias.key_mask, dropout_p, blocks=bias.blocks,
                                      every=bias.every)


class TritonShape(NamedTuple):
    """One problem the Triton kernel is probed for, and falls back for on its own: everything its
    compiled variants and its tuning depend on (the batch size is in neither). A named tuple, which
    dynamo hashes and compares while it traces a compiled step (`model.backends.probes.KernelProbes.triton_probed`)."""

    device: str
    heads: int
    head_dim: int
    dtype: torch.dtype
    relative: bool  # with the relative bias (and its gradient, in a pass with gradients)
    seq_len: int
    padded: bool  # a (B, T) mask of real keys; False: packed blocks, no mask at all
    dropout_p: float  # attention dropout, 0 where it is not active
    grad: bool  # a pass with gradients (forward and backward, tuned tiles) or without (forward, `PROBE_BLOCKS`)

    def __str__(self) -> str:
        kind = "training" if self.grad else "no-grad"
        return (f"T {self.seq_len}, {'padded' if self.padded else 'packed'}, dropout {self.dropout_p:g}, "
                f"{kind}, {str(self.dtype).removeprefix('torch.')}, {self.heads} x {self.head_dim}")


def probe_triton(shape: TritonShape, batch: int, reach: int) -> None:
    """Compile and run the Triton kernel at `shape` as the encoder will, on random inputs, so that any
    failure shows here, where it can be caught: at the fixed `PROBE_BLOCKS` (forward, and backward in a
    pass with gradients); then, for a pass with gradients, at the tuned tiles with the real `batch` size,
    forward and backward, which tunes each kernel for this shape now, eagerly, before any compiled step
    or CUDA graph capture meets it. `reach` is S of the bias by distance (heads, 2S + 1). Without triton
    the first call raises: a probe failure like any other."""
    device = torch.device(shape.device)
    tiles = [(1, PROBE_BLOCKS)] + ([(batch, None)] if shape.grad else [])
    with own_random_state(device), torch.set_grad_enabled(shape.grad), torch.autocast(device.type, enabled=False):
        for size, blocks in tiles:
            q, k, v = (torch.randn(size, shape.heads, shape.seq_len, shape.head_dim, device=device,
                                   dtype=shape.dtype, requires_grad=shape.grad) for _ in range(3))
            bias = (torch.zeros(shape.heads, 2 * reach + 1, device=device, requires_grad=shape.grad)
                    if shape.relative else None)
            mask = None
            if shape.padded:
                mask = torch.ones(size, shape.seq_len, dtype=torch.bool, device=device)
                mask[-1, shape.seq_len // 2:] = False
            out = kernels.relative_attention(q, k, v, bias, mask, shape.dropout_p, blocks=blocks)
            if shape.grad:
                out.float().sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernel_variants(shapes: set[TritonShape]) -> set[tuple]:
    """The distinct compiled kernels (binaries) the probe and warm-up of these shapes build in one process,
    each named by what Triton keys a binary on: the kernel, its tiles, warps and stages, its constexpr
    flags and how it specialises T (a multiple of 16 or not). Per shape: the forward, and for a pass with
    gradients dK/dV and dQ; each at `PROBE_BLOCKS` (the probe; passes without gradients run there), and,
    with gradients, at every tile its autotuning times (`TILES`). T = 512 and 496 share binaries but not
    their tuning, which times the binaries it already has without compiling them again."""
    probe_tile = (*PROBE_BLOCKS, *kernels._launch_options(*PROBE_BLOCKS).values())
    variants = set()
    for shape in shapes:
        problem = (shape.seq_len % 16 == 0, shape.head_dim, shape.dtype, shape.relative, shape.padded,
                   shape.dropout_p > 0)
        for kind in ("forward", "dkdv", "dq") if shape.grad else ("forward",):
            tiles = {probe_tile, *(kernels.TILES[kind] if shape.grad else ())}
            variants |= {(kind, tile, problem) for tile in tiles}
    return variants
