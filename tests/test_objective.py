"""The pretraining objective as a whole: gradient facts, counting rules, and every variant learning."""

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model import VARIANTS, ObjectiveConfig, build_pretraining_model, make_pretraining_batch, model_size
from model.corruption import SpecialTokens, random_replacements
from model import objective as objective_module
from model.objective import masked_index, step_inputs, take, to_device, unpadded
from model.step import OptimizerConfig, TrainingStep, build_optimizer

TINY = model_size("tiny", vocab_size=64, hidden_size=32, num_heads=2, ffn_size=64, max_positions=64)


def fixed_batch(seed: int = 0, crop_fraction: float = 0.9) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(SpecialTokens.mask + 1, TINY.vocab_size, (6, 24), generator=g)
    ids[:, 0] = SpecialTokens.cls
    ids[4, 18:] = SpecialTokens.pad
    return make_pretraining_batch(ids, crop_fraction=crop_fraction, generator=g)


def build(variant_name: str = "cocolm", seed: int = 0):
    torch.manual_seed(seed)
    model_cfg, objective_cfg = VARIANTS[variant_name].apply(TINY, ObjectiveConfig())
    return build_pretraining_model(model_cfg, objective_cfg)


def grads(loss: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    out = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(out, params)]


def test_lm_loss_gives_the_copy_head_zero_gradient_and_copy_loss_does_not():
    model = build()
    out = model(fixed_batch(), torch.Generator().manual_seed(0))
    copy_params = list(model.copy_head.parameters())
    assert all(torch.count_nonzero(g) == 0 for g in grads(out.lm_loss, copy_params))
    assert any(torch.count_nonzero(g) > 0 for g in grads(out.copy_loss, copy_params))


def test_without_stop_gradient_the_lm_loss_moves_the_copy_head():
    model = build("clm_no_stopgrad")
    out = model(fixed_batch(), torch.Generator().manual_seed(0))
    assert any(torch.count_nonzero(g) > 0 for g in grads(out.lm_loss, list(model.copy_head.parameters())))


def test_main_losses_do_not_reach_the_auxiliary():
    """Sampling is discrete: only L_aux_MLM trains the auxiliary's own layers and head."""
    model = build()
    out = model(fixed_batch(), torch.Generator().manual_seed(0))
    shared = {id(p) for p in model.main.embeddings.parameters()}
    aux_only = [p for p in model.aux.parameters() if id(p) not in shared]
    main_losses = out.clm_loss + out.scl_loss
    assert all(torch.count_nonzero(g) == 0 for g in grads(main_losses, aux_only))
    assert any(torch.count_nonzero(g) > 0 for g in grads(out.aux_mlm_loss, aux_only))
    # The whole embedding block is shared (token and absolute position embeddings and the embedding
    # LayerNorm, as in the authors' code), one set of parameters, learning from both models.
    embeddings = model.main.embeddings
    assert model.aux.encoder.embeddings is embeddings
    shared_params = [embeddings.tokens.weight, embeddings.positions.weight, embeddings.norm.weight, embeddings.norm.bias]
    aux_params = {id(p) for p in model.aux.parameters()}
    assert all(id(p) in aux_params for p in shared_params)
    for name, main_grad, aux_grad in zip(["tokens", "positions", "norm.weight", "norm.bias"],
                                         grads(main_losses, shared_params), grads(out.aux_mlm_loss, shared_params)):
        assert torch.count_nonzero(main_grad) > 0 and torch.count_nonzero(aux_grad) > 0, name


def test_scl_gradient_flows_through_both_views():
    model = build()
    batch = fixed_batch()
    h = model.main(batch["input_ids"], batch["attention_mask"])
    h_crop = model.main(batch["crop_ids"], batch["crop_attention_mask"])
    from model.losses import scl_loss

    h.retain_grad()
    h_crop.retain_grad()
    scl_loss(model.scl_head(h[:, 0]), model.scl_head(h_crop[:, 0])).backward()
    assert torch.count_nonzero(h.grad[:, 0]) > 0 and torch.count_nonzero(h_crop.grad[:, 0]) > 0


def test_a_drawn_token_equal_to_the_original_counts_as_original():
    model = build()
    batch = fixed_batch()
    same = torch.full_like(batch["input_ids"], 7)
    same[:, 0] = SpecialTokens.cls
    same[~batch["attention_mask"]] = SpecialTokens.pad
    batch["input_ids"] = same
    batch["masked_ids"] = torch.where(batch["mask_positions"], SpecialTokens.mask, same)
    with torch.no_grad():
        model.aux.mlm_head.bias[7] = 1e4  # the auxiliary now always draws the original token
    out = model(batch, torch.Generator().manual_seed(0))
    assert out.replaced_fraction.item() == 0.0
    assert torch.isnan(out.copy_accuracy_replaced)  # no replaced token at all
    model.eval()  # compare without dropout noise
    out_eval = model(batch, torch.Generator().manual_seed(0))
    real = batch["attention_mask"]
    h = model.main(same, real)  # x_mlm == x_orig everywhere: every copy target is 1
    target_all_original = torch.nn.functional.binary_cross_entropy_with_logits(model.copy_head(h)[real], torch.ones(int(real.sum())))
    torch.testing.assert_close(out_eval.copy_loss, target_all_original)


def test_sampling_pass_restores_train_mode_and_reports_every_signal():
    model = build().train()
    out = model(fixed_batch(), torch.Generator().manual_seed(0))
    assert model.aux.training and model.main.training
    for name in ["loss", "aux_mlm_loss", "copy_loss", "lm_loss", "clm_loss", "scl_loss", "aux_mlm_accuracy",
                 "copy_accuracy_replaced", "copy_accuracy_original", "lm_accuracy_replaced",
                 "lm_accuracy_original", "scl_positive_cosine", "scl_negative_cosine"]:
        assert getattr(out, name) is not None, name  # NaN allowed: an empty set, e.g. no original at M
    total = out.aux_mlm_loss + 50 * out.copy_loss + out.lm_loss + out.scl_loss
    torch.testing.assert_close(out.loss, total)


def test_the_same_generator_draws_the_same_replacements():
    model = build().eval()
    a = model(fixed_batch(), torch.Generator().manual_seed(3)).metrics()
    b = model(fixed_batch(), torch.Generator().manual_seed(3)).metrics()
    assert a == b


def test_frozen_auxiliary_is_not_trained_and_does_not_freeze_the_main_embeddings():
    model = build("converged_aux")
    assert not any(p.requires_grad for p in model.aux.parameters())
    assert all(p.requires_grad for p in model.main.parameters())
    assert model.aux.encoder.embeddings is not model.main.embeddings
    out = model(fixed_batch(), torch.Generator().manual_seed(0))
    assert out.aux_mlm_loss is None and out.aux_mlm_accuracy is not None


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_overfits_a_fixed_batch(name):
    model = build(name)
    batch = fixed_batch(crop_fraction=VARIANTS[name].data.get("crop_fraction", 0.9))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-6)
    history = []
    for step in range(50):
        out = model(batch, torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        history.append(out.loss.item())
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    assert all(torch.isfinite(torch.tensor(history)))
    assert last < 0.8 * first, f"{name}: {first:.3f} -> {last:.3f}"


def test_take_at_the_masked_index_equals_boolean_selection():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(4, 7, generator=g) < 0.4
    for x in (torch.randn(4, 7, generator=g), torch.randn(4, 7, 3, generator=g)):
        assert torch.equal(take(x, masked_index(mask)), x[mask])
    empty = masked_index(torch.zeros(4, 7, dtype=torch.bool))
    assert take(torch.randn(4, 7, 3), empty).shape == (0, 3)


class HostWaits(TorchDispatchMode):
    """Records the operators that make the host wait for the device on a GPU: those whose result size
    or value the host must read (nonzero, boolean selection, masked scatter, .item())."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        indices = args[1] if func in (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                                      torch.ops.aten.index_put_.default) else []
        boolean_index = any(i is not None and i.dtype == torch.bool for i in indices)
        if boolean_index or func in (torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default,
                                     torch.ops.aten.masked_scatter.default, torch.ops.aten._local_scalar_dense.default):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_a_training_step_on_a_batch_from_to_device_never_makes_the_host_wait(name, packed):
    """The whole step (forward, backward, clipping, the fused update that skips a non-finite norm on
    the device) reads nothing back from the device, so on a GPU the host queues the next step while
    this one runs. Only all_token_lm on a padded batch (the last block of a shard) must select its
    real positions. Without `to_device` the step works out the index itself: the old two waits."""
    model = build(name)
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(), torch.device("cpu"))
    step = TrainingStep(model, model.parameters(), optimizer, scheduler, torch.device("cpu"), clip_norm=1.0)
    crop_fraction = VARIANTS[name].data.get("crop_fraction", 0.9)
    batch = packed_batch() if packed else fixed_batch(crop_fraction=crop_fraction)
    prepared = to_device(batch, torch.device("cpu"))
    with HostWaits() as waits:
        step([prepared])
    assert waits.seen == ["aten.nonzero.default"] * (name == "all_token_lm" and not packed)
    with HostWaits() as waits:
        model(batch)
    assert waits.seen[:2] == ["aten.nonzero.default", "aten._local_scalar_dense.default"]


def test_to_device_computes_the_steps_host_inputs_on_the_host_and_changes_no_loss():
    for batch in (packed_batch(), fixed_batch()):
        prepared = to_device(batch, torch.device("cpu"))
        assert torch.equal(prepared["masked_index"], masked_index(batch["mask_positions"]))
        assert prepared["all_real"] is unpadded(batch)
        assert step_inputs(prepared) == (prepared["masked_index"], prepared["all_real"])
        assert all(torch.equal(prepared[k], batch[k]) for k in batch)
        model = build().eval()
        direct = model(batch, torch.Generator().manual_seed(3)).values()
        moved = model(prepared, torch.Generator().manual_seed(3)).values()
        assert direct.keys() == moved.keys()
        assert all(torch.equal(direct[k], moved[k]) or direct[k].isnan() and moved[k].isnan() for k in direct)


def packed_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Full blocks, as the stream packs them: no padding in either view."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(SpecialTokens.mask + 1, TINY.vocab_size, (6, 24), generator=g)
    ids[:, 0] = SpecialTokens.cls
    return make_pretraining_batch(ids, generator=g)


def test_unpadded_is_true_only_when_no_row_of_either_view_has_padding():
    assert unpadded(packed_batch()) is True
    assert unpadded(fixed_batch()) is False  # one row padded
    batch = packed_batch()
    batch["crop_attention_mask"][2, -1] = False
    assert unpadded(batch) is False


@pytest.mark.parametrize("name", ["cocolm", "roberta_mlm", "electra", "all_token_lm"])
def test_the_padding_free_path_gives_the_same_losses_and_gradients(name, monkeypatch):
    """On packed blocks the encoders attend with the relative bias alone (`unpadded`); forcing the
    general path (the per-row padding mask, all real here) must give the same losses and gradients."""
    model = build(name).eval()  # no dropout: both runs draw the same replacements from the same generator
    calls = []

    def record(module, args, kwargs):
        calls.append(args[2] if len(args) > 2 else kwargs.get("all_real", False))

    for encoder in (model.main, model.aux.encoder if model.aux is not None else None):
        if encoder is not None:
            encoder.register_forward_pre_hook(record, with_kwargs=True)
    batch = packed_batch()
    fast = model(batch, generator=torch.Generator().manual_seed(5))
    assert calls and all(calls)  # every encoder pass took the padding-free path
    fast_grads = grads(fast.loss, list(model.parameters()))
    monkeypatch.setattr(objective_module, "unpadded", lambda batch: False)
    calls.clear()
    general = model(batch, generator=torch.Generator().manual_seed(5))
    assert calls and not any(calls)
    losses = [key for key in general.values() if key == "loss" or key.endswith("_loss")]
    assert len(losses) >= 2  # the total and at least one term (accuracies are argmaxes: near ties may flip)
    for key in losses:
        torch.testing.assert_close(fast.values()[key], general.values()[key], atol=1e-5, rtol=1e-5, msg=key)
    for a, b in zip(fast_grads, grads(general.loss, list(model.parameters()))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_roberta_mlm_reads_80_10_10_inputs_and_is_trained_at_every_chosen_position():
    """RoBERTa's baseline as RoBERTa defines it: the chosen 15% are [MASK] 80%, a random token 10%,
    unchanged 10% in the encoder's input, and the MLM loss covers all of them; its accuracy is read
    at the [MASK] inputs."""
    from model import ObjectiveConfig, build_pretraining_model, make_pretraining_batch, model_size, variant
    from model.corruption import SpecialTokens

    model_cfg, objective_cfg = variant("roberta_mlm").apply(model_size("tiny", vocab_size=300), ObjectiveConfig())
    torch.manual_seed(0)
    model = build_pretraining_model(model_cfg, objective_cfg).eval()  # no dropout: the loss can be recomputed
    ids = torch.randint(5, 300, (16, 128), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = SpecialTokens.cls
    batch = make_pretraining_batch(ids, generator=torch.Generator().manual_seed(2))
    seen = {}
    model.main.register_forward_pre_hook(lambda module, args: seen.setdefault("input", args[0]))
    out = model(batch, generator=torch.Generator().manual_seed(3))
    chosen = batch["mask_positions"]
    read = seen["input"][chosen]
    original = batch["input_ids"][chosen]
    assert torch.equal(seen["input"][~chosen], batch["input_ids"][~chosen])  # only the chosen positions change
    masked, kept = (read == SpecialTokens.mask).float().mean(), (read == original).float().mean()
    assert 0.7 < masked < 0.9 and 0.04 < kept < 0.17 and (read[(read != original) & (read != SpecialTokens.mask)] > 4).all()
    logits = model.mlm_head(model.main(seen["input"], batch["attention_mask"])[chosen])
    torch.testing.assert_close(out.mlm_loss, torch.nn.functional.cross_entropy(logits, original))
    # Accuracy at the [MASK] inputs only: the unchanged tenth shows the answer in the input.
    at_mask = read == SpecialTokens.mask
    expected = (logits.argmax(-1) == original)[at_mask].float().mean()
    torch.testing.assert_close(out.mlm_accuracy, expected)


# What each variant means, written out from the paper (Table 3 rows, Table 1 baselines) rather than
# read back from model/variants.py: which losses exist, whether SCL runs, where the LM loss is taken,
# where replacements come from and which pass the sampling reads.
MEANING = {  # variant: (losses present, SCL runs, LM on every token, replacements, sampling logits)
    "cocolm": ({"aux_mlm", "copy", "lm", "scl"}, True, False, "auxiliary", "eval"),
    "rtd_only": ({"aux_mlm", "copy"}, False, False, "auxiliary", "eval"),
    "clm_only": ({"aux_mlm", "copy", "lm"}, False, False, "auxiliary", "eval"),
    "scl_rtd": ({"aux_mlm", "copy", "scl"}, True, False, "auxiliary", "eval"),
    "no_rel_pos": ({"aux_mlm", "copy", "lm", "scl"}, True, False, "auxiliary", "eval"),
    "electra_aux": ({"aux_mlm", "copy", "lm", "scl"}, True, False, "auxiliary", "eval"),
    "random_replace": ({"copy", "lm", "scl"}, True, False, "random", None),
    "all_token_lm": ({"aux_mlm", "lm"}, False, True, "auxiliary", "eval"),
    "clm_no_copy": ({"aux_mlm", "copy", "lm"}, False, False, "auxiliary", "eval"),
    "clm_no_stopgrad": ({"aux_mlm", "copy", "lm"}, False, False, "auxiliary", "eval"),
    "cocolm_no_copy": ({"aux_mlm", "copy", "lm", "scl"}, True, False, "auxiliary", "eval"),
    "cocolm_no_stopgrad": ({"aux_mlm", "copy", "lm", "scl"}, True, False, "auxiliary", "eval"),
    "roberta_mlm": ({"mlm"}, False, False, "none", None),
    "electra": ({"aux_mlm", "copy"}, False, False, "auxiliary", "train"),
}


@pytest.mark.parametrize("name", sorted(MEANING))
def test_each_variant_computes_what_the_paper_defines(name, monkeypatch):
    import model.objective as objective_module

    losses_present, scl_runs, lm_everywhere, replacement, sampling = MEANING[name]
    model = build(name).train()  # dropout on: train-mode and eval-mode logits differ
    batch = fixed_batch()
    sampled_from, draws, aux_outputs, main_inputs = [], [], [], []
    original_sample = objective_module.sample_replacements

    def recording_sample(logits, generator=None):
        sampled_from.append(logits)
        draws.append(original_sample(logits, generator))
        return draws[-1]

    monkeypatch.setattr(objective_module, "sample_replacements", recording_sample)
    if model.aux is not None:
        model.aux.register_forward_hook(lambda module, args, out: aux_outputs.append((module.training, out)))
    model.main.register_forward_pre_hook(lambda module, args: main_inputs.append(args[0]))
    lm_rows = []
    if getattr(model, "clm_head", None) is not None:
        model.clm_head.register_forward_hook(lambda module, args, out: lm_rows.append(out.shape[0]) and None)
    torch.manual_seed(5)
    out = model(batch, torch.Generator().manual_seed(1))

    parts = {"aux_mlm": out.aux_mlm_loss, "copy": out.copy_loss, "lm": out.lm_loss, "scl": out.scl_loss,
             "mlm": out.mlm_loss}
    assert {k for k, v in parts.items() if v is not None} == losses_present
    assert len(main_inputs) == (2 if scl_runs else 1)  # SCL encodes the crop view in a second pass
    if scl_runs:
        assert torch.equal(main_inputs[1], batch["crop_ids"])  # the clean crop, not a corrupted one
    if "lm" in losses_present:
        expected = batch["attention_mask"].sum() if lm_everywhere else batch["mask_positions"].sum()
        assert lm_rows == [expected]  # the vocabulary projection runs exactly where the LM loss is taken
    if replacement == "none":
        assert sampled_from == [] and model.aux is None
        return
    x_mlm = main_inputs[0]
    chosen = batch["mask_positions"]
    assert torch.equal(x_mlm[~chosen], batch["input_ids"][~chosen])  # only M is replaced
    if replacement == "random":
        assert sampled_from == [] and model.aux is None
        assert (x_mlm[chosen] > SpecialTokens.mask).all()  # uniform over regular tokens only
        return
    (logits,) = sampled_from
    assert torch.equal(x_mlm[chosen], draws[0])  # M holds the auxiliary's samples
    if sampling == "eval":  # the paper's dropout-free sampling pass (section 3.3): a separate eval-mode pass
        assert [training for training, _ in aux_outputs] == [True, False]
        torch.testing.assert_close(logits, aux_outputs[1][1])
        with torch.no_grad():
            model.aux.eval()
            reference = model.aux(batch["masked_ids"], batch["attention_mask"], masked_index(chosen))
        torch.testing.assert_close(logits, reference)  # exactly the dropout-free logits
        assert not torch.allclose(logits, aux_outputs[0][1])  # not the train-mode ones
    else:  # ELECTRA samples from the generator's train-mode logits: no second pass
        assert [training for training, _ in aux_outputs] == [True]
        torch.testing.assert_close(logits, aux_outputs[0][1].detach())


def test_every_variant_has_a_written_out_meaning():
    assert set(MEANING) | {f"crop_{f}" for f in ("0.7", "0.8", "0.9", "1.0")} | {"converged_aux"} == set(VARIANTS)


def build_with(variant_name: str, model_overrides: dict, **objective_overrides):
    torch.manual_seed(0)
    model_cfg, objective_cfg = VARIANTS[variant_name].apply(TINY, ObjectiveConfig())
    model_cfg = model_cfg.__class__(**{**model_cfg.__dict__, **model_overrides})
    objective_cfg = objective_cfg.__class__(**{**objective_cfg.__dict__, **objective_overrides})
    return build_pretraining_model(model_cfg, objective_cfg)


def test_without_dropout_the_train_pass_is_the_sampling_pass(monkeypatch):
    """With no dropout, train-mode and eval-mode auxiliary logits are equal, so COCO-LM samples from the
    train pass (one auxiliary pass, not two); with dropout it still runs the separate eval pass."""
    original, sampled_from = objective_module.sample_replacements, []
    monkeypatch.setattr(objective_module, "sample_replacements",
                        lambda logits, generator=None: sampled_from.append(logits) or original(logits, generator))
    for dropout, passes in ((0.0, 1), (0.1, 2)):
        model = build_with("cocolm", {"dropout": dropout, "attention_dropout": dropout}).train()
        calls = []
        sampled_from.clear()
        model.aux.register_forward_hook(lambda module, args, out: calls.append((module.training, out.detach())))
        model(fixed_batch(), torch.Generator().manual_seed(1))
        assert len(calls) == passes
        if passes == 1:
            model.aux.eval()
            with torch.no_grad():
                batch = fixed_batch()
                eval_logits = model.aux(batch["masked_ids"], batch["attention_mask"], masked_index(batch["mask_positions"]))
            assert torch.allclose(sampled_from[0], eval_logits, atol=1e-6)  # what the eval pass would have given
        else:
            assert calls[1][0] is False and torch.equal(sampled_from[0], calls[1][1])


def test_cls_cosines_every_k_training_passes_and_on_every_held_out_pass():
    model = build_with("electra", {}, cls_cosines=True, cls_cosines_every=3).train()
    seen = [model(fixed_batch(seed), torch.Generator().manual_seed(seed)).cls_positive_cosine is not None
            for seed in range(7)]
    assert seen == [True, False, False, True, False, False, True]
    model.eval()
    with torch.no_grad():
        assert all(model(fixed_batch(s), torch.Generator().manual_seed(s)).cls_positive_cosine is not None
                   for s in range(3))
    every = build_with("electra", {}, cls_cosines=True).train()
    assert all(every(fixed_batch(s), torch.Generator().manual_seed(s)).cls_positive_cosine is not None for s in range(3))
    with pytest.raises(ValueError, match="cls_cosines_every"):
        ObjectiveConfig(cls_cosines_every=0)


# ----------------------------------------------------------------------------- the authors' ids

def authors_ids() -> SpecialTokens:
    """Their ids, from the authors' dictionary in tests/fixtures/official-cocolm ([MASK] = 416, fillers 412-415)."""
    from pathlib import Path

    from jobs.data.schemes import load_scheme

    return load_scheme(Path(__file__).parent / "fixtures" / "official-cocolm").special_tokens


def authors_batch(special, seed: int = 0) -> dict:
    """Blocks of the authors' regular ids (4..411), their [CLS] first, one row padded with their [PAD]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 412, (16, 64), generator=g)
    ids[:, 0], ids[3, 40:] = special.cls, special.pad
    return make_pretraining_batch(ids, generator=g, special=special)


def authors_model(name: str, special):
    model_cfg, objective_cfg = VARIANTS[name].apply(model_size("tiny", vocab_size=417), ObjectiveConfig())
    torch.manual_seed(0)
    return build_pretraining_model(dataclasses.replace(model_cfg, dropout=0.0, attention_dropout=0.0), objective_cfg,
                                   special)


def test_roberta_mlms_accuracy_is_read_at_the_authors_mask():
    theirs = authors_ids()
    model, batch = authors_model("roberta_mlm", theirs).eval(), authors_batch(theirs)
    seen = {}
    model.main.register_forward_pre_hook(lambda module, args: seen.setdefault("input", args[0]))
    out = model(batch, generator=torch.Generator().manual_seed(3))
    chosen = batch["mask_positions"]
    read, original = seen["input"][chosen], batch["input_ids"][chosen]
    at_mask = read == theirs.mask
    assert 0.7 < at_mask.float().mean() < 0.9  # their [MASK] is what the chosen positions read
    assert not torch.isin(read[~at_mask & (read != original)], torch.tensor(theirs.never_drawn)).any()
    logits = model.mlm_head(model.main(seen["input"], batch["attention_mask"])[chosen])
    torch.testing.assert_close(out.mlm_accuracy, (logits.argmax(-1) == original)[at_mask].float().mean())


def test_electras_auxiliary_accuracy_is_read_at_the_authors_mask():
    theirs = authors_ids()
    model, batch = authors_model("electra", theirs), authors_batch(theirs, seed=1)
    seen = []
    model.aux.register_forward_hook(lambda module, args, out: seen.append((args[0], out)))
    out = model(batch, torch.Generator().manual_seed(2))
    masked_ids, logits = seen[-1]
    chosen = batch["mask_positions"]
    shown, original = masked_ids[chosen], batch["input_ids"][chosen]
    read = shown == theirs.mask
    assert ((shown == theirs.mask) | (shown == original)).all() and 0.75 < read.float().mean() < 0.95
    torch.testing.assert_close(out.aux_mlm_accuracy, (logits.argmax(-1) == original)[read].float().mean())


def test_random_replace_draws_only_the_authors_regular_ids():
    theirs = authors_ids()
    model, batch = authors_model("random_replace", theirs), authors_batch(theirs, seed=2)
    seen = {}
    model.main.register_forward_pre_hook(lambda module, args: seen.setdefault("input", args[0]))
    model(batch, torch.Generator().manual_seed(4))
    drawn = seen["input"][batch["mask_positions"]]
    assert drawn.numel() > 100 and not torch.isin(drawn, torch.tensor(theirs.never_drawn)).any()
    # the step's first draw from its generator: uniform over their regular ids, in the masked positions' order
    expected = random_replacements(drawn.numel(), 417, torch.device("cpu"), torch.Generator().manual_seed(4), theirs)
    assert torch.equal(drawn, expected)
