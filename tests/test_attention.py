"""Relative position buckets and attention, checked against independent scalar computations
(docs/method.md section 2.2)."""

import math

import pytest
import torch

from model import ModelConfig, relative_position_bucket
from model.attention import RelativePositionBias, attention_bias, reference_attention, sdpa_attention
from model.encoder import Encoder


def bucket_by_hand(d: int, num_buckets: int, max_distance: int) -> int:
    """docs/method.md section 2.2 written for one integer, with math.ceil and max_distance - 1 as the
    authors have them."""
    half = num_buckets // 2
    exact = half // 2
    n = abs(d)
    if n < exact:
        b = n
    else:
        b = min(half - 1, exact + math.ceil(math.log(n / exact) / math.log((max_distance - 1) / exact) * (half - 1 - exact)))
    sign = (d > 0) - (d < 0)
    return sign * b + half - 1


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 128), (128, 256)])
def test_bucket_ids_match_the_formula(num_buckets, max_distance):
    d = torch.arange(-3 * max_distance, 3 * max_distance + 1)
    ours = relative_position_bucket(d, num_buckets, max_distance)
    expected = torch.tensor([bucket_by_hand(int(x), num_buckets, max_distance) for x in d])
    assert ours.dtype == torch.long
    assert torch.equal(ours, expected)
    assert ours.min() == 0 and ours.max() == num_buckets - 2  # shifted ids 0 .. num_buckets - 2


def test_bucket_known_values_base():
    # base: 32 buckets, max distance 128 -> half 16, exact 8, zero offset 15.
    d = torch.tensor([0, 1, -1, 7, 8, 9, -9, 20, 127, 128, 1000, -1000])
    expected = torch.tensor([15, 16, 14, 22, 23, 24, 6, 26, 30, 30, 30, 0])
    assert torch.equal(relative_position_bucket(d, 32, 128), expected)


def test_ceil_and_max_distance_minus_one_matter():
    """The details that separate the authors' function from T5's change real ids."""
    d = range(1, 300)

    def variant(rounding, denominator):
        half, exact = 16, 8
        out = []
        for n in d:
            b = n if n < exact else min(half - 1, exact + rounding(math.log(n / exact) / math.log(denominator / exact) * (half - 1 - exact)))
            out.append(b + half - 1)
        return out

    ours = relative_position_bucket(torch.tensor(list(d)), 32, 128).tolist()
    assert ours == variant(math.ceil, 127)
    assert ours != variant(math.floor, 127)
    assert ours != variant(math.ceil, 128)


def test_bias_table_is_shared_by_all_layers():
    enc = Encoder(ModelConfig(vocab_size=50, hidden_size=16, num_layers=3, num_heads=2, ffn_size=32).main)
    tables = [name for name, _ in enc.named_parameters() if "relative_bias" in name]
    assert tables == ["relative_bias.table.weight"]


def test_sdpa_equals_written_out_attention_with_bias_and_padding():
    torch.manual_seed(0)
    batch, heads, seq, dim = 3, 2, 10, 8
    q, k, v = (torch.randn(batch, heads, seq, dim, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2, 3:] = False
    table = torch.randn(32, heads, dtype=torch.float64)
    rel = torch.arange(seq)[None, :] - torch.arange(seq)[:, None]
    position_bias = table[relative_position_bucket(rel, 32, 128)].permute(2, 0, 1)[None]  # (1, h, T, T)
    bias = attention_bias(mask, position_bias, torch.float64)
    fast = sdpa_attention(q, k, v, bias)
    # Independent: per query, softmax over the real keys of (q.k / sqrt(d) + bias) with explicit loops over keys.
    expected = torch.zeros_like(fast)
    for b in range(batch):
        for h in range(heads):
            for i in range(seq):
                keys = [j for j in range(seq) if mask[b, j]]
                logits = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(dim) + position_bias[0, h, i, j] for j in keys])
                weights = torch.softmax(logits, 0)
                expected[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, keys))
    torch.testing.assert_close(fast, expected)
    torch.testing.assert_close(reference_attention(q, k, v, bias), expected)


@pytest.mark.parametrize("relative_position", [True, False])
def test_encoder_sdpa_path_equals_reference_path(relative_position):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
                      relative_position=relative_position).main
    enc = Encoder(cfg).eval()
    ids = torch.randint(5, 60, (3, 24))
    ids[:, 0] = 2
    ids[1, 15:] = 0
    mask = ids != 0
    fast = enc(ids, mask)
    enc.set_attention("reference")
    slow = enc(ids, mask)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    # Gradients agree too.
    enc.set_attention("sdpa")
    g_fast = torch.autograd.grad(enc(ids, mask)[mask].sum(), list(enc.parameters()))
    enc.set_attention("reference")
    g_slow = torch.autograd.grad(enc(ids, mask)[mask].sum(), list(enc.parameters()))
    for a, b in zip(g_fast, g_slow):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_without_padding_the_mask_is_the_relative_bias_alone_shared_by_the_batch():
    torch.manual_seed(0)
    relative = RelativePositionBias(ModelConfig(vocab_size=60, hidden_size=32, num_heads=4).main)
    bias = attention_bias(None, relative(20), torch.bfloat16)  # T = 20: rows padded in memory to 32
    assert bias.shape == (1, 4, 20, 20) and bias.dtype == torch.bfloat16  # no batch dimension to write a gradient for
    assert torch.equal(bias, relative(20).to(torch.bfloat16))
    q = torch.zeros(3, 4, 20, 8, dtype=torch.bfloat16)
    assert_fused_kernel_layout({"q": q, "k": q, "v": q, "mask": bias})
    assert attention_bias(None, None, torch.float32) is None  # nothing to add: SDPA may take its flash kernel


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("implementation", ["sdpa", "reference", "flex"])
@pytest.mark.parametrize("relative_position", [True, False])
def test_encoder_all_real_equals_the_all_ones_mask(implementation, relative_position):
    """`all_real` (no padding anywhere) drops the padding term; with an all-ones mask the general path
    computes the same outputs and gradients (flex: outputs only, it has no CPU backward; its GPU
    gradients are checked in test_flex_attention.py)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
                      relative_position=relative_position, attention_dropout=0.0).main
    enc = Encoder(cfg).eval()
    enc.set_attention(implementation)
    ids = torch.randint(5, 60, (3, 24))
    ids[:, 0] = 2
    mask = torch.ones_like(ids, dtype=torch.bool)
    params = list(enc.parameters())
    with torch.set_grad_enabled(implementation != "flex"):
        fast, general = enc(ids, mask, all_real=True), enc(ids, mask)
    torch.testing.assert_close(fast, general, atol=1e-5, rtol=1e-5)
    if implementation == "flex":
        return
    g_fast = torch.autograd.grad(fast.square().sum(), params)
    g_general = torch.autograd.grad(general.square().sum(), params)
    for a, b in zip(g_fast, g_general):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_padding_does_not_change_real_positions():
    torch.manual_seed(0)
    enc = Encoder(ModelConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64).main).eval()
    ids = torch.randint(5, 60, (1, 12))
    ids[0, 0] = 2
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    torch.testing.assert_close(enc(ids)[0], enc(padded)[0, :12], atol=1e-5, rtol=1e-5)


# What SDPA receives. On a GPU its fused kernels take a float mask only in q's dtype and only with a
# contiguous last dimension; anything else runs the unfused math path in fp32 (the H100 profile
# showed fp32 bmm and softmax kernels). CPU SDPA accepts any layout, so these tests record the call.

def record_sdpa_calls(monkeypatch) -> list[dict]:
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, **kwargs):
        calls.append({"q": q, "k": k, "v": v, "mask": attn_mask, "dropout_p": dropout_p})
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return calls


def assert_fused_kernel_layout(call: dict) -> None:
    q, mask = call["q"], call["mask"]
    assert mask.dtype == q.dtype == call["k"].dtype == call["v"].dtype
    assert all(t.stride(-1) == 1 for t in (q, call["k"], call["v"], mask))
    # memory-efficient kernel: every other stride 16-element aligned, so SDPA does not re-pad per call
    assert all(s % 16 == 0 for s in mask.stride()[:-1]), mask.stride()


@pytest.mark.parametrize("seq_len", [48, 45])  # a multiple of 16, and one whose rows need padding in memory
@pytest.mark.parametrize("relative_position", [True, False])
@pytest.mark.parametrize("autocast", [True, False])
def test_sdpa_gets_a_mask_in_q_dtype_laid_out_for_the_fused_kernels(monkeypatch, seq_len, relative_position, autocast):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
                      relative_position=relative_position).main
    enc = Encoder(cfg).train()  # attention dropout 0.1 active: the paper's setting stays on SDPA
    ids = torch.randint(5, 50, (3, seq_len))
    ids[1, seq_len - 7:] = 0
    calls = record_sdpa_calls(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = enc(ids)
    out.float().sum().backward()
    assert len(calls) == cfg.num_layers and all(c["dropout_p"] == 0.1 for c in calls)
    expected = torch.bfloat16 if autocast else torch.float32
    for call in calls:
        assert call["q"].dtype == expected
        assert_fused_kernel_layout(call)
    if relative_position:
        assert enc.relative_bias.table.weight.grad.abs().sum() > 0  # the bias still learns through the mask


def test_aligned_mask_has_the_values_of_the_plain_sum():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=10, hidden_size=32, num_heads=4, ffn_size=8).main
    relative = RelativePositionBias(cfg)
    position_bias = relative(45)
    assert position_bias.is_contiguous()  # a permuted lookup (last stride = heads) is what GPUs refused
    mask = torch.ones(2, 45, dtype=torch.bool)
    mask[1, 30:] = False
    padding = torch.zeros(2, 45).masked_fill(~mask, float("-inf"))[:, None, None, :]
    torch.testing.assert_close(attention_bias(mask, position_bias, torch.float32), position_bias + padding)


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("seq_len", [512, 460])  # the base block and its crop
def test_model_sdpa_runs_the_memory_efficient_kernel_on_cuda(compiled, seq_len):
    """The paper's setting (attention dropout 0.1, bias needing a gradient) on a fused kernel, forward
    and backward, eager and with the layers compiled: no math-path bmm anywhere in the step."""
    from model.encoder import compile_encoders

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=300, hidden_size=768, num_layers=2, num_heads=12, ffn_size=3072).main
    enc = Encoder(cfg).cuda().train()
    enc.set_attention("sdpa")  # 'auto' runs the Triton kernel on CUDA (tests/test_triton_attention.py)
    if compiled:
        compile_encoders(enc)
    ids = torch.randint(5, 300, (4, seq_len), device="cuda")
    ids[1, seq_len - 37:] = 0

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = enc(ids)
        out.float().square().mean().backward()

    step()  # compilation and autotuning outside the profile
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        step()
        torch.cuda.synchronize()
    names = {event.key for event in profiler.key_averages()}
    assert any("efficient_attention" in n and "backward" not in n for n in names), sorted(names)
    assert any("efficient_attention_backward" in n for n in names), sorted(names)
    assert "aten::_scaled_dot_product_attention_math" not in names and "aten::bmm" not in names
    assert enc.relative_bias.table.weight.grad.abs().sum() > 0


# The Triton kernel (model/kernels/attention.py) on a GPU. Its CPU tests, which run on the compiled
# kernels too when CUDA is present, are in tests/test_triton_attention.py; bf16 is checked here only,
# as Triton's interpreter gets bf16 products wrong.

@pytest.mark.gpu
@pytest.mark.parametrize("seq_len", [512, 460])  # the bench's block and its crop
def test_triton_kernel_in_bf16_on_cuda_matches_the_fp32_reference_with_its_dropout_mask(seq_len):
    """base's heads and head size, rows ending mid-block and with whole blocks padded, dropout 0.1 with
    the kernel's own mask: forward and the gradients of q, k, v and the bias table."""
    from model.kernels import attention as kernels

    torch.manual_seed(0)
    lengths = [seq_len, seq_len - 37, 256, 64]
    q, k, v = (torch.randn(4, 12, seq_len, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    relative = RelativePositionBias(ModelConfig(vocab_size=10, hidden_size=768, num_heads=12, ffn_size=8).main).cuda()
    torch.nn.init.normal_(relative.table.weight)
    mask = torch.arange(seq_len, device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None]
    seed = torch.tensor(42, dtype=torch.int64, device="cuda")
    fast = kernels.relative_attention(q, k, v, relative.by_distance(seq_len), mask, 0.1, seed)
    keep = kernels.dropout_keep_mask(seed, 4, 12, seq_len, 0.1)
    slow = reference_attention(q.float(), k.float(), v.float(), attention_bias(mask, relative(seq_len), torch.float32),
                               0.1, keep)

    def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert fast.dtype == torch.bfloat16 and relative_error(fast, slow) < 3e-2
    weights = torch.randn(fast.shape, device="cuda")
    inputs = [q, k, v, relative.table.weight]
    g_fast = torch.autograd.grad((fast.float() * weights).sum(), inputs)
    g_slow = torch.autograd.grad((slow * weights).sum(), inputs)
    for name, a, b in zip(["q", "k", "v", "bias table"], g_fast, g_slow):
        assert relative_error(a, b) < 3e-2, name


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_the_triton_attention_runs_its_kernels_on_cuda(compiled, fresh_attention_state):
    """'triton' in the paper's setting (training, attention dropout 0.1, bf16 autocast), eager and with the
    layers compiled: our three kernels in the profile, no SDPA or flex kernel, no fallback."""
    from model.encoder import compile_encoders

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=300, hidden_size=768, num_layers=2, num_heads=12, ffn_size=3072).main
    enc = Encoder(cfg).cuda().train()
    enc.set_attention("triton")
    if compiled:
        compile_encoders(enc)
    ids = torch.randint(5, 300, (4, 512), device="cuda")
    ids[1, 475:] = 0

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = enc(ids)
        out.float().square().mean().backward()

    step()  # the probe and compilation outside the profile
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        step()
        torch.cuda.synchronize()
    names = {event.key for event in profiler.key_averages()}
    for kernel in ("_forward_kernel", "_backward_dkdv_kernel", "_backward_dq_kernel"):
        assert any(kernel in n for n in names), (kernel, sorted(names))
    assert not any("efficient_attention" in n or "flex_attention" in n for n in names), sorted(names)
    assert not fresh_attention_state.triton_failures() and enc.attention_ran == {"training": "triton"}
    assert enc.relative_bias.table.weight.grad.abs().sum() > 0
