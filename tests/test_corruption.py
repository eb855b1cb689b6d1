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


# ----------------------------------------------------------------------------- the authors' ids

def authors_ids() -> SpecialTokens:
    """The ids of the authors' dictionary (tests/fixtures/official-cocolm: 417 ids, madeupword fillers 412-415)."""
    from pathlib import Path

    from jobs.data.schemes import load_scheme

    return load_scheme(Path(__file__).parent / "fixtures" / "official-cocolm").special_tokens


def test_the_authors_dictionary_gives_their_specials_and_its_fillers():
    assert authors_ids() == SpecialTokens(pad=1, unk=3, cls=0, sep=2, mask=416, fillers=(412, 413, 414, 415))


def test_corruption_with_the_authors_ids_is_the_platforms_under_the_renaming_of_ids():
    """Which positions are masked and which span is cropped depends on where [CLS] and [PAD] are, never on
    how they are numbered: an authors' batch, renamed id for id into the platform's numbering, corrupts as the
    renamed batch does with the platform's ids. So [CLS] and padding are never masked and [MASK] is theirs."""
    theirs, ours = authors_ids(), S
    vocab = 417
    specials = {theirs.pad: ours.pad, theirs.unk: ours.unk, theirs.cls: ours.cls, theirs.sep: ours.sep,
                theirs.mask: ours.mask}
    rest_theirs = [i for i in range(vocab) if i not in specials]
    rest_ours = [i for i in range(vocab) if i not in specials.values()]
    rename = torch.empty(vocab, dtype=torch.long)
    rename[list(specials)] = torch.tensor(list(specials.values()))
    rename[rest_theirs] = torch.tensor(rest_ours)
    g = torch.Generator().manual_seed(21)
    ids = torch.randint(4, 412, (6, 40), generator=g)  # their regular pieces, a [SEP] between documents
    ids[:, 0], ids[:, 17] = theirs.cls, theirs.sep
    ids[2, 25:], ids[5, 9:] = theirs.pad, theirs.pad
    seeds = [31, 32, 33, 34, 35, 36]
    got = make_pretraining_batch(ids, generator=[torch.Generator().manual_seed(s) for s in seeds], special=theirs)
    expected = make_pretraining_batch(rename[ids], generator=[torch.Generator().manual_seed(s) for s in seeds])
    for key in expected:
        assert torch.equal(rename[got[key]] if got[key].dtype == torch.int64 else got[key], expected[key]), key
    chosen = got["mask_positions"]
    assert chosen.any() and not (chosen & ((ids == theirs.cls) | (ids == theirs.pad))).any()
    assert (got["masked_ids"][chosen] == theirs.mask).all() and torch.equal(got["attention_mask"], ids != theirs.pad)


def test_random_replacements_never_draw_the_authors_specials_or_fillers_and_reach_every_regular_id():
    theirs = authors_ids()
    drawn = random_replacements(200_000, 417, torch.device("cpu"), torch.Generator().manual_seed(22), theirs)
    freq = torch.bincount(drawn, minlength=417)
    never = list(theirs.never_drawn)
    assert freq[never].sum() == 0 and freq.numel() == 417
    regular = freq[[i for i in range(417) if i not in never]].float() / drawn.numel()
    assert regular.numel() == 408 and torch.allclose(regular, torch.full((408,), 1 / 408), atol=0.0015)


def test_random_replacements_are_the_rth_regular_id_of_the_same_draw():
    """Against an independent computation: the generator's randint over the count of regular ids picks the
    r-th of the regular ids in ascending order (fillers between regular ids included). With the platform's
    ids that is randint(5, V) itself: the draws the committed studies made."""
    special = SpecialTokens(pad=1, unk=3, cls=0, sep=2, mask=19, fillers=(7, 9, 10))
    regular = [i for i in range(20) if i not in special.never_drawn]
    r = torch.randint(0, len(regular), (5000,), generator=torch.Generator().manual_seed(23))
    drawn = random_replacements(5000, 20, torch.device("cpu"), torch.Generator().manual_seed(23), special)
    assert drawn.tolist() == [regular[i] for i in r.tolist()]
    platform = random_replacements(5000, 300, torch.device("cpu"), torch.Generator().manual_seed(24))
    assert torch.equal(platform, torch.randint(5, 300, (5000,), generator=torch.Generator().manual_seed(24)))


def test_berts_inputs_with_the_authors_ids_read_their_mask_and_random_regular_ids():
    theirs = authors_ids()
    targets = torch.randint(4, 412, (60000,), generator=torch.Generator().manual_seed(25))
    inputs = bert_mask_inputs(targets, 417, torch.Generator().manual_seed(26), special=theirs)
    masked, kept = inputs == theirs.mask, inputs == targets
    random = ~masked & ~kept
    assert abs(masked.float().mean() - 0.8) < 0.01 and abs(random.float().mean() - 0.1) < 0.01
    assert not torch.isin(inputs[random], torch.tensor(theirs.never_drawn)).any()
