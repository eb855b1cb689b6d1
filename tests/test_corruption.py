"""Masking, cropping and replacement sampling (docs/method.md section 3) against independent computations."""

import math

import pytest
import torch

from model.corruption import (
    SpecialTokens,
    apply_mask,
    choose_mask_positions,
    crop_window,
    make_pretraining_batch,
    mask_count,
    bert_mask_inputs,
    random_replacements,
    sample_replacements,
)

S = SpecialTokens()


def blocks(lengths: list[int], width: int, seed: int = 0) -> torch.Tensor:
    """Rows of random regular tokens, [CLS] first, padded to `width`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(S.mask + 1, 500, (len(lengths), width), generator=g)
    ids[:, 0] = S.cls
    for row, n in enumerate(lengths):
        ids[row, n:] = S.pad
    return ids


def test_mask_count_rule_by_hand():
    lengths = torch.tensor([10, 10, 20, 7, 1])
    u = torch.tensor([0.49, 0.51, 0.99, 0.0, 0.9])
    # int(0.15 * len + u): 1.5+.49 -> 1; 1.5+.51 -> 2; 3+.99 -> 3; 1.05 -> 1; .15+.9 -> 1
    assert mask_count(lengths, 0.15, u).tolist() == [1, 2, 3, 1, 1]


def test_mask_counts_follow_the_rule_and_average_to_the_rate():
    length = 10  # 0.15 * 10 = 1.5: every row masks 1 or 2, half of them each in expectation
    ids = blocks([length] * 4000, length)
    positions = choose_mask_positions(ids, ids != S.pad, 0.15, torch.Generator().manual_seed(1))
    counts = positions.sum(1)
    assert set(counts.tolist()) == {1, 2}
    assert abs(counts.float().mean().item() - 1.5) < 0.05


def test_masked_fraction_is_fifteen_percent_and_never_cls_or_padding():
    lengths = [128] * 300 + [37] * 300 + [90] * 300
    ids = blocks(lengths, 128)
    real = ids != S.pad
    positions = choose_mask_positions(ids, real, 0.15, torch.Generator().manual_seed(2))
    assert not positions[:, 0].any()
    assert not positions[~real].any()
    assert not positions[ids == S.cls].any()
    fraction = positions.sum().item() / real.sum().item()
    assert abs(fraction - 0.15) < 0.003


def test_positions_are_uniform_over_candidates():
    ids = blocks([11] * 20000, 11)
    positions = choose_mask_positions(ids, ids != S.pad, 0.15, torch.Generator().manual_seed(3))
    per_position = positions.float().mean(0)
    assert per_position[0] == 0
    expected = positions.sum().item() / (20000 * 10)
    assert torch.allclose(per_position[1:], torch.full((10,), expected), atol=0.01)


def test_apply_mask_replaces_exactly_the_chosen_positions_with_mask():
    ids = blocks([16, 12], 16)
    positions = choose_mask_positions(ids, ids != S.pad, 0.3, torch.Generator().manual_seed(4))
    masked = apply_mask(ids, positions, S.mask)
    assert torch.equal(masked[positions], torch.full((int(positions.sum()),), S.mask))
    assert torch.equal(masked[~positions], ids[~positions])


@pytest.mark.parametrize("fraction", [0.7, 0.9, 1.0])
def test_crop_keeps_cls_and_is_a_contiguous_span_of_the_right_length(fraction):
    lengths = [64, 50, 9, 2, 1]
    ids = blocks(lengths, 64)
    crop_ids, crop_mask = crop_window(ids, ids != S.pad, fraction, torch.Generator().manual_seed(5))
    assert crop_ids.shape == (len(lengths), int(fraction * 64))
    for row, n in enumerate(lengths):
        expected_len = max(1, int(fraction * n))
        assert crop_mask[row].sum().item() == expected_len
        crop = crop_ids[row, :expected_len].tolist()
        assert crop[0] == S.cls
        assert (crop_ids[row, expected_len:] == S.pad).all()
        content, span = ids[row, 1:n].tolist(), crop[1:]
        starts = [s for s in range(len(content) - len(span) + 1) if content[s : s + len(span)] == span]
        assert starts, f"row {row}: crop is not a contiguous span of the original"


def test_crop_start_is_random_over_all_valid_starts():
    ids = blocks([20] * 4000, 20)  # crop length 18: 17 content tokens out of 19 -> 3 possible starts
    ids[:, 1:] = torch.arange(1, 20) + 100  # distinct tokens reveal the start
    crop_ids, _ = crop_window(ids, ids != S.pad, 0.9, torch.Generator().manual_seed(6))
    starts = crop_ids[:, 1] - 101
    counts = torch.bincount(starts, minlength=3)
    assert counts.numel() == 3 and (counts > 1200).all()


def test_make_pretraining_batch_is_seeded_and_follows_the_contract():
    ids = blocks([32, 20], 32)
    a = make_pretraining_batch(ids, generator=torch.Generator().manual_seed(7))
    b = make_pretraining_batch(ids, generator=torch.Generator().manual_seed(7))
    c = make_pretraining_batch(ids, generator=torch.Generator().manual_seed(8))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["mask_positions"], c["mask_positions"])
    assert a["input_ids"].dtype == a["masked_ids"].dtype == a["crop_ids"].dtype == torch.int64
    assert a["attention_mask"].dtype == a["mask_positions"].dtype == a["crop_attention_mask"].dtype == torch.bool
    assert a["crop_ids"].shape == (2, int(0.9 * 32))


def test_a_generator_per_row_corrupts_each_row_as_if_it_were_alone():
    """`jobs.data.stream.corrupt` corrupts a batch at once with one generator per block: every row must
    equal that block corrupted by itself with its own generator (padding included), and a batch whose
    generators do not match its rows is an error, not a silent reuse."""
    ids = blocks([32, 20, 7, 32], 32)
    seeds = [11, 12, 13, 14]
    together = make_pretraining_batch(ids, generator=[torch.Generator().manual_seed(s) for s in seeds])
    for row, seed in enumerate(seeds):
        alone = make_pretraining_batch(ids[row : row + 1], generator=torch.Generator().manual_seed(seed))
        assert all(torch.equal(together[key][row : row + 1], alone[key]) for key in alone), row
    with pytest.raises(ValueError, match="3 generators for a batch of 4 rows"):
        make_pretraining_batch(ids, generator=[torch.Generator() for _ in range(3)])


def test_replacements_follow_the_softmax():
    logits = torch.tensor([[0.0, math.log(3.0), -1e4]]).repeat(20000, 1)  # p = 1/4, 3/4, 0
    drawn = sample_replacements(logits, torch.Generator().manual_seed(9))
    freq = torch.bincount(drawn, minlength=3).float() / drawn.numel()
    assert torch.allclose(freq, torch.tensor([0.25, 0.75, 0.0]), atol=0.015)


def test_replacements_match_every_probability_of_a_wide_softmax():
    """Inverse-CDF sampling against the exact softmax, row by row, over a vocabulary of 64 with a few
    tokens near probability 0: no token drawn more or less often than its probability allows."""
    generator = torch.Generator().manual_seed(12)
    logits = torch.randn(4, 64, generator=generator) * 2.0
    logits[:, :3] = -1e4  # never drawn
    draws = 50000
    drawn = sample_replacements(logits.repeat_interleave(draws, 0), torch.Generator().manual_seed(13))
    freq = torch.stack([torch.bincount(row, minlength=64).float() / draws for row in drawn.view(4, draws)])
    probs = torch.softmax(logits, -1)
    sigma = (probs * (1 - probs) / draws).sqrt()
    assert (freq[:, :3] == 0).all()
    assert ((freq - probs).abs() <= 5 * sigma + 1e-4).all()
    again = sample_replacements(logits.repeat_interleave(draws, 0), torch.Generator().manual_seed(13))
    assert torch.equal(drawn, again)  # the generator alone decides the draw


def test_random_replacements_are_uniform_over_regular_tokens_only():
    drawn = random_replacements(50000, 15, torch.device("cpu"), torch.Generator().manual_seed(10))
    freq = torch.bincount(drawn, minlength=15).float() / drawn.numel()
    assert (freq[: S.mask + 1] == 0).all()  # never [PAD], [UNK], [CLS], [SEP] or [MASK]
    assert torch.allclose(freq[S.mask + 1:], torch.full((10,), 0.1), atol=0.01)


def test_bert_mask_inputs_are_80_percent_mask_10_random_10_unchanged():
    targets = torch.randint(S.mask + 1, 1000, (60000,), generator=torch.Generator().manual_seed(3))
    inputs = bert_mask_inputs(targets, 1000, torch.Generator().manual_seed(4))
    masked = inputs == S.mask
    kept = inputs == targets
    random = ~masked & ~kept
    assert abs(masked.float().mean() - 0.8) < 0.01 and abs(kept.float().mean() - 0.1) < 0.01
    assert abs(random.float().mean() - 0.1) < 0.01  # (a random draw equal to the target counts as kept: 0.1%)
    assert (inputs[random] > S.mask).all()  # random replacements are regular tokens


def test_sampling_survives_non_finite_logits():
    """A diverged auxiliary must not crash sampling: the loss, not multinomial, reports the divergence."""
    logits = torch.tensor([[float("nan")] * 4, [0.0, float("inf"), 0.0, 0.0], [float("-inf"), 0.0, 0.0, 0.0]])
    drawn = sample_replacements(logits, torch.Generator().manual_seed(11))
    assert drawn.shape == (3,) and drawn[1] == 1 and drawn[2] != 0
