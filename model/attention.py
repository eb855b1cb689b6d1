"""Self-attention with COCO-LM's relative position bias (SPEC section 1).

The bias is one `Embedding(num_buckets, num_heads)` table per encoder, shared by all its layers,
added to the attention logits after the 1/sqrt(head_dim) scaling; padding keys get -inf. The fast
path hands bias and padding to `scaled_dot_product_attention` as one additive float mask; the
reference path spells the softmax out and is what the tests compare against.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import EncoderConfig


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


ATTENTION_IMPLEMENTATIONS = {"sdpa": sdpa_attention, "reference": reference_attention}


class SelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)  # fused Q, K, V
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention_dropout = cfg.attention_dropout
        self.implementation = "sdpa"

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        batch, seq_len, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq_len, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d)
        attend = ATTENTION_IMPLEMENTATIONS[self.implementation]
        y = attend(q, k, v, bias, self.attention_dropout if self.training else 0.0)  # (B, h, T, d)
        return self.out(y.transpose(1, 2).reshape(batch, seq_len, width))
