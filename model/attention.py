"""Self-attention with COCO-LM's relative position bias (docs/method.md section 2.2, docs/design.md section 7).

The bias is one `Embedding(num_buckets, num_heads)` table per encoder, shared by all its layers,
added to the attention logits after the 1/sqrt(head_dim) scaling; padding keys get -inf:

    out = dropout(softmax(q k^T / sqrt(d) + bias[bucket(j - i)] + padding)) v        (B, heads, T, d)

This file holds that definition: the buckets, the bias table, the one additive mask of bias and
padding (`attention_bias`), the two implementations that read it ('reference', the softmax written
out, which the tests compare every other against; 'sdpa', torch's `scaled_dot_product_attention`) and
`SelfAttention`. The faster implementations ('flex', 'triton'), their probes, fallbacks and per-shape
plans are the backends in `model.backends`, beside the kernels; an encoder asks them, through one
interface (`DenseAttention`, which `model.backends.AttentionBackends` extends), which implementation
a pass runs, the bias that pass reads, and the function each layer calls. An exported encoder
(`model.export`) carries this file but not `model.backends`: it runs the dense implementations alone.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import EncoderConfig

ATTENTION_CHOICES = ("auto", "sdpa", "flex", "triton", "reference")


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
        self.saturation = saturation_distance(cfg.rel_pos_buckets, cfg.rel_pos_max_distance, cfg.max_positions)
        # subtracted from every id: 0, or the authors' shift (`bucket_offset`, cfg.rel_pos_shift_by_min)
        self.offset = bucket_offset(cfg.rel_pos_buckets, cfg.rel_pos_max_distance,
                                    cfg.max_positions) if cfg.rel_pos_shift_by_min else 0

    def forward(self, seq_len: int) -> torch.Tensor:
        positions = torch.arange(seq_len, device=self.table.weight.device)
        relative = positions[None, :] - positions[:, None]  # (T, T): key_pos - query_pos
        buckets = relative_position_bucket(relative, self.num_buckets, self.max_distance) - self.offset
        # contiguous: a permuted view has last stride `heads`, which GPU SDPA kernels refuse
        return self.table(buckets).permute(2, 0, 1).contiguous().unsqueeze(0)  # (1, heads, T, T)

    def by_distance(self, seq_len: int) -> torch.Tensor:
        """(heads, 2S + 1): the bias of the distances key_pos - query_pos = -S ... S, entry distance + S,
        with S = min(`saturation`, T - 1): every pair farther apart shares the entry of -S or S (its
        bucket is the same), so this is all of the (T, T) lookup. In the table's dtype (fp32). What the
        Triton kernel reads; its gradient reaches the table through the ordinary embedding backward."""
        reach = min(self.saturation, seq_len - 1)
        relative = torch.arange(-reach, reach + 1, device=self.table.weight.device)
        buckets = relative_position_bucket(relative, self.num_buckets, self.max_distance) - self.offset
        return self.table(buckets).t().contiguous()


@functools.cache
def saturation_distance(num_buckets: int, max_distance: int, max_positions: int) -> int:
    """The smallest distance S from which every longer one, up to the longest the encoder takes
    (max_positions - 1), falls in the same bucket as S (per direction; the buckets are symmetric).
    86 at the paper's 32 buckets and max distance 128. On the CPU whatever device a model is built on
    (transformers builds remote-code models on the meta device)."""
    distances = torch.arange(max(max_positions, 1), device="cpu")
    buckets = relative_position_bucket(distances, num_buckets, max_distance)
    differs = (buckets != buckets[-1]).nonzero()
    return int(differs.max()) + 1 if len(differs) else 0


@functools.cache
def bucket_offset(num_buckets: int, max_distance: int, max_positions: int) -> int:
    """How far the authors' ids sit below ours: they shift by minus the smallest id over the
    max_positions x max_positions matrix (at distance -(max_positions - 1)), we by half - 1. 0 wherever
    that distance reaches the farthest bucket (the paper's 512 positions); 1 at 64 positions, 32 buckets.
    On the CPU, as `saturation_distance`."""
    farthest = torch.tensor([1 - max(max_positions, 1)], device="cpu")
    return int(relative_position_bucket(farthest, num_buckets, max_distance)[0])


# The memory-efficient SDPA kernel reads the mask with 16-element aligned rows; an unaligned mask is
# padded and copied inside every SDPA call (once per layer), an aligned one is used as it is.
MASK_ALIGNMENT = 16


def attention_bias(
    attention_mask: torch.Tensor | None,  # (B, T) bool, True on real tokens; None: no padding anywhere
    position_bias: torch.Tensor | None,  # (1, heads, T, T) or None
    dtype: torch.dtype,  # q's dtype: the fused kernels take a float mask only in the dtype of q
) -> torch.Tensor | None:
    """One additive float mask: relative bias plus -inf on padding keys. (B, heads or 1, T, T)

    Without padding (`attention_mask` None: packed pretraining blocks) it is the relative bias alone,
    (1, heads, T, T), broadcast over the batch inside the kernel: its gradient is then one (heads, T, T)
    per layer instead of (B, heads, T, T) to write and sum (base, T=512, B=32: 200 MB per layer call
    in bf16), and with neither padding nor relative bias there is no mask at all, so SDPA may take
    its flash kernel. Laid out for SDPA's fused GPU kernels: last stride 1 and every other stride a
    multiple of `MASK_ALIGNMENT`, the row length padded in memory (not in shape) where T is not a
    multiple of it.
    """
    if attention_mask is None:
        return None if position_bias is None else aligned_rows(position_bias.to(dtype))
    padding = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    padding = padding.masked_fill(~attention_mask, float("-inf"))[:, None, None, :]  # (B, 1, 1, T)
    mask = padding if position_bias is None else position_bias.to(dtype) + padding
    return aligned_rows(mask)


def aligned_rows(mask: torch.Tensor) -> torch.Tensor:
    """`mask` with a contiguous last dimension and rows that start on `MASK_ALIGNMENT` elements."""
    seq_len = mask.shape[-1]
    extra = -seq_len % MASK_ALIGNMENT
    if extra == 0:
        return mask.contiguous()
    return F.pad(mask, (0, extra))[..., :seq_len]  # differentiable, unlike writing into an aligned buffer


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype q, k and v will have: autocast's (bf16) where it is on, else x's own."""
    device_type = x.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, dropout_p: float = 0.0,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v, written out; (B, heads, T, d) in and out. `keep` (B, heads,
    T, T) bool is a given dropout mask (a fused kernel's, to compare with it): kept probabilities are
    scaled by 1 / (1 - dropout_p), as F.dropout does with the mask it draws."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, heads, T, T)
    if bias is not None:
        scores = scores + bias
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    probs = F.dropout(probs, p=dropout_p) if keep is None else probs * keep / (1 - dropout_p)
    return probs @ v


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, dropout_p: float = 0.0
) -> torch.Tensor:
    # SDPA scales q k^T by 1/sqrt(d) and then adds attn_mask: exactly the paper's order.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)


class AttentionPass(NamedTuple):
    """One encoder pass, as its attention's choice depends on it: what `DenseAttention.choose`, `.bias`
    and the backends' probes read."""

    device: torch.device
    heads: int
    head_dim: int
    dtype: torch.dtype  # q's dtype (`compute_dtype`)
    relative: bool  # with the relative bias
    seq_len: int
    padded: bool  # a (B, T) mask of real keys; False: packed blocks, no padding anywhere
    dropout_p: float  # attention dropout, 0 where it is not active
    grad: bool  # a pass with gradients
    batch: int
    reach: int  # S of the bias by distance (heads, 2S + 1): min(saturation, T - 1); 0 without the bias


def check_attention_choice(choice: str) -> None:
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention implementation {choice!r}; choose one of {ATTENTION_CHOICES}")


class DenseAttention:
    """The interface an encoder calls, per pass: `choose` the implementation, build the `bias` it reads,
    and the `function` every layer calls. This one runs the dense implementations alone ('auto' is
    SDPA): what an exported encoder has. `model.backends.AttentionBackends` extends it with flex and
    the Triton kernel, their probes and fallbacks."""

    def choose(self, choice: str, request: AttentionPass) -> str:
        check_attention_choice(choice)
        if choice in ("flex", "triton"):
            raise RuntimeError(f"this copy of the model code has no model.backends (an exported encoder), so no "
                               f"{choice!r}: use attention 'auto', 'sdpa' or 'reference'")
        return "sdpa" if choice == "auto" else choice

    def bias(self, implementation: str, request: AttentionPass, relative: RelativePositionBias | None,
             padding: torch.Tensor | None) -> object:
        """The bias every layer of the pass reads: the additive mask (`attention_bias`)."""
        position_bias = relative(request.seq_len) if relative is not None else None
        return attention_bias(padding, position_bias, request.dtype)

    def function(self, implementation: str) -> Callable[..., torch.Tensor]:
        """(q, k, v, bias, dropout_p) -> out, (B, heads, T, d) in and out."""
        return {"sdpa": sdpa_attention, "reference": reference_attention}[implementation]

    def fallbacks(self) -> str:
        """Every fallback of this process with its cause; the dense implementations have none."""
        return ""


class SelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)  # fused Q, K, V
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention_dropout = cfg.attention_dropout

    def forward(self, x: torch.Tensor, bias: object, attend: Callable[..., torch.Tensor] = sdpa_attention) -> torch.Tensor:
        """`attend` and `bias` are the pass's (`DenseAttention.function` and `.bias`): for 'sdpa' and
        'reference' the additive mask `attention_bias(...)`."""
        batch, seq_len, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq_len, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d)
        y = attend(q, k, v, bias, self.attention_dropout if self.training else 0.0)  # (B, h, T, d)
        return self.out(y.transpose(1, 2).reshape(batch, seq_len, width))
