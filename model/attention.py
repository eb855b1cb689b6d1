"""Self-attention with COCO-LM's relative position bias (docs/method.md section 2.2, docs/design.md section 7).

The bias is one `Embedding(num_buckets, num_heads)` table per encoder, shared by all its layers,
added to the attention logits after the 1/sqrt(head_dim) scaling; padding keys get -inf. Three
implementations compute the same thing:

- 'sdpa' hands bias and padding to `scaled_dot_product_attention` as one additive float mask
  (B, heads, T, T). It applies attention dropout and is the default off CUDA. On a GPU the mask is
  laid out so that SDPA can run its fused memory-efficient kernel (which has the bias gradient and
  dropout): in q's dtype, last dimension contiguous, every other stride a multiple of 16 elements.
  A mask whose last stride is not 1 (a permuted bias lookup) sends every GPU call down the unfused
  math path, in fp32; see `attention_bias`.
- 'flex' is FlexAttention: the bias enters through a `score_mod` and padding through a `BlockMask`,
  so no (B, heads, T, T) tensor is materialised in forward or backward. On CUDA it runs as a
  compiled (fused Triton) kernel with block sizes chosen to fit the device's shared memory
  (`flex_kernel_options`); on CPU torch only has the unfused reference path, which the tests use.
  The first flex call per configuration on a GPU compiles a small probe; if that fails, attention
  falls back to SDPA for the rest of the process with one warning naming the cause (`flex_works`).
- 'triton' is our own fused kernel (`model.kernels.attention`): the bias by distance (heads, 2S + 1)
  read per tile, padding keys as a (B, T) mask, attention dropout with Philox inside the kernel, and
  the bias gradient reduced inside the kernel; no (B, heads, T, T) tensor in forward or backward,
  with or without dropout. It needs triton (an optional import inside model.kernels) and a CUDA
  device, or Triton's interpreter on CPU (the tests). On a GPU each shape (`TritonShape`: T, padding,
  dropout, with or without gradients, ...) is probed eagerly before its first call (`probe_triton`;
  `model.step.TrainingStep.warm_up` does it before a compiled step is traced); where that fails,
  that shape alone falls back, with one warning naming it and the cause, to what 'auto' picks
  (flex without active attention dropout, SDPA with it).
- 'reference' spells the softmax out; the tests compare the others against it.

'auto' (the default) picks what measured fastest on an H100 (docs/design.md 7.2): on CUDA flex while
no attention dropout is active and SDPA with it, SDPA elsewhere. Our kernel is chosen by name
('triton'): its three kernels take 1.25 ms per call at base (T 512, dropout 0.1), against SDPA's
1.88 ms, but the call as a whole took 2.04 ms and the COCO-LM step 134.1 ms against SDPA's 127.1 ms;
until the call is as fast as its kernels, 'auto' does not pick it.

Attention dropout and flex: FlexAttention has no dropout, and dropout on the attention probabilities
cannot be written as a score modification (dropping a probability
keeps the softmax's normaliser; masking a score changes it). The paper trains with attention
dropout 0.1, so we never drop it silently: asking for 'flex' explicitly while attention dropout is
active is an error, and the fallback from 'triton' takes flex only while no dropout is active.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from .config import EncoderConfig


def _fused_kernel_module():
    """model.kernels.attention (it imports without triton too), or None where this file runs without the
    subpackage: an exported encoder (model.export) carries this file but not model.kernels, as
    transformers copies remote code as flat modules and follows flat relative imports only. Imported by
    name for that reason; there 'triton' cannot run and raises, naming why."""
    try:
        return importlib.import_module(".kernels.attention", __package__)
    except ModuleNotFoundError as error:
        if error.name != f"{__package__}.kernels":
            raise
        return None


_FUSED_KERNELS = _fused_kernel_module()

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
    (None when none does: then `flex_works` finds flex unusable and SDPA runs)."""
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


_flex_checked: dict[tuple, bool] = {}
_flex_failure: list[str] = []  # the cause, once flex failed: every later check answers False at once


def failure_cause(error: Exception) -> str:
    """An exception as a warning or a log names it: its type and first line."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def _kernel_works(checked: dict, failures: list[str], key: tuple, probe: Callable[[], None],
                  warning: str) -> bool:
    """`probe()` once per configuration `key`, and after the first failure never again; a failure warns
    once with `warning` (its `{cause}` filled in: the exception's type and first line)."""
    if failures:
        return False
    if key not in checked:
        try:
            probe()
            checked[key] = True
        except Exception as error:  # inductor, Triton and CUDA raise many types; all mean "not here"
            cause = failure_cause(error)
            failures.append(cause)
            checked[key] = False
            warnings.warn(warning.format(cause=cause), RuntimeWarning, stacklevel=3)
    return checked[key]


def flex_works(key: tuple, probe: Callable[[], None]) -> bool:
    """Whether compiled flex runs for the configuration `key`: `probe()` once per key, and after the
    first failure never again. A failure warns once, naming the cause, and SDPA takes over: a GPU
    run never dies because a kernel config does not fit (tiles over a GPU's shared memory, say, or a
    torch version whose kernel options differ)."""
    return _kernel_works(_flex_checked, _flex_failure, key, probe,
                         "FlexAttention does not run on this device ({cause}); attention uses SDPA "
                         "from here on in this process")


def flex_failure() -> str | None:
    """Why flex was given up in this process, or None while it works (or was never tried)."""
    return _flex_failure[0] if _flex_failure else None


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


def own_random_state(device: torch.device) -> contextlib.AbstractContextManager:
    """Torch's random state (CPU, and `device`'s where it is a GPU) put back on exit: a probe draws its
    random inputs and its dropout seeds without moving the stream a seeded run draws from, so a run gives
    the same numbers whether or not a probe ran before its first call."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


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
    every = None
    if distance_bias is not None and _FUSED_KERNELS is not None:
        every = _FUSED_KERNELS.every_distance(distance_bias, seq_len)
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
    return fused_relative_attention(q, k, v, bias.distance_bias, bias.key_mask, dropout_p, blocks=bias.blocks,
                                    every=bias.every)


def fused_relative_attention(*args, **kwargs) -> torch.Tensor:
    """`model.kernels.attention.relative_attention`, where this copy of the code has it."""
    if _FUSED_KERNELS is None:
        raise RuntimeError("this copy of the model code has no model.kernels (an exported encoder): "
                           "use attention 'auto', 'sdpa' or 'flex'")
    return _FUSED_KERNELS.relative_attention(*args, **kwargs)


class TritonShape(NamedTuple):
    """One problem the Triton kernel is probed for, and falls back for on its own: everything its
    compiled variants and its tuning depend on (the batch size is in neither). A named tuple, which
    dynamo hashes and compares while it traces a compiled step (`triton_probed`)."""

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


_triton_checked: dict[TritonShape, bool] = {}
_triton_failures: dict[TritonShape, str] = {}  # shape -> why the kernel does not run there


def triton_works(shape: TritonShape, probe: Callable[[], None]) -> bool:
    """Whether the Triton kernel runs at `shape`: `probe()` once per shape, eagerly. A failure there (in
    compile, tuning, forward or backward) warns once, naming the shape and the cause, and that shape runs
    `fallback_attention` from then on in this process; every other shape keeps the kernel."""
    if shape not in _triton_checked:
        try:
            probe()
            _triton_checked[shape] = True
        except Exception as error:  # Triton, its compiler and CUDA raise many types; all mean "not here"
            _triton_checked[shape] = False
            _triton_failures[shape] = failure_cause(error)
            warnings.warn(f"the Triton attention kernel does not run at {shape} ({_triton_failures[shape]}); "
                          "that shape uses flex (no attention dropout active) or SDPA (dropout active) from here "
                          "on in this process, the others keep the kernel", RuntimeWarning, stacklevel=3)
    return _triton_checked[shape]


def triton_probed(shape: TritonShape) -> bool:
    """Whether the Triton kernel was probed at `shape` and runs there, without probing: what a compiled
    step asks while it is traced, when no probe can run. A shape first met there was not warmed up before
    the step was compiled (`model.step.TrainingStep.warm_up`): it falls back, recorded but not warned
    about (a warning would break the graph); `model.encoder.attention_report` names it."""
    if shape not in _triton_checked:
        _triton_checked[shape] = False
        _triton_failures[shape] = "not probed before the step was compiled (no eager warm-up met this shape)"
    return _triton_checked[shape]


def triton_failures() -> dict[TritonShape, str]:
    """Every shape at which the Triton kernel was given up in this process, with the cause."""
    return dict(_triton_failures)


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
            out = fused_relative_attention(q, k, v, bias, mask, shape.dropout_p, blocks=blocks)
            if shape.grad:
                out.float().sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_plans: list[set[TritonShape]] = []  # while `planning()`: the shapes the Triton kernel would be probed at


@contextlib.contextmanager
def planning():
    """Yields the set of every `TritonShape` the encoders' passes meet inside the block, on any device,
    without probing or running the Triton kernel (they run its fallback): what `kernel_variants` counts
    for `python -m model.bench --compiles`."""
    shapes: set[TritonShape] = set()
    _plans.append(shapes)
    try:
        yield shapes
    finally:
        _plans.pop()


def planned(shape: TritonShape) -> bool:
    """Inside `planning()`: records `shape` and answers True (the caller then runs the fallback)."""
    if _plans:
        _plans[-1].add(shape)
    return bool(_plans)


def kernel_variants(shapes: set[TritonShape]) -> set[tuple]:
    """The distinct compiled kernels (binaries) the probe and warm-up of these shapes build in one process,
    each named by what Triton keys a binary on: the kernel, its tiles, warps and stages, its constexpr
    flags and how it specialises T (a multiple of 16 or not). Per shape: the forward, and for a pass with
    gradients dK/dV and dQ; each at `PROBE_BLOCKS` (the probe; passes without gradients run there), and,
    with gradients, at every tile its autotuning times (`TILES`). T = 512 and 496 share binaries but not
    their tuning, which times the binaries it already has without compiling them again."""
    kernels = _FUSED_KERNELS
    probe_tile = (*PROBE_BLOCKS, *kernels._launch_options(*PROBE_BLOCKS).values())
    variants = set()
    for shape in shapes:
        problem = (shape.seq_len % 16 == 0, shape.head_dim, shape.dtype, shape.relative, shape.padded,
                   shape.dropout_p > 0)
        for kind in ("forward", "dkdv", "dq") if shape.grad else ("forward",):
            tiles = {probe_tile, *(kernels.TILES[kind] if shape.grad else ())}
            variants |= {(kind, tile, problem) for tile in tiles}
    return variants


ATTENTION_IMPLEMENTATIONS = {
    "sdpa": sdpa_attention, "flex": flex_relative_attention, "triton": triton_relative_attention,
    "reference": reference_attention,
}


def check_attention_choice(choice: str) -> None:
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention implementation {choice!r}; choose one of {ATTENTION_CHOICES}")


def resolve_attention(choice: str, device: torch.device, dropout_active: bool) -> str:
    """The implementation to run for `choice`: 'auto' is `fallback_attention` (flex on CUDA without active
    attention dropout, SDPA otherwise: the fastest measured on an H100, module docstring); explicit 'flex'
    with active attention dropout is an error, never a silent drop. Where 'triton' fails at a shape, the
    encoder runs `fallback_attention` there."""
    check_attention_choice(choice)
    if choice == "auto":
        return fallback_attention(device, dropout_active)
    if choice == "flex" and dropout_active:
        raise ValueError(
            "flex attention has no attention dropout: set the model's attention_dropout to 0 "
            "(the fast path), evaluate in eval mode, or use 'sdpa'"
        )
    return choice


def fallback_attention(device: torch.device, dropout_active: bool) -> str:
    """'auto''s choice, and what runs where the Triton kernel does not: flex on CUDA while no attention
    dropout is active (itself probed, with SDPA behind it), SDPA otherwise."""
    return "flex" if device.type == "cuda" and not dropout_active else "sdpa"


class SelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)  # fused Q, K, V
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention_dropout = cfg.attention_dropout

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor | FlexBias | TritonBias | None, implementation: str = "sdpa"
    ) -> torch.Tensor:
        """`bias` is `attention_bias(...)` for 'sdpa' and 'reference', `flex_bias(...)` for 'flex',
        a `TritonBias` for 'triton'."""
        batch, seq_len, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq_len, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d)
        attend = ATTENTION_IMPLEMENTATIONS[implementation]
        y = attend(q, k, v, bias, self.attention_dropout if self.training else 0.0)  # (B, h, T, d)
        return self.out(y.transpose(1, 2).reshape(batch, seq_len, width))
