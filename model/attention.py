"""Self-attention with COCO-LM's relative position bias (SPEC section 1).

The bias is one `Embedding(num_buckets, num_heads)` table per encoder, shared by all its layers,
added to the attention logits after the 1/sqrt(head_dim) scaling; padding keys get -inf. Three
implementations compute the same thing:

- 'sdpa' hands bias and padding to `scaled_dot_product_attention` as one additive float mask
  (B, heads, T, T). It applies attention dropout and is the default off CUDA.
- 'flex' is FlexAttention: the bias enters through a `score_mod` and padding through a `BlockMask`,
  so no (B, heads, T, T) tensor is materialised in forward or backward. On CUDA it runs as a
  compiled (fused Triton) kernel; on CPU torch only has the unfused reference path, which the tests use.
- 'reference' spells the softmax out; the tests compare the other two against it.

Attention dropout and flex: FlexAttention has no dropout, and dropout on the attention
probabilities cannot be written as a score modification (dropping a probability keeps the
softmax's normaliser; masking a score changes it). The paper trains with attention dropout 0.1,
so we never drop it silently: 'auto' (the default) picks flex on CUDA only while no attention
dropout is active (eval mode, or `attention_dropout = 0` in the model config, the opt-in fast
path) and SDPA otherwise; asking for 'flex' explicitly while attention dropout is active is an error.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from .config import EncoderConfig

ATTENTION_CHOICES = ("auto", "sdpa", "flex", "reference")


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.LongTensor:
    """The authors' bucket function: ids 0 .. num_buckets - 2 for d = key_pos - query_pos.

    It differs from T5's: `ceil` instead of floor, `max_distance - 1` in the log ratio, and the
    result is shifted by `half - 1` rather than split into two halves by direction.
    """
    half = num_buckets // 2
    exact = half // 2
    n = relative_position.abs()
    # clamp(min=1) only keeps log() finite on the exact branch, whose value torch.where discards.
    log_ratio = torch.log(n.clamp(min=1).float() / exact) / math.log((max_distance - 1) / exact)
    far = exact + torch.ceil(log_ratio * (half - 1 - exact)).long()
    bucket = torch.where(n < exact, n, far.clamp(max=half - 1))
    return (torch.sign(relative_position) * bucket + (half - 1)).long()


class RelativePositionBias(nn.Module):
    """Per-encoder table of one bias per (bucket, head), looked up for every (query, key) pair."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.num_buckets = cfg.rel_pos_buckets
        self.max_distance = cfg.rel_pos_max_distance
        self.table = nn.Embedding(cfg.rel_pos_buckets, cfg.num_heads)

    def forward(self, seq_len: int) -> torch.Tensor:
        positions = torch.arange(seq_len, device=self.table.weight.device)
        relative = positions[None, :] - positions[:, None]  # (T, T): key_pos - query_pos
        buckets = relative_position_bucket(relative, self.num_buckets, self.max_distance)
        return self.table(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, heads, T, T)


def attention_bias(
    attention_mask: torch.Tensor,  # (B, T) bool, True on real tokens
    position_bias: torch.Tensor | None,  # (1, heads, T, T) or None
    dtype: torch.dtype,
) -> torch.Tensor:
    """One additive float mask: relative bias plus -inf on padding keys. (B, heads or 1, T, T)"""
    padding = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    padding = padding.masked_fill(~attention_mask, float("-inf"))[:, None, None, :]  # (B, 1, 1, T)
    return padding if position_bias is None else position_bias.to(dtype) + padding


@dataclass(frozen=True)
class FlexBias:
    """What the flex path reads in place of the dense additive mask."""

    block_mask: BlockMask  # padding keys, in blocks of 128 x 128; fully real blocks skip the mask
    position_bias: torch.Tensor | None  # (heads, T, T), contiguous; None without the relative bias


def flex_bias(
    attention_mask: torch.Tensor,  # (B, T) bool, True on real tokens
    position_bias: torch.Tensor | None,  # (1, heads, T, T) or None
) -> FlexBias:
    """The BlockMask of real keys and the bias table expanded per (head, query, key).

    The bias is captured as a full (heads, T, T) tensor rather than a 1-D lookup by distance: the
    fused backward scatters the bias gradient with atomic adds, and with a 1-D table every (q, k) on
    a diagonal hits the same address, while per-pair entries collide only across the batch. It keeps
    the table's dtype (fp32 under autocast, so the gradient accumulates in fp32): for base
    12 x 512 x 512 x 4 B = 12 MiB, which stays in an H100's 50 MiB L2. Its gradient reaches the table
    through the ordinary embedding backward.
    """
    batch, seq_len = attention_mask.shape

    def key_is_real(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, k_idx: torch.Tensor) -> torch.Tensor:
        return attention_mask[b, k_idx]

    block_mask = create_block_mask(key_is_real, batch, None, seq_len, seq_len, device=attention_mask.device)
    bias = None if position_bias is None else position_bias[0].contiguous()  # (heads, T, T), the table's dtype
    return FlexBias(block_mask, bias)


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout_p: float = 0.0
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v, written out; (B, heads, T, d) in and out."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias  # (B, heads, T, T)
    probs = F.dropout(torch.softmax(scores.float(), dim=-1).to(q.dtype), p=dropout_p)
    return probs @ v


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout_p: float = 0.0
) -> torch.Tensor:
    # SDPA scales q k^T by 1/sqrt(d) and then adds attn_mask: exactly the paper's order.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)


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
    return _flex_kernel(q.device)(q, k, v, score_mod=score_mod, block_mask=bias.block_mask)


ATTENTION_IMPLEMENTATIONS = {"sdpa": sdpa_attention, "flex": flex_relative_attention, "reference": reference_attention}


def check_attention_choice(choice: str) -> None:
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention implementation {choice!r}; choose one of {ATTENTION_CHOICES}")


def resolve_attention(choice: str, device: torch.device, dropout_active: bool) -> str:
    """The implementation to run for `choice`: 'auto' is flex on CUDA while no attention dropout is
    active, SDPA otherwise; explicit 'flex' with active attention dropout is an error, never a silent drop."""
    check_attention_choice(choice)
    if choice == "auto":
        return "flex" if device.type == "cuda" and not dropout_active else "sdpa"
    if choice == "flex" and dropout_active:
        raise ValueError(
            "flex attention has no attention dropout: set the model's attention_dropout to 0 "
            "(the fast path), evaluate in eval mode, or use 'sdpa'"
        )
    return choice


class SelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)  # fused Q, K, V
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention_dropout = cfg.attention_dropout

    def forward(self, x: torch.Tensor, bias: torch.Tensor | FlexBias, implementation: str = "sdpa") -> torch.Tensor:
        """`bias` is `attention_bias(...)` for 'sdpa' and 'reference', `flex_bias(...)` for 'flex'."""
        batch, seq_len, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq_len, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d)
        attend = ATTENTION_IMPLEMENTATIONS[implementation]
        y = attend(q, k, v, bias, self.attention_dropout if self.training else 0.0)  # (B, h, T, d)
        return self.out(y.transpose(1, 2).reshape(batch, seq_len, width))
