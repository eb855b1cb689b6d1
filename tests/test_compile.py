"""`compile_encoders`, the compiled step of the bench and of the pretraining job (`train.compile`):
the same numbers as eager, unchanged checkpoint keys, and no recompilation once a run's shapes are
seen (past dynamo's recompile limit torch falls back to eager without an error: the speed cliff
these tests guard against). "aot_eager" traces exactly what inductor would be handed, and needs no
C++ toolchain; the 2-worker Ray test in test_pretrain.py runs inductor itself through the job.
"""

from dataclasses import replace

import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

from model.backends import resolve_attention
from helpers import preset_configs
from model.corruption import MASK_RATE, random_batch
from model.corruption import SpecialTokens, make_pretraining_batch, replacement_cdf
from model.encoder import Encoder, compile_encoders
from model.objective import build_pretraining_model, to_device
from model.step import compile_step


def no_dropout_model(variant: str = "cocolm"):
    model_cfg, objective_cfg, crop_fraction = preset_configs("tiny", variant)
    model_cfg = replace(model_cfg, vocab_size=300, dropout=0.0, attention_dropout=0.0)  # eager == compiled
    torch.manual_seed(0)
    return build_pretraining_model(model_cfg, objective_cfg).train(), crop_fraction


def loss_and_grads(model, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    generator = torch.Generator(batch["input_ids"].device).manual_seed(1)  # the same replacement draws
    out = model(batch, generator=generator)
    grads = torch.autograd.grad(out.loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    return out.loss.detach(), grads


def test_compiled_encoders_give_the_eager_loss_and_gradients_and_keep_checkpoint_keys():
    eager, crop_fraction = no_dropout_model()
    compiled, _ = no_dropout_model()
    keys = list(compiled.state_dict())
    assert len(compile_encoders(compiled, backend="aot_eager")) == 3  # tiny: 2 main layers, 1 auxiliary
    assert list(compiled.state_dict()) == keys  # no `_orig_mod.` prefix: checkpoints are unchanged
    batch = random_batch(4, 48, 300, crop_fraction)
    loss_e, grads_e = loss_and_grads(eager, batch)
    loss_c, grads_c = loss_and_grads(compiled, batch)
    torch.testing.assert_close(loss_c, loss_e, atol=1e-5, rtol=1e-5)
    for (name, _), a, b in zip(eager.named_parameters(), grads_e, grads_c):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


def test_a_compiled_step_never_recompiles_after_the_first():
    """A COCO-LM step on packed blocks traces two layer graphs (training pass on the block and on the
    crop; without dropout the auxiliary samples from its training pass, so there is no no-grad pass
    to trace). A batch with padding (the stream pads the last
    block of a shard) adds its own, where the mask is per row rather than shared by the batch; after
    that, batches of either kind reuse their graphs, whatever their masks."""
    torch.compiler.reset()
    counters.clear()
    model, crop_fraction = no_dropout_model()
    compile_encoders(model, backend="aot_eager")
    model(random_batch(4, 48, 300, crop_fraction, seed=0)).loss.backward()
    assert counters["stats"]["unique_graphs"] == 2  # the auxiliary's layer shares the main layers' graphs

    def padded_batch(seed: int, length: int) -> dict:
        ids = random_batch(4, 48, 300, crop_fraction, seed=seed)["input_ids"]
        ids[-1, length:] = SpecialTokens.pad
        return make_pretraining_batch(ids, crop_fraction=crop_fraction)

    model(padded_batch(1, 29)).loss.backward()
    with torch._dynamo.config.patch(error_on_recompile=True):
        model(random_batch(4, 48, 300, crop_fraction, seed=2)).loss.backward()
        model(padded_batch(3, 17)).loss.backward()


def test_the_samplers_cdf_reaches_the_compiler_as_one_opaque_op_and_no_scan():
    """The graph the whole-step compile hands to inductor holds no aten cumsum: the sampler's CDF is the
    opaque `cocolm::replacement_cdf`. A cumsum there would be inductor's scan over the vocabulary, split
    when the batch has few masked rows, and torch 2.11's inductor (the GPU machines') fails to generate
    that split scan (on an H200, for the 80 rows of a B 4, T 128 batch) or the auxiliary's accuracy argmax
    fused into it. The CDF's values are the eager function's to the bit."""
    model, crop_fraction = no_dropout_model()
    graphs = []

    def keep_forward(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    compile_step(model, "default", backend=aot_autograd(fw_compiler=keep_forward))
    model(to_device(random_batch(4, 48, 300, crop_fraction), torch.device("cpu"), MASK_RATE))
    targets = [node.target for graph in graphs for node in graph.graph.nodes if node.op == "call_function"]
    assert torch.ops.cocolm.replacement_cdf.default in targets
    assert torch.ops.aten.cumsum.default not in targets
    logits = torch.randn(6, 300, dtype=torch.bfloat16)
    logits[0, 3] = float("inf")
    expected = torch.softmax(logits.float().nan_to_num(posinf=torch.finfo(torch.float32).max / 2), -1).cumsum(-1)
    assert torch.equal(replacement_cdf(logits), expected)


def test_every_layer_of_every_encoder_is_compiled():
    model, _ = no_dropout_model("electra")  # a narrower auxiliary with its own projection
    compiled = compile_encoders(model, backend="aot_eager")
    layers = [layer for m in model.modules() if isinstance(m, Encoder) for layer in m.layers]
    assert len(layers) == 4 and {id(m) for m in compiled} == {id(m) for m in layers}  # tiny: 2 main + 2 aux
    assert all(m._compiled_call_impl is not None for m in compiled)


@pytest.mark.gpu
def test_compiled_flex_step_on_cuda_matches_the_eager_sdpa_step():
    """The fast path end to end (inductor, FlexAttention inside the compiled layers) against the plain
    eager step with SDPA, same weights and replacement draws. In fp32, so both draw the same tokens
    (bf16 flex against the reference is checked in test_flex_attention.py)."""
    eager, crop_fraction = no_dropout_model()
    compiled, _ = no_dropout_model()
    eager, compiled = eager.cuda(), compiled.cuda()
    for encoder in (m for m in compiled.modules() if isinstance(m, Encoder)):
        encoder.set_attention("flex")  # what 'auto' runs on CUDA without attention dropout, by name
        assert resolve_attention(encoder.attention_implementation, torch.device("cuda"), False) == "flex"
    for encoder in (m for m in eager.modules() if isinstance(m, Encoder)):
        encoder.set_attention("sdpa")
    compile_encoders(compiled)
    batch = {k: v.cuda() for k, v in random_batch(8, 128, 300, crop_fraction).items()}
    loss_e, grads_e = loss_and_grads(eager, batch)
    loss_c, grads_c = loss_and_grads(compiled, batch)
    torch.testing.assert_close(loss_c, loss_e, atol=1e-4, rtol=1e-4)
    for (name, _), a, b in zip(eager.named_parameters(), grads_e, grads_c):
        if a is not None:  # 1e-2: the SCL head's gradients are ~1e-6 and carry fp32 noise of ~1e-3 (CPU check)
            assert ((b - a).norm() / a.norm().clamp(min=1e-12)).item() < 1e-2, name
