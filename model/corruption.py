"""Corruption maths (docs/method.md section 3): dynamic masking, the SCL crop window, replacement sampling.

Masking and cropping run on the data side (the Ray Data stream calls `make_pretraining_batch`);
replacement sampling runs on the model side because it needs the auxiliary model's logits.
Every function is pure: randomness comes only from the `torch.Generator` passed in, so the same
seed gives the same batch on any worker.

The batch contract between the stream and the training loop (all tensors on CPU from the stream):

    input_ids       (B, T)  int64  x_orig: [CLS] first, documents joined by [SEP], padded with [PAD]
    attention_mask  (B, T)  bool   True on real tokens
    masked_ids      (B, T)  int64  input_ids with [MASK] at the masked positions M
    mask_positions  (B, T)  bool   M: never [CLS], never padding
    crop_ids        (B, Tc) int64  [CLS] + a contiguous span of input_ids, Tc = int(crop_fraction * T)
    crop_attention_mask (B, Tc) bool

`model.objective.to_device` adds, computed on the host before the move, `masked_index` (N,) int64
(M as flat indices) and `all_real` (a Python bool: no padding in either view). With a fixed shape
(`train.fixed_shapes`) the index is padded to `prediction_slots` entries and `masked_valid` (P,) bool
marks the real ones.
"""

from __future__ import annotations

from collections.abc import Sequence
import torch

from .config import SpecialTokens

# Randomness for a batch: one generator for all rows, or one per row (row i draws only from generators[i],
# so a row's corruption depends on nothing else in its batch: `jobs.data.stream.corrupt`), or None.
Generators = torch.Generator | Sequence[torch.Generator] | None

BATCH_KEYS = ("input_ids", "attention_mask", "masked_ids", "mask_positions", "crop_ids", "crop_attention_mask")




def uniform(batch: int, width: int | None, generator: Generators, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """U[0, 1) draws of shape (batch,) or (batch, width). With one generator per row, row i is exactly what
    `torch.rand` of one row would draw from generators[i]: a batch corrupted at once equals its rows
    corrupted one by one, at a tenth of the CPU (32 rows of 32 tokens: 23.0 -> 2.2 ms on one core)."""
    shape = (batch,) if width is None else (batch, width)
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand(shape, generator=generator, dtype=dtype)
    if len(generator) != batch:
        raise ValueError(f"{len(generator)} generators for a batch of {batch} rows")
    return torch.cat([torch.rand((1, *shape[1:]), generator=g, dtype=dtype) for g in generator])


def mask_count(length: torch.Tensor, rate: float, u: torch.Tensor) -> torch.Tensor:
    """The paper's (fairseq's) count rule: int(rate * length + U[0,1)), so the expectation is exact."""
    return (rate * length.to(torch.float64) + u.to(torch.float64)).floor().long()


# The largest float64 below 1: torch.rand's float64 draws are multiples of 2**-53 in [0, 1).
LARGEST_UNIFORM = 1.0 - 2.0**-53


def max_mask_count(rate: float, length: int) -> int:
    """The most positions `choose_mask_positions` can mask in a row of at most `length` tokens:
    `mask_count` at the largest draw u < 1, evaluated by the same floating-point rule. The rule only
    grows with the length and with u (rounding is monotone), so no row ever exceeds it. That is
    ceil(rate * length), or rate * length + 1 where that product is whole (32.0 + u can round to 33)."""
    return int(mask_count(torch.tensor(length), rate, torch.tensor(LARGEST_UNIFORM)))


def prediction_slots(rate: float, batch: int, length: int) -> int:
    """The fixed number of masked-position slots of a (batch, length) block (BERT's and ELECTRA's
    `max_predictions_per_seq`, times the batch): `max_mask_count` per row, a bound that holds by
    construction, so padding to it never drops a masked position. The slack over the expected
    rate * length per row is below one slot per row (77 slots for 76.8 at T=512 and rate 0.15)."""
    return batch * max_mask_count(rate, length)


def choose_mask_positions(
    input_ids: torch.Tensor,  # (B, T)
    attention_mask: torch.Tensor,  # (B, T) bool
    rate: float,
    generator: Generators = None,
    cls_id: int = SpecialTokens.cls,
) -> torch.Tensor:
    """Pick `mask_count` positions per row uniformly without replacement among real, non-[CLS] tokens."""
    batch, width = input_ids.shape
    candidates = attention_mask & (input_ids != cls_id)  # (B, T)
    lengths = attention_mask.sum(dim=1)  # (B,)
    u = uniform(batch, None, generator, torch.float64)
    counts = torch.minimum(mask_count(lengths, rate, u), candidates.sum(dim=1))  # (B,)
    # Rank positions by a random key; non-candidates get keys above every candidate's, so the first
    # `count` ranks are a uniform sample of candidates without replacement.
    keys = uniform(batch, width, generator)
    keys = torch.where(candidates, keys, torch.full_like(keys, 2.0))
    ranks = keys.argsort(dim=1).argsort(dim=1)  # (B, T)
    return ranks < counts[:, None]


def apply_mask(input_ids: torch.Tensor, positions: torch.Tensor, mask_id: int = SpecialTokens.mask) -> torch.Tensor:
    """Every chosen position becomes [MASK] (COCO-LM uses no 80/10/10 split)."""
    return torch.where(positions, torch.full_like(input_ids, mask_id), input_ids)


def crop_length(length: torch.Tensor, fraction: float) -> torch.Tensor:
    """Crop length int(fraction * length), counting the [CLS] it keeps; at least the [CLS] itself."""
    return (fraction * length.to(torch.float64)).floor().long().clamp(min=1)


def crop_window(
    input_ids: torch.Tensor,  # (B, T)
    attention_mask: torch.Tensor,  # (B, T) bool
    fraction: float,
    generator: Generators = None,
    pad_id: int = SpecialTokens.pad,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous span of the original sequence with a random start, [CLS] kept at its head.

    Returns (crop_ids, crop_attention_mask), both (B, int(fraction * T)); rows shorter than the
    block are cropped to int(fraction * length) and padded.
    """
    batch, width = input_ids.shape
    crop_width = max(1, int(fraction * width))
    lengths = attention_mask.sum(dim=1)  # (B,)
    crop_lengths = crop_length(lengths, fraction)  # (B,) including [CLS]
    # The span covers crop_length - 1 content tokens out of positions 1 .. length - 1.
    starts_available = lengths - crop_lengths + 1  # number of valid start positions, >= 1
    u = uniform(batch, None, generator, torch.float64)
    starts = 1 + (u * starts_available.to(torch.float64)).floor().long()  # (B,)
    offsets = torch.arange(crop_width - 1)  # (Tc - 1,)
    source = (starts[:, None] + offsets[None, :]).clamp(max=width - 1)  # (B, Tc - 1)
    span = input_ids.gather(1, source)
    crop_ids = torch.cat([input_ids[:, :1], span], dim=1)  # (B, Tc)
    crop_attention_mask = torch.arange(crop_width)[None, :] < crop_lengths[:, None]  # (B, Tc)
    crop_ids = torch.where(crop_attention_mask, crop_ids, torch.full_like(crop_ids, pad_id))
    return crop_ids, crop_attention_mask


def make_pretraining_batch(
    input_ids: torch.Tensor,  # (B, T) packed blocks
    mask_rate: float = 0.15,
    crop_fraction: float = 0.9,
    generator: Generators = None,
    special: SpecialTokens = SpecialTokens(),
) -> dict[str, torch.Tensor]:
    """Masked view and crop view of a batch of packed blocks: the batch contract in this module's doc."""
    input_ids = input_ids.long()
    attention_mask = input_ids != special.pad
    positions = choose_mask_positions(input_ids, attention_mask, mask_rate, generator, special.cls)
    crop_ids, crop_attention_mask = crop_window(input_ids, attention_mask, crop_fraction, generator, special.pad)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "masked_ids": apply_mask(input_ids, positions, special.mask),
        "mask_positions": positions,
        "crop_ids": crop_ids,
        "crop_attention_mask": crop_attention_mask,
    }


MASK_RATE = 0.15  # the paper's masking rate: `random_batch`'s


def random_batch(batch: int, seq_len: int, vocab_size: int, crop_fraction: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Packed blocks of uniform random tokens (no padding, as the stream packs them), masked at `MASK_RATE`
    and cropped: what `python -m bench` times and the tests train on."""
    generator = torch.Generator().manual_seed(seed)
    first_regular = SpecialTokens.mask + 1
    ids = torch.randint(first_regular, vocab_size, (batch, seq_len), generator=generator)
    ids[:, 0] = SpecialTokens.cls
    return make_pretraining_batch(ids, MASK_RATE, crop_fraction, generator)


def sample_replacements(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per masked position from softmax(logits) at temperature 1, computed in fp32. (N, V) -> (N,)

    Inverse-CDF sampling, one uniform per row: torch.multinomial draws an exponential per vocabulary
    entry (N x V of them), 8% of a study-cpu COCO-LM step on a CPU. A token of probability 0 adds
    nothing to the CDF, so no u lands on it.
    """
    cdf = replacement_cdf(logits)
    u = torch.rand((cdf.shape[0], 1), generator=generator, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


@torch.library.custom_op("cocolm::replacement_cdf", mutates_args=())
def replacement_cdf(logits: torch.Tensor) -> torch.Tensor:
    """The running sum of softmax(logits) along each row, in fp32. (N, V) -> (N, V)

    An op the compiler does not look into: compiled, the cumsum would be inductor's scan, which it
    splits over V when there are few rows (N of 80 in a B 4, T 128 batch), and torch 2.11's inductor (the
    GPU machines') cannot generate a split scan, neither its loads nor the auxiliary's accuracy argmax
    fused into it: the whole-step compile would stop there (docs/design.md section 7.3). Here aten
    computes the CDF, compiled or not, so the draws are eager's.

    Non-finite logits (a diverged auxiliary) are made finite first: the draw would otherwise be
    meaningless (NaN probabilities) before the step's loss exists. The same logits make the auxiliary's
    loss non-finite, so the training loop's one non-finite check stops the run with its own message.
    """
    finite = torch.finfo(torch.float32).max / 2
    probs = torch.softmax(logits.float().nan_to_num(nan=0.0, posinf=finite, neginf=-finite), dim=-1)
    return probs.cumsum(-1)


@replacement_cdf.register_fake
def _(logits: torch.Tensor) -> torch.Tensor:
    return logits.new_empty(logits.shape, dtype=torch.float32)


def random_replacements(
    count: int, vocab_size: int, device: torch.device, generator: torch.Generator | None = None,
    special: SpecialTokens = SpecialTokens(),
) -> torch.Tensor:
    """The `random_replace` ablation: tokens drawn uniformly from the regular vocabulary instead of
    auxiliary samples. Never a special token or a filler (`SpecialTokens.never_drawn`; the platform's ids
    0-4): an auxiliary never proposes those for a real word either, and a [PAD] or [SEP] inside a sequence
    would change what the main encoder reads beyond one replaced word.

    The r-th regular id is r shifted up once per never-drawn id at or below it (taken in ascending order):
    with the platform's ids 0-4 that is randint(5, V) itself, the same draws from the same generator."""
    skipped = special.never_drawn
    drawn = torch.randint(0, vocab_size - len(skipped), (count,), device=device, generator=generator)
    for token in skipped:
        drawn = drawn + (drawn >= token).long()
    return drawn


def bert_mask_inputs(
    targets: torch.Tensor, vocab_size: int, generator: torch.Generator | None = None,
    special: SpecialTokens = SpecialTokens(),
) -> torch.Tensor:
    """BERT's and RoBERTa's input at the chosen positions (the `roberta_mlm` baseline): 80% [MASK],
    10% a random regular token, 10% the original token; the MLM loss is taken at all of them. (N,)"""
    u = torch.rand(targets.shape, device=targets.device, generator=generator)
    random_tokens = random_replacements(targets.numel(), vocab_size, targets.device, generator, special)
    mask = torch.full_like(targets, special.mask)
    return torch.where(u < 0.8, mask, torch.where(u < 0.9, random_tokens, targets))


def electra_generator_inputs(
    targets: torch.Tensor, unchanged_fraction: float, generator: torch.Generator | None = None,
    mask_id: int = SpecialTokens.mask,
) -> torch.Tensor:
    """ELECTRA's generator input at the chosen positions (its `pretrain_helpers.mask`): each one reads
    [MASK] with probability 1 - `unchanged_fraction` (0.85 in ELECTRA) and its original token otherwise;
    the generator's MLM loss and the replacements are taken at all of them. COCO-LM's auxiliary reads
    [MASK] everywhere (`unchanged_fraction` 0). (N,)"""
    if unchanged_fraction <= 0:
        return torch.full_like(targets, mask_id)
    u = torch.rand(targets.shape, device=targets.device, generator=generator)
    return torch.where(u < unchanged_fraction, targets, torch.full_like(targets, mask_id))

