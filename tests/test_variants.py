"""Each variant that differs from its neighbour in one detail is tested on that detail, so that a variant
made equal to its neighbour (or given another head, generator or bias) fails here. The losses are
recomputed independently from the captured hidden states, as docs/method.md section 4 writes them."""

import math

import pytest
import torch
import torch.nn.functional as F

from jobs.pretraining import checkpoint
from jobs.pretraining.config import resolve, to_yaml, with_vocab_size
from jobs.pretraining.loop import build_training
from jobs.pretraining.checkpoint import TrainState
from model import VARIANTS, ObjectiveConfig, build_pretraining_model, make_pretraining_batch, model_size
from model.corruption import SpecialTokens
from model.heads import CLMHead, CopyHead, ElectraDiscriminatorHead, MLMHead
from model.objective import masked_index, take

SMALL = model_size("tiny", vocab_size=64, hidden_size=48, num_heads=3, ffn_size=96, max_positions=64)


def batch(seed: int = 0, rows: int = 6, length: int = 24) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(SpecialTokens.mask + 1, SMALL.vocab_size, (rows, length), generator=g)
    ids[:, 0] = SpecialTokens.cls
    return make_pretraining_batch(ids, generator=g)


def build(name: str, seed: int = 0, size=SMALL):
    torch.manual_seed(seed)
    return build_pretraining_model(*VARIANTS[name].apply(size, ObjectiveConfig()))


def run_capturing(model, inputs: dict) -> tuple:
    """The objective's output and the main encoder's hidden states and input (x_mlm) of its first pass."""
    seen = []
    handle = model.main.register_forward_hook(lambda module, args, out: seen.append((args[0], out)))
    out = model(inputs, torch.Generator().manual_seed(1))
    handle.remove()
    x_mlm, h = seen[0]
    return out, x_mlm, h


@pytest.mark.parametrize("name", ["clm_only", "clm_no_copy"])
def test_clm_no_copy_trains_a_plain_softmax_lm_where_clm_only_trains_the_copy_mixture(name):
    """clm_only: -log( p_copy(x_mlm) [x = x_mlm] + (1 - p_copy(x_mlm)) softmax(LM)(x) ) at M, p_copy from the
    copy logit under stop-gradient; clm_no_copy: plain cross-entropy of the LM head at M."""
    model, inputs = build(name), batch()
    out, x_mlm, h = run_capturing(model, inputs)
    index = masked_index(inputs["mask_positions"])
    targets = take(inputs["input_ids"], index)
    with torch.no_grad():
        lm = model.clm_head(take(h, index)).float()
        if name == "clm_no_copy":
            expected = F.cross_entropy(lm, targets)
        else:
            p_copy = torch.sigmoid(model.copy_head(take(h, index)).float())
            copied = (take(x_mlm, index) == targets).float()
            p = p_copy * copied + (1 - p_copy) * lm.softmax(-1).gather(1, targets[:, None]).squeeze(1)
            expected = -p.log().mean()
    torch.testing.assert_close(out.lm_loss.detach(), expected, rtol=1e-5, atol=1e-6)
    assert out.copy_loss is not None and out.scl_loss is None  # both keep the copy loss, neither has SCL


def test_clm_no_copy_and_clm_only_give_different_lm_losses():
    """The same weights and batch: a mixture and a plain softmax cannot agree (a mutation making them one fails)."""
    inputs = batch()
    (plain, *_), (mixture, *_) = (run_capturing(build(n), inputs) for n in ("clm_no_copy", "clm_only"))
    assert not torch.allclose(plain.lm_loss, mixture.lm_loss)


@pytest.mark.parametrize("name,moves", [("clm_only", False), ("clm_no_stopgrad", True)])
def test_only_clm_no_stopgrad_lets_the_lm_loss_move_the_copy_head(name, moves):
    model = build(name)
    out, *_ = run_capturing(model, batch())
    params = list(model.copy_head.parameters())
    grads = torch.autograd.grad(out.lm_loss, params, allow_unused=True)
    norm = sum(0.0 if g is None else g.abs().sum().item() for g in grads)
    assert (norm > 0) is moves
    assert out.scl_loss is None  # clm_*: the CLM-only backbone


def test_electra_has_electras_discriminator_head_and_cocolm_the_linear_copy_head():
    electra, cocolm = build("electra"), build("cocolm")
    assert type(electra.copy_head) is ElectraDiscriminatorHead and type(cocolm.copy_head) is CopyHead
    head = electra.copy_head
    assert (head.dense.in_features, head.dense.out_features) == (SMALL.hidden_size, SMALL.hidden_size)
    assert (head.prediction.in_features, head.prediction.out_features) == (SMALL.hidden_size, 1)
    h = torch.randn(2, 5, SMALL.hidden_size)
    torch.testing.assert_close(head(h), head.prediction(F.gelu(head.dense(h))).squeeze(-1))  # dense, GELU, dense


def test_electras_generator_is_full_depth_at_a_third_of_the_width():
    """ELECTRA-Base's generator: 12 layers, 256 wide (4 heads of 64), FFN 1024, reading the 768-wide
    embeddings through a projection; COCO-LM's auxiliary: 4 layers at full width."""
    base = model_size("base")
    electra_model, _ = VARIANTS["electra"].apply(base, ObjectiveConfig())
    aux = electra_model.aux
    assert (aux.num_layers, aux.hidden_size, aux.num_heads, aux.ffn_size, aux.embedding_size) == (12, 256, 4, 1024, 768)
    cocolm_model, _ = VARIANTS["cocolm"].apply(base, ObjectiveConfig())
    assert (cocolm_model.aux.num_layers, cocolm_model.aux.hidden_size) == (4, 768)
    small = build("electra", size=model_size("tiny", vocab_size=64, hidden_size=96, num_heads=6, ffn_size=192))
    assert small.aux.encoder.embedding_projection is not None and small.main.embedding_projection is None
    assert small.aux.encoder.embeddings is small.main.embeddings  # shared, through the projection


@pytest.mark.parametrize("name,unchanged", [("cocolm", 0.0), ("electra", 0.15)])
def test_electras_generator_reads_85_percent_mask_and_15_percent_unchanged(name, unchanged):
    """ELECTRA's pretrain_helpers.mask: of the chosen positions 85% read [MASK], 15% their own token, and the
    generator's loss and samples cover all of them. COCO-LM's auxiliary reads [MASK] at every one."""
    model, inputs = build(name), batch(seed=3, rows=64, length=64)
    seen = []
    model.aux.register_forward_hook(lambda module, args, out: seen.append((args[0], args[2], out)))
    out = model(inputs, torch.Generator().manual_seed(2))
    masked_ids, index, logits = seen[-1]  # the logits replacements are drawn from (electra: its only pass)
    chosen = inputs["mask_positions"]
    shown = masked_ids[chosen]
    n = shown.numel()
    kept = (shown == inputs["input_ids"][chosen]).float().mean().item()
    assert ((shown == SpecialTokens.mask) | (shown == inputs["input_ids"][chosen])).all()
    assert abs(kept - unchanged) <= 4 * math.sqrt(max(unchanged * (1 - unchanged), 1e-12) / n) + 1e-9
    assert logits.shape[0] == n and torch.equal(index, masked_index(chosen))  # every chosen position is a target
    assert torch.equal(masked_ids[~chosen], inputs["input_ids"][~chosen])
    # its accuracy is read at the [MASK] inputs only: an unmasked input shows the answer
    read = shown == SpecialTokens.mask
    expected = (logits.argmax(-1) == inputs["input_ids"][chosen])[read].float().mean()
    torch.testing.assert_close(out.aux_mlm_accuracy, expected)


def test_no_rel_pos_has_no_relative_bias_in_either_encoder():
    with_bias, without = build("cocolm"), build("no_rel_pos")
    assert with_bias.main.relative_bias is not None and with_bias.aux.encoder.relative_bias is not None
    assert without.main.relative_bias is None and without.aux.encoder.relative_bias is None
    assert not [name for name, _ in without.named_parameters() if "relative" in name]


def test_converged_aux_loads_the_finished_runs_auxiliary_and_freezes_it(tmp_path):
    cfg = with_vocab_size(resolve("tiny", "cocolm", ["model.hidden_size=32", "model.ffn_size=64"]), 64)
    torch.manual_seed(7)
    finished = build_pretraining_model(cfg.model, cfg.objective)
    with torch.no_grad():
        for p in finished.aux.parameters():
            p.add_(torch.randn_like(p))  # weights no fresh model has
    optimizer, scheduler = build_training(cfg)[1:]
    checkpoint.save(tmp_path / "done", finished, optimizer, scheduler, TrainState(step=1), to_yaml(cfg), None)

    converged = with_vocab_size(resolve("tiny", "converged_aux", ["model.hidden_size=32", "model.ffn_size=64",
                                                                  f"train.aux_checkpoint={tmp_path / 'done'}"]), 64)
    torch.manual_seed(8)
    model = build_training(converged)[0]
    expected = finished.aux.state_dict()
    for key, value in model.aux.state_dict().items():
        torch.testing.assert_close(value, expected[key], msg=f"aux weight {key} not loaded")
    assert not any(p.requires_grad for p in model.aux.parameters())
    assert model.aux.encoder.embeddings is not model.main.embeddings  # its own embeddings, frozen with it


def test_only_the_variants_that_train_a_language_model_head_keep_one():
    """`lm_head` is what the pretraining job exports next to the encoder (encoder/lm_head.safetensors) for
    prompt-based fine-tuning: the main encoder's head that the variant's loss trains (cocolm's CLM head,
    roberta_mlm's MLM head), and None for a variant that trains none (rtd_only, electra): an export never
    carries an untrained head. tests/test_ablate.py checks cocolm's export through the job; the control's
    and an export without a head: tests/test_fewshot.py."""
    for name in VARIANTS:
        model = build(name)
        model(batch(), torch.Generator().manual_seed(1)).loss.backward()
        trained = [head for head in (getattr(model, "clm_head", None), getattr(model, "mlm_head", None))
                   if head is not None and head.bias.grad is not None and head.bias.grad.abs().sum() > 0]
        assert (model.lm_head is None) == (not trained), name
        assert model.lm_head is None or model.lm_head is trained[0], name
    assert build("rtd_only").lm_head is None and build("electra").lm_head is None
    assert type(build("cocolm").lm_head) is CLMHead and type(build("roberta_mlm").lm_head) is MLMHead
