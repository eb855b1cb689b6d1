"""FlexAttention as a backend: the relative bias enters through a `score_mod` and padding through a
`BlockMask`, so no (B, heads, T, T) tensor is materialised in forward or backward.

On CUDA it runs as a compiled (fused Triton) kernel with block sizes chosen to fit the device's shared
memory (`flex_kernel_options`); on CPU torch only has the unfused reference path, which the tests use.
The first flex call per configuration on a GPU compiles a small probe (`probe_flex`); if that fails,
attention falls back to SDPA for the rest of the process with one warning naming the cause
(`model.backends.probes.KernelProbes.flex_works`).

FlexAttention has no dropout, and dropout on the attention probabilities cannot be written as a score
modification (dropping a probability keeps the softmax's normaliser; masking a score changes it). The
paper trains with attention dropout 0.1, so it is never dropped silently: asking for 'flex' while
attention dropout is active is an error (`model.backends.dispatch.resolve_attention`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from .probes import own_random_state


@dataclass(frozen=True)
class FlexBias:
    """What the flex path reads in place of the dense additive mask."""

    block_mask: BlockMask | None  # padding keys in blocks of 128 x 128 (fully real blocks skip it); None: no padding
    position_bias: torch.Tensor | None  # (heads, T, T), contiguous; None without the relative bias
    kernel_options: dict[str, int] | None = None  # Triton block sizes for a GPU (`flex_kernel_options`)


def flex_bias(
    attention_mask: torch.Tensor | None,  # (B, T) bool, True on real tokens; None: no padding anywhere
    position_bias: torch.Tensor | None,  # (1, heads, T, T) or None
    kernel_options: dict[str, int] | None = None,
) -> FlexBias:
    """The BlockMask of real keys and the bias table expanded per (head, query, key).

    The bias is captured as a full (heads, T, T) tensor rather than a 1-D lookup by distance: the
    fused backward scatters the bias gradient with atomic adds, and with a 1-D table every (q, k) on
    a diagonal hits the same address, while per-pair entries collide only across the batch. It keeps
    the table's dtype (fp32 under autocast, so the gradient accumulates in fp32): for base
    12 x 512 x 512 x 4 B = 12 MiB, which stays in an H100's 50 MiB L2. Its gradient reaches the table
    through the ordinary embedding backward.
    """
    bias = None if position_bias is None else position_bias[0].contiguous()  # (heads, T, T), the table's dtype
    if attention_mask is None:
        return FlexBias(None, bias, kernel_options)
    batch, seq_len = attention_mask.shape

    def key_is_real(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, k_idx: torch.Tensor) -> torch.Tensor:
        return attention_mask[b, k_idx]

    block_mask = create_block_mask(key_is_real, batch, None, seq_len, seq_len, device=attention_mask.device)
    return FlexBias(block_mask, bias, kernel_options)


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    # Compiled once per process, on first use. dynamic=False: pretraining sees two fixed shapes (the
    # block and the crop), and static shapes give the fastest kernels; other shapes recompile.
    return torch.compile(flex_attention, dynamic=False)


def _flex_kernel(device: torch.device) -> Callable[..., torch.Tensor]:
    """Compiled flex on CUDA; inside an already compiled region (bench --compile) the plain function,
    which that compilation captures and fuses itself; on CPU the plain function, i.e. torch's unfused
    reference path (there is no CPU backward kernel, only this one)."""
    if device.type != "cuda" or torch.compiler.is_compiling():
        return flex_attention
    return _compiled_flex()


def flex_relative_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: FlexBias, dropout_p: float = 0.0
) -> torch.Tensor:
    """FlexAttention with the relative bias as a score_mod (added after the 1/sqrt(d) scaling, as the
    paper has it) and padding keys as a BlockMask; (B, heads, T, d) in and out."""
    if dropout_p:
        raise ValueError("flex attention has no attention dropout (see the module docstring)")
    position_bias = bias.position_bias

    def add_relative_bias(
        score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, k_idx: torch.Tensor
    ) -> torch.Tensor:
        return score + position_bias[h, q_idx, k_idx]

    score_mod = None if position_bias is None else add_relative_bias
    return _flex_kernel(q.device)(
        q, k, v, score_mod=score_mod, block_mask=bias.block_mask, kernel_options=bias.kernel_options
    )


@dataclass(frozen=True)
class FlexBlocks:
    """Triton tiles of the fused flex kernels: forward (block_m queries x block_n keys) and backward
    (block_m1 x block_n1 for dK/dV, block_m2 x block_n2 for dQ), each with its pipeline depth."""

    block_m: int
    block_n: int
    fwd_stages: int
    block_m1: int
    block_n1: int
    block_m2: int
    block_n2: int
    bwd_stages: int

    def forward_shared_memory(self, head_dim: int, io_bytes: int, bias_bytes: int) -> int:
        """Bytes: the q tile, plus per stage the k and v tiles and the tile of the captured bias that
        the score_mod reads. torch 2.11's H100 default for bf16, d=64 (128 x 128, 3 stages, fp32 bias)
        gives 311,296 bytes: exactly what the H100 reported before refusing it (limit 232,448)."""
        per_stage = 2 * self.block_n * head_dim * io_bytes + self.block_m * self.block_n * bias_bytes
        return self.block_m * head_dim * io_bytes + self.fwd_stages * per_stage

    def backward_shared_memory(self, head_dim: int, io_bytes: int, bias_bytes: int) -> int:
        """Bytes, by the same rule, of the larger of the two backward loops: dK/dV keeps k and v and
        streams q, dO and the bias; dQ keeps q and dO and streams k, v and the bias."""
        dkdv = 2 * self.block_n1 * head_dim * io_bytes + self.bwd_stages * (
            2 * self.block_m1 * head_dim * io_bytes + self.block_m1 * self.block_n1 * bias_bytes)
        dq = 2 * self.block_m2 * head_dim * io_bytes + self.bwd_stages * (
            2 * self.block_n2 * head_dim * io_bytes + self.block_m2 * self.block_n2 * bias_bytes)
        return max(dkdv, dq)

    def kernel_options(self) -> dict[str, int]:
        return {
            "fwd_BLOCK_M": self.block_m, "fwd_BLOCK_N": self.block_n, "fwd_num_stages": self.fwd_stages,
            "bwd_BLOCK_M1": self.block_m1, "bwd_BLOCK_N1": self.block_n1, "bwd_BLOCK_M2": self.block_m2,
            "bwd_BLOCK_N2": self.block_n2, "bwd_num_stages": self.bwd_stages,
        }


# Fastest first, as measured on an H100 (B=32, 12 heads, T=512, d=64, bf16, fp32 bias needing a
# gradient; forward + backward): 1.03 ms, 1.15 ms, 1.18 ms; then a small tile that fits any GPU.
# The backward keeps torch's sm90 tiles with the forward's pipeline depth. Every tile divides the
# BlockMask's 128-token blocks, as flex requires.
FLEX_BLOCKS = (
    FlexBlocks(32, 64, 2, 64, 128, 128, 64, 2),
    FlexBlocks(64, 128, 1, 64, 128, 128, 64, 1),
    FlexBlocks(128, 64, 2, 64, 128, 128, 64, 2),
    FlexBlocks(32, 32, 1, 32, 32, 32, 32, 1),
)


def flex_kernel_options(
    head_dim: int, io_bytes: int, bias_bytes: int, shared_memory: int
) -> dict[str, int] | None:
    """The fastest `FLEX_BLOCKS` entry whose forward and backward fit `shared_memory` bytes per block
    (None when none does: then `KernelProbes.flex_works` finds flex unusable and SDPA runs)."""
    for blocks in FLEX_BLOCKS:
        if max(blocks.forward_shared_memory(head_dim, io_bytes, bias_bytes),
               blocks.backward_shared_memory(head_dim, io_bytes, bias_bytes)) <= shared_memory:
            return blocks.kernel_options()
    return None


@functools.cache  # called on every encoder forward: the device's properties are read once
def device_flex_options(device: torch.device, head_dim: int, dtype: torch.dtype, bias_dtype: torch.dtype | None) -> dict[str, int] | None:
    """`flex_kernel_options` for a CUDA device's opt-in shared memory per block; None off CUDA (the
    unfused CPU path takes no Triton options)."""
    if device.type != "cuda":
        return None
    properties = torch.cuda.get_device_properties(device)
    shared = getattr(properties, "shared_memory_per_block_optin", properties.shared_memory_per_block)
    bias_bytes = 0 if bias_dtype is None else bias_dtype.itemsize
    return flex_kernel_options(head_dim, dtype.itemsize, bias_bytes, shared)


class FlexUnavailable(RuntimeError):
    """Raised by the probe when no flex tile fits the device."""


def probe_flex(device: torch.device, heads: int, head_dim: int, dtype: torch.dtype, relative: bool) -> None:
    """Compile and run flex as the encoder will: a padded batch, the fp32 bias table's expansion
    needing a gradient, forward + backward, then a no-grad forward (the sampling pass's kernel)."""
    seq_len = 256  # two of the BlockMask's blocks, the second partly padding
    bias_dtype = torch.float32 if relative else None
    options = device_flex_options(device, head_dim, dtype, bias_dtype)
    if options is None:
        raise FlexUnavailable(f"no flex tile fits {torch.cuda.get_device_name(device)}'s shared memory")
    mask = torch.ones(1, seq_len, dtype=torch.bool, device=device)
    mask[0, 200:] = False
    with own_random_state(device):
        q, k, v = (torch.randn(1, heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        bias = torch.zeros(1, heads, seq_len, seq_len, device=device, requires_grad=True) if relative else None
        with torch.enable_grad(), torch.autocast(device.type, enabled=False):
            flex_relative_attention(q, k, v, flex_bias(mask, bias, options)).sum().backward()
        with torch.no_grad():
            flex_relative_attention(q, k, v, flex_bias(mask, bias, options))
    torch.cuda.synchronize(device)
