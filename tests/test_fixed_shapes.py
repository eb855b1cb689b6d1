"""The fixed-shape step (`train.fixed_shapes`, `train.compile_step`): the masked-position index padded to
`prediction_slots`, the padded slots left out of every loss and accuracy. It gives today's losses,
signals and gradients on the same batch and draws, never drops a masked position, has the same
shapes for every batch, and compiles whole (`fullgraph=True`) with randomness drawn per call.
"""

from dataclasses import replace

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from jobs.cli import UserError
from jobs.pretraining.config import resolve
from jobs.pretraining.loop import check_step_options
from model import ObjectiveConfig, VARIANTS, build_pretraining_model, model_size
from model import objective as objective_module
from model.corruption import (LARGEST_UNIFORM, SpecialTokens, choose_mask_positions, make_pretraining_batch,
                              mask_count, max_mask_count, prediction_slots)
from model.losses import lm_loss, mlm_loss, valid_mean
from model.objective import pad_masked_index, masked_index, to_device
from model.step import TrainingStep, build_optimizer, compile_step, OptimizerConfig

CPU = torch.device("cpu")
RATE = 0.15
TINY = model_size("tiny", vocab_size=300, hidden_size=32, num_heads=2, ffn_size=64, max_positions=64)


def batch(seed: int, padded_row: int | None = 2, crop_fraction: float = 0.9) -> dict[str, torch.Tensor]:
    """Packed blocks, one row cut short (the stream's last block of a shard) unless `padded_row` is None."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(SpecialTokens.mask + 1, TINY.vocab_size, (4, 40), generator=g)
    ids[:, 0] = SpecialTokens.cls
    if padded_row is not None:
        ids[padded_row, 23:] = SpecialTokens.pad
    return make_pretraining_batch(ids, RATE, crop_fraction, generator=g)


def build(variant: str = "cocolm", dropout: float = 0.1):
    torch.manual_seed(0)
    model_cfg, objective_cfg = VARIANTS[variant].apply(TINY, ObjectiveConfig())
    model_cfg = replace(model_cfg, dropout=dropout, attention_dropout=dropout)
    return build_pretraining_model(model_cfg, objective_cfg).train()


def values_and_grads(model, prepared: dict, seed: int = 0, generator: bool = True):
    """One forward and backward; dropout from torch's generator at `seed`, the replacement draws from a
    generator of their own (or from torch's, as a compiled step draws them)."""
    torch.manual_seed(seed)
    out = model(prepared, generator=torch.Generator().manual_seed(1) if generator else None)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.loss, params, allow_unused=True)
    return out.values(), [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]


def assert_same(a, b, atol=1e-6, rtol=1e-5):
    (values_a, grads_a), (values_b, grads_b) = a, b
    assert values_a.keys() == values_b.keys()
    for key in values_a:
        torch.testing.assert_close(values_b[key], values_a[key], atol=atol, rtol=rtol, equal_nan=True,
                                   msg=lambda m, key=key: f"{key}: {m}")
    for i, (x, y) in enumerate(zip(grads_a, grads_b)):
        torch.testing.assert_close(y, x, atol=atol, rtol=rtol, msg=lambda m, i=i: f"parameter {i}: {m}")


# ----------------------------------------------------------------------------- the cap


def test_the_cap_is_the_count_rule_at_its_largest_draw():
    assert max_mask_count(0.15, 512) == 77  # 76.8 expected: under one padded slot per row
    assert max_mask_count(0.15, 128) == 20
    assert max_mask_count(0.25, 128) == 33  # 32 + u rounds to 33 at the largest u in float64
    assert int(mask_count(torch.tensor(128), 0.25, torch.tensor(LARGEST_UNIFORM))) == 33
    assert prediction_slots(0.15, 32, 512) == 32 * 77


@pytest.mark.parametrize("rate,width", [(0.15, 40), (0.25, 32), (0.4, 17)])
def test_no_masked_position_is_ever_dropped(rate, width):
    """Over many batches with rows of every length, the count per row stays within the cap, and the
    padded index holds every masked position, in order, then only padding at an unmasked position."""
    g = torch.Generator().manual_seed(0)
    cap = max_mask_count(rate, width)
    for _ in range(300):
        ids = torch.randint(SpecialTokens.mask + 1, 300, (8, width), generator=g)
        ids[:, 0] = SpecialTokens.cls
        lengths = torch.randint(1, width + 1, (8,), generator=g)
        ids[torch.arange(width)[None, :] >= lengths[:, None]] = SpecialTokens.pad
        mask = choose_mask_positions(ids, ids != SpecialTokens.pad, rate, g)
        assert int(mask.sum(1).max()) <= cap
        index = masked_index(mask)
        padded = pad_masked_index(index, mask, rate)
        count = index.numel()
        assert padded["masked_index"].shape == (8 * cap,)
        assert torch.equal(padded["masked_index"][:count], index)
        assert int(padded["masked_valid"].sum()) == count and bool(padded["masked_valid"][:count].all())
        assert not mask.flatten()[padded["masked_index"][count:]].any()


def test_a_batch_beyond_the_cap_is_an_error_never_truncated():
    mask = torch.zeros(2, 20, dtype=torch.bool)
    mask[:, 1:6] = True  # 5 per row; the cap at rate 0.15 is 4 (3.0 + u rounds to 4 at the largest u)
    with pytest.raises(ValueError, match="10 masked positions exceed the fixed 8 slots"):
        pad_masked_index(masked_index(mask), mask, 0.15)


# ----------------------------------------------------------------------------- the losses


def test_padded_slots_add_nothing_and_get_no_gradient():
    torch.manual_seed(0)
    logits = torch.randn(7, 11, requires_grad=True)
    copy_logits, corrupted, targets = torch.randn(7), torch.randint(11, (7,)), torch.randint(11, (7,))
    valid = torch.arange(7) < 4
    for loss_fn in (lambda l, t: mlm_loss(l, t, valid), lambda l, t: lm_loss(l, copy_logits, corrupted, t, valid=valid)):
        loss = loss_fn(logits, targets)
        (grad,) = torch.autograd.grad(loss, logits)
        assert torch.count_nonzero(grad[4:]) == 0 and torch.count_nonzero(grad[:4]) > 0
        garbage_logits = torch.cat([logits[:4], 1e4 * torch.randn(3, 11)])
        torch.testing.assert_close(loss_fn(garbage_logits, torch.cat([targets[:4], targets[:3]])), loss)
    torch.testing.assert_close(mlm_loss(logits, targets, valid), mlm_loss(logits[:4], targets[:4]))
    values = torch.tensor([1.0, 2.0, float("inf")], requires_grad=True)
    mean = valid_mean(values, torch.tensor([True, True, False]))
    (grad,) = torch.autograd.grad(mean, values)
    assert mean.item() == 1.5 and grad.tolist() == [0.5, 0.5, 0.0]


# ----------------------------------------------------------------------------- the step


def bert_mask_by_token(targets, vocab_size, generator=None, special=SpecialTokens()):
    """roberta_mlm's 80/10/10 inputs as a rule of the token, not a draw: the two steps make different
    numbers of draws (one per slot), so only the first draw of a generator gives both the same values."""
    keep = torch.where(targets % 10 == 0, targets, (targets * 7) % (vocab_size - 5) + 5)
    return torch.where(targets % 10 < 8, torch.full_like(targets, special.mask), keep)


def electra_inputs_by_token(targets, unchanged_fraction, generator=None, mask_id=SpecialTokens.mask):
    return torch.where(targets % 7 == 0, targets, torch.full_like(targets, mask_id))


@pytest.mark.parametrize("variant", ["cocolm", "all_token_lm", "random_replace", "electra", "roberta_mlm"])
def test_the_fixed_shape_step_gives_todays_values_and_gradients(variant, monkeypatch):
    """With dropout on (torch's generator, the same masks for both) and the replacements drawn from one
    generator (the real slots come first: the same tokens). Every value, accuracies included, and every
    gradient, on a batch with a padded row."""
    monkeypatch.setattr(objective_module, "bert_mask_inputs", bert_mask_by_token)
    monkeypatch.setattr(objective_module, "electra_generator_inputs", electra_inputs_by_token)
    model, raw = build(variant), batch(0)
    fixed = to_device(raw, CPU, RATE)
    assert fixed["masked_index"].numel() > to_device(raw, CPU)["masked_index"].numel()  # some slots are padding
    assert_same(values_and_grads(model, to_device(raw, CPU)), values_and_grads(model, fixed))


def test_every_batch_gives_the_step_the_same_shapes():
    model = build()
    shapes = []
    model.clm_head.register_forward_hook(lambda m, args, out: shapes.append(("clm", tuple(out.shape))))
    model.aux.mlm_head.register_forward_hook(lambda m, args, out: shapes.append(("aux", tuple(out.shape))))
    counts = set()
    for seed in range(6):
        raw = batch(seed, padded_row=seed % 4 if seed % 2 else None)
        counts.add(int(raw["mask_positions"].sum()))
        prepared = to_device(raw, CPU, RATE)
        assert prepared["masked_index"].shape == prepared["masked_valid"].shape == (prediction_slots(RATE, 4, 40),)
        with torch.no_grad():
            model(prepared)
    assert len(counts) > 1  # the batches mask different numbers of positions
    slots = prediction_slots(RATE, 4, 40)
    assert set(shapes) == {("clm", (slots, TINY.vocab_size)), ("aux", (slots, TINY.vocab_size))}


def test_the_whole_step_compiles_as_one_graph_equals_eager_and_draws_anew_each_call():
    """aot_eager traces what inductor would be handed (no C++ toolchain). fullgraph=True: a graph break
    is an error. Dropout and the replacement draws come from torch's generator on every call: a second
    call draws other masks, re-seeding repeats them, exactly as the eager step does. A batch with other
    mask counts reuses the graph; one with padding adds one graph (`all_real`), then reuses it."""
    torch.compiler.reset()
    counters.clear()
    eager, compiled = build(), build()
    compile_step(compiled, "default", backend="aot_eager")
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints keep their keys
    packed = to_device(batch(0, padded_row=None), CPU, RATE)
    first = values_and_grads(compiled, packed, seed=0, generator=False)
    assert counters["stats"]["unique_graphs"] == 1
    assert_same(values_and_grads(eager, packed, seed=0, generator=False), first, atol=1e-5, rtol=1e-4)
    assert_same(first, values_and_grads(compiled, packed, seed=0, generator=False), atol=0, rtol=0)
    other_draws = values_and_grads(compiled, packed, seed=1, generator=False)[0]
    assert other_draws["loss"] != first[0]["loss"]
    assert counters["stats"]["unique_graphs"] == 1  # the same graph for every packed batch and draw
    values_and_grads(compiled, to_device(batch(1), CPU, RATE), generator=False)  # padding: its own graph
    with torch._dynamo.config.patch(error_on_recompile=True):
        values_and_grads(compiled, to_device(batch(2, padded_row=None), CPU, RATE), generator=False)
        values_and_grads(compiled, to_device(batch(3, padded_row=1), CPU, RATE), generator=False)


# ----------------------------------------------------------------------------- the options


def test_the_options_are_train_keys_recorded_as_params_and_checked():
    cfg = resolve("tiny", "cocolm", ["train.fixed_shapes=true", "train.compile_step=reduce-overhead"])
    assert cfg.flat()["train.fixed_shapes"] is True and cfg.flat()["train.compile_step"] == "reduce-overhead"
    check_step_options(cfg)
    assert resolve("tiny", "cocolm").flat()["train.compile_step"] == "off"
    with pytest.raises(UserError, match="needs train.fixed_shapes"):
        check_step_options(resolve("tiny", "cocolm", ["train.compile_step=default"]))
    with pytest.raises(UserError, match="must be one of"):
        check_step_options(resolve("tiny", "cocolm", ["train.fixed_shapes=true", "train.compile_step=fast"]))


def test_a_step_replayed_as_cuda_graphs_keeps_its_values_and_takes_one_micro_batch():
    model = build(dropout=0.0)
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(), CPU)
    with pytest.raises(ValueError, match="one micro-batch"):
        TrainingStep(model, model.parameters(), optimizer, scheduler, CPU, clip_norm=1.0, accumulation=2,
                     cuda_graphs=True)
    step = TrainingStep(model, model.parameters(), optimizer, scheduler, CPU, clip_norm=1.0, cuda_graphs=True)
    values = step([to_device(batch(0), CPU, RATE)]).values[0]
    assert torch.isfinite(values["loss"]) and values["loss"]._base is None  # a copy, not the graph's output
