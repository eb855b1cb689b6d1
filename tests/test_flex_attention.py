"""The FlexAttention path (relative bias as score_mod, padding as BlockMask) against the written-out
reference, forward and backward, and the rules that choose it (docs/design.md section 7).

On CPU torch has no fused flex kernel with a backward, only flex's unfused reference path; that path
runs our score_mod and BlockMask exactly as written, so it checks their meaning. The fused CUDA
kernels (compiled Triton, with the bias gradient scattered by atomics) are checked by the gpu tests.
"""

import warnings

import pytest
import torch
import torch._dynamo
import torch.nn.attention.flex_attention as flex_module

from model import ModelConfig
import model.backends.dispatch as dispatch_module
from model.attention import RelativePositionBias, attention_bias, reference_attention
from model.backends import resolve_attention
from model.backends.flex import (
    FLEX_BLOCKS, FlexBlocks, device_flex_options, flex_bias, flex_kernel_options, flex_relative_attention,
)
from model.encoder import Encoder, compile_encoders

from helpers import SimulatedTritonError, assert_falls_back_to_sdpa

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture
def flex_backward_on_cpu(monkeypatch):
    """torch refuses flex inputs that require grad on CPU (it has no fused CPU backward kernel); the
    unfused path it runs uncompiled differentiates fine, so the CPU tests let it through."""
    monkeypatch.setattr(flex_module, "_validate_device", lambda query, key, value: None)


def padded_mask(batch: int, seq_len: int, lengths: list[int]) -> torch.Tensor:
    mask = torch.zeros(batch, seq_len, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = True
    return mask  # (B, T)


def attention_inputs(
    seq_len: int, lengths: list[int], device: str = "cpu", dtype: torch.dtype = torch.float32,
    heads: int = 4, dim: int = 16,
):
    """q, k, v, a bias table (all requiring grad) and a padding mask with rows of the given lengths."""
    torch.manual_seed(0)
    batch = len(lengths)
    shape = (batch, heads, seq_len, dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    cfg = ModelConfig(vocab_size=10, hidden_size=heads * dim, num_heads=heads, ffn_size=8).main
    relative = RelativePositionBias(cfg).to(device)
    torch.nn.init.normal_(relative.table.weight)  # large enough to move the softmax
    return q, k, v, relative, padded_mask(batch, seq_len, lengths).to(device)


def grads_of(out: torch.Tensor, mask: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of a weighted sum over real query rows (padded rows' outputs are never used)."""
    weights = torch.linspace(-1, 1, out.shape[-1], device=out.device)
    loss = (out.float() * weights).sum(-1).masked_fill(~mask[:, None, :], 0).sum()
    return list(torch.autograd.grad(loss, tensors))


# T = 136 spans two 128-key blocks, the second partial; the row of length 70 has that block fully
# padded, so the BlockMask skips it; the row of length 130 ends inside it, so mask_mod decides there.
LENGTHS = [136, 130, 70]


def test_flex_equals_reference_with_bias_and_padding_forward_and_backward(flex_backward_on_cpu):
    q, k, v, relative, mask = attention_inputs(136, LENGTHS)
    fast = flex_relative_attention(q, k, v, flex_bias(mask, relative(136)))
    slow = reference_attention(q, k, v, attention_bias(mask, relative(136), q.dtype))  # relative: (1, h, T, T)
    real = mask[:, None, :, None].expand_as(slow)
    torch.testing.assert_close(fast[real], slow[real], atol=1e-5, rtol=1e-5)
    inputs = [q, k, v, relative.table.weight]
    g_fast, g_slow = grads_of(fast, mask, inputs), grads_of(slow, mask, inputs)
    for name, a, b in zip(["q", "k", "v", "bias table"], g_fast, g_slow):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    assert g_fast[3].abs().sum() > 0  # the bias table learns through the score_mod


def test_flex_without_relative_bias_masks_padding_only(flex_backward_on_cpu):
    q, k, v, _, mask = attention_inputs(40, [40, 25])
    fast = flex_relative_attention(q, k, v, flex_bias(mask, None))
    slow = reference_attention(q, k, v, attention_bias(mask, None, q.dtype))
    torch.testing.assert_close(fast[0], slow[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast[1, :, :25], slow[1, :, :25], atol=1e-5, rtol=1e-5)


def small_encoder(relative_position: bool = True, **overrides) -> Encoder:
    torch.manual_seed(0)
    shape = dict(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, max_positions=160)
    cfg = ModelConfig(relative_position=relative_position, **{**shape, **overrides}).main
    return Encoder(cfg)


def padded_ids(seq_len: int = 136) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(5, 60, (3, seq_len))
    ids[:, 0] = 2
    ids[1, 130:] = 0
    ids[2, 70:] = 0
    return ids, ids != 0


@pytest.mark.parametrize("relative_position", [True, False])
def test_encoder_flex_path_equals_reference_path(flex_backward_on_cpu, relative_position):
    enc = small_encoder(relative_position).eval()  # eval: no dropout, so the paths are comparable
    ids, mask = padded_ids()
    params = list(enc.parameters())
    results = {}
    for implementation in ("flex", "reference"):
        enc.set_attention(implementation)
        out = enc(ids, mask)  # (B, T, H)
        results[implementation] = out, torch.autograd.grad(out[mask].square().sum(), params)
    (fast, g_fast), (slow, g_slow) = results["flex"], results["reference"]
    torch.testing.assert_close(fast[mask], slow[mask], atol=1e-5, rtol=1e-5)
    for (name, _), a, b in zip(enc.named_parameters(), g_fast, g_slow):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


def test_compiled_encoder_traces_the_flex_path_and_keeps_its_state_dict_keys(flex_backward_on_cpu):
    """What `bench --compile` and `train.compile` do to each encoder, with a backend that needs no C++ toolchain.
    Forward only: a compiled flex graph on CPU does not save what the backward needs."""
    enc = small_encoder(attention_dropout=0.0).eval()
    reference = small_encoder(attention_dropout=0.0).eval()
    reference.set_attention("reference")
    keys = list(enc.state_dict())
    enc.set_attention("flex")
    compile_encoders(enc, backend="aot_eager")
    assert list(enc.state_dict()) == keys  # no `_orig_mod.` prefix for checkpoints
    ids, mask = padded_ids()
    with torch.no_grad():
        torch.testing.assert_close(enc(ids, mask)[mask], reference(ids, mask)[mask], atol=1e-5, rtol=1e-5)
        # A new padding pattern is a new BlockMask and score_mod closure, not a new graph: a recompile
        # per batch would exhaust dynamo's limit and fall back to eager flex, silently slow.
        ids[0, 100:], mask[0, 100:] = 0, False
        with torch._dynamo.config.patch(error_on_recompile=True):
            torch.testing.assert_close(enc(ids, mask)[mask], reference(ids, mask)[mask], atol=1e-5, rtol=1e-5)


def test_auto_never_picks_flex_and_flex_refuses_active_attention_dropout():
    """'auto' runs flex on CUDA only while no attention dropout is active (`fallback_attention`, also what
    runs where the Triton kernel fails), SDPA with it; flex by name with dropout is refused."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_attention("auto", cuda, dropout_active=False) == "flex"
    assert resolve_attention("auto", cuda, dropout_active=True) == "sdpa"
    assert resolve_attention("auto", cpu, dropout_active=False) == "sdpa"
    assert resolve_attention("flex", cuda, dropout_active=False) == "flex"
    assert resolve_attention("reference", cuda, dropout_active=True) == "reference"
    with pytest.raises(ValueError, match="no attention dropout"):
        resolve_attention("flex", cuda, dropout_active=True)
    with pytest.raises(ValueError, match="unknown attention"):
        resolve_attention("flash", cpu, dropout_active=False)


def test_encoder_never_drops_attention_dropout_silently():
    enc = small_encoder()  # attention_dropout 0.1, train mode
    assert enc.attention_implementation == "auto"
    enc.set_attention("flex")
    ids, mask = padded_ids(24)
    with pytest.raises(ValueError, match="no attention dropout"):
        enc(ids, mask)
    with pytest.raises(ValueError, match="unknown attention"):
        enc.set_attention("flash")


def test_cpu_default_is_sdpa():
    enc = small_encoder().eval()
    ids, mask = padded_ids(24)
    default = enc(ids, mask)
    enc.set_attention("sdpa")
    assert torch.equal(default, enc(ids, mask))


# Kernel options and the fallback to SDPA. On an H100, torch's default flex tiles for bf16, d=64 with
# the captured fp32 bias asked for 311,296 bytes of shared memory per block (limit 232,448) and the
# first step died; the options are now chosen to fit, and a failure that remains falls back once.

H100_SHARED_MEMORY = 232_448  # bytes per block, opt-in (cudaDevAttrMaxSharedMemoryPerBlockOptin)


def test_shared_memory_estimate_reproduces_the_h100_failure():
    torch_default = FlexBlocks(128, 128, 3, 64, 128, 128, 64, 3)  # torch's sm90 tiles for bf16, d=64
    assert torch_default.forward_shared_memory(head_dim=64, io_bytes=2, bias_bytes=4) == 311_296
    assert torch_default.forward_shared_memory(64, 2, 4) > H100_SHARED_MEMORY


@pytest.mark.parametrize("shared_memory", [H100_SHARED_MEMORY, 101_376, 65_536])  # H100, sm86/89, small
@pytest.mark.parametrize("head_dim,bias_bytes", [(64, 4), (64, 0), (128, 4)])
def test_kernel_options_fit_the_device_and_prefer_the_fastest(shared_memory, head_dim, bias_bytes):
    options = flex_kernel_options(head_dim, io_bytes=2, bias_bytes=bias_bytes, shared_memory=shared_memory)
    assert options is not None
    chosen = next(b for b in FLEX_BLOCKS if b.kernel_options() == options)
    assert chosen.forward_shared_memory(head_dim, 2, bias_bytes) <= shared_memory
    assert chosen.backward_shared_memory(head_dim, 2, bias_bytes) <= shared_memory
    for faster in FLEX_BLOCKS[:FLEX_BLOCKS.index(chosen)]:  # every faster entry would not fit
        assert max(faster.forward_shared_memory(head_dim, 2, bias_bytes),
                   faster.backward_shared_memory(head_dim, 2, bias_bytes)) > shared_memory
    for tile in ("fwd_BLOCK_M", "fwd_BLOCK_N", "bwd_BLOCK_M1", "bwd_BLOCK_N1", "bwd_BLOCK_M2", "bwd_BLOCK_N2"):
        assert 128 % options[tile] == 0  # tiles must divide the BlockMask's 128-token blocks
    if (shared_memory, head_dim, bias_bytes) == (H100_SHARED_MEMORY, 64, 4):
        assert options == FLEX_BLOCKS[0].kernel_options()  # the fastest measured on an H100 fits there


def test_no_options_when_nothing_fits_and_none_off_cuda():
    assert flex_kernel_options(64, 2, 4, shared_memory=8_192) is None
    assert device_flex_options(torch.device("cpu"), 64, torch.bfloat16, torch.float32) is None


def test_a_failing_probe_falls_back_once_with_one_warning_naming_the_cause(fresh_attention_state):
    flex_works = fresh_attention_state.flex_works
    probes = []

    def probe():
        probes.append(1)
        raise SimulatedTritonError("No valid triton configs. OutOfMemoryError: out of resource: Required: 311296")

    with pytest.warns(RuntimeWarning, match="SimulatedTritonError: No valid triton configs") as caught:
        assert flex_works(("cuda:0", 12, 64), probe) is False
    assert len(caught) == 1 and "uses SDPA" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, and no second probe, for any configuration
        assert flex_works(("cuda:0", 12, 64), probe) is False
        assert flex_works(("cuda:0", 4, 64), probe) is False
    assert len(probes) == 1
    assert fresh_attention_state.flex_failure().startswith("SimulatedTritonError")


def test_a_passing_probe_runs_once_per_configuration(fresh_attention_state):
    flex_works = fresh_attention_state.flex_works
    probes = []
    assert flex_works(("cuda:0", 12, 64), lambda: probes.append("a")) is True
    assert flex_works(("cuda:0", 12, 64), lambda: probes.append("b")) is True
    assert flex_works(("cuda:0", 4, 64), lambda: probes.append("c")) is True
    assert probes == ["a", "c"] and fresh_attention_state.flex_failure() is None


def test_encoder_falls_back_to_sdpa_when_flex_fails_to_compile(fresh_attention_state, monkeypatch):
    """The encoder's side of the fallback, on CPU: the probe is made to run here and to fail as the
    H100's did; the forward then equals the SDPA forward, and training goes on."""
    monkeypatch.setattr(dispatch_module.BACKENDS, "probed_device_types", ("cpu", "cuda"))

    def failing_probe(*args):
        raise SimulatedTritonError("out of resource: shared memory, Required: 311296 Hardware limit: 232448")

    monkeypatch.setattr(dispatch_module, "probe_flex", failing_probe)
    assert_falls_back_to_sdpa(small_encoder(attention_dropout=0.0).eval(), *padded_ids(), "flex", "Hardware limit")


# The fused kernels on a GPU: compiled flex in bf16 and fp32 (TF32 matmuls inside), at the bench's
# block and crop lengths, against the reference in fp32 on the same (rounded) inputs.

def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 3e-2), (torch.float32, 5e-3)])
@pytest.mark.parametrize("seq_len", [512, 460])
@pytest.mark.gpu
def test_compiled_flex_on_cuda_matches_reference(dtype, tolerance, seq_len):
    # base's heads and head size; rows ending mid-block, on a block edge, and with whole blocks padded
    lengths = [seq_len, seq_len - 37, 256, 64]
    q, k, v, relative, mask = attention_inputs(seq_len, lengths, "cuda", dtype, heads=12, dim=64)
    options = device_flex_options(q.device, 64, dtype, torch.float32)  # tiles that fit this GPU
    fast = flex_relative_attention(q, k, v, flex_bias(mask, relative(seq_len), options))  # compiled on CUDA
    slow = reference_attention(q.float(), k.float(), v.float(), attention_bias(mask, relative(seq_len), torch.float32))
    real = mask[:, None, :, None].expand_as(slow)
    assert relative_error(fast[real], slow[real]) < tolerance
    inputs = [q, k, v, relative.table.weight]
    for name, a, b in zip(["q", "k", "v", "bias table"], grads_of(fast, mask, inputs), grads_of(slow, mask, inputs)):
        assert relative_error(a, b) < tolerance, name


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.gpu
def test_encoder_flex_under_autocast_is_as_accurate_as_sdpa_on_cuda(compiled, fresh_attention_state):
    """The whole encoder under bf16 autocast, flex against SDPA, each measured against the same encoder
    in fp32: flex may not be less accurate than SDPA (bf16 rounding alone puts some parameters'
    gradients 5-10% off, for both, so the two bf16 paths are not compared with each other)."""
    # 2 heads of 16: Triton's flex kernels need a head size of at least 16 (with 4 heads of 8 the probe
    # fails, the encoder falls back to SDPA, and the comparison would be SDPA against itself).
    enc = small_encoder(attention_dropout=0.0, num_heads=2).cuda().eval()
    ids, mask = (t.cuda() for t in padded_ids())
    if compiled:
        compile_encoders(enc)
    params = list(enc.parameters())
    results = {}
    for implementation, autocast in (("flex", True), ("sdpa", True), ("sdpa", False)):
        enc.set_attention(implementation)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = enc(ids, mask)
        results[implementation, autocast] = out, torch.autograd.grad(out[mask].float().square().sum(), params)
    assert fresh_attention_state.flex_failure() is None  # flex ran: no fallback to SDPA
    (flex, g_flex), (sdpa, g_sdpa), (exact, g_exact) = results.values()
    assert relative_error(flex[mask], exact[mask]) < max(2 * relative_error(sdpa[mask], exact[mask]), 1e-2)
    for (name, _), a, b, ref in zip(enc.named_parameters(), g_flex, g_sdpa, g_exact):
        assert relative_error(a, ref) < max(2 * relative_error(b, ref), 1e-2), name
