"""Attention alone: our Triton kernel, SDPA and flex timed outside a step (`attention_alone`), what one
call of the kernel dispatches besides its kernels (`attention_ops`), and the kernel variants a process
compiles before its first step (`kernel_compiles`)."""

from __future__ import annotations

import cProfile
import io
import pstats
from typing import Callable
from unittest import mock

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch._library.custom_ops import OPDEFS
from torch.utils._python_dispatch import TorchDispatchMode

from model.attention import RelativePositionBias
from model.backends import BACKENDS
from model.backends.flex import device_flex_options, flex_bias, flex_relative_attention
from model.backends.fused import kernel_variants
from model.corruption import MASK_RATE, random_batch
from model.encoder import Encoder
from model.kernels import attention as kernels
from model.objective import build_pretraining_model, to_device

from bench.steps import bench_config, host_and_wall_seconds, pick_device, profile_table, seconds_per_call, sync


def attention_alone(
    preset: str, seq_len: int, batch: int, dropout_p: float, device: str | None = None, repeats: int = 20,
    warmup: int = 3, profile: bool = False,
) -> list[tuple[str, str]]:
    """Attention alone at the preset's main-encoder shape, bf16 on CUDA (fp32 elsewhere): ms per call of
    the forward and of forward + backward (gradients for q, k, v and the bias) for our Triton kernel
    (the bias by distance, its gradient inside the kernel), SDPA's memory-efficient kernel with the
    broadcast (1, heads, T, T) bias our SDPA path passes, flash attention without a bias (what the
    ELECTRA peer runs; the floor) and, without dropout, compiled flex with the bias as the encoder
    passes it. The step bench times these inside a step; this separates the kernel
    from the rest, so a step's gap can be split between attention and everything else. With `profile`,
    each side's forward + backward under torch.profiler follows its times: host and device time per operator,
    which shows a call that takes longer than its kernels."""
    dev = pick_device(device)
    cfg = bench_config(preset, "cocolm", dropout_p)[0].main
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    generator = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(batch, cfg.num_heads, seq_len, cfg.head_dim, device=dev, dtype=dtype,
                           generator=generator).requires_grad_() for _ in range(3))
    relative = RelativePositionBias(cfg).to(dev)
    with torch.no_grad():  # a bias of some size, as a trained table has (standard deviation 2)
        relative.table.weight.normal_(0.0, 2.0, generator=generator)
    table = relative.by_distance(seq_len).detach().requires_grad_()  # (heads, 2S + 1) fp32
    dense = relative(seq_len).to(dtype).detach().requires_grad_()  # (1, heads, T, T)

    def sdpa(backend: SDPBackend, mask: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return call

    sides = {
        "triton (ours), bias by distance": lambda: kernels.relative_attention(q, k, v, table, None, dropout_p),
        "sdpa memory-efficient, bias (1, h, T, T)": sdpa(SDPBackend.EFFICIENT_ATTENTION, dense),
        "sdpa flash, no bias (the ELECTRA peer's)": sdpa(SDPBackend.FLASH_ATTENTION, None),
    }
    leaves = [q, k, v, table, dense]
    if not dropout_p:  # flex has no attention dropout; without it flex is 'auto''s choice on CUDA
        wide = relative(seq_len).detach().requires_grad_()  # (1, heads, T, T) fp32, as the encoder gives flex
        leaves.append(wide)
        options = device_flex_options(dev, cfg.head_dim, dtype, wide.dtype) if dev.type == "cuda" else None
        sides["flex, bias (h, T, T) in the kernel"] = lambda: flex_relative_attention(
            q, k, v, flex_bias(None, wide, options))
    grad = torch.randn_like(q)
    rows = []
    for name, call in sides.items():
        try:
            forward = 1000 * seconds_per_call(call, dev, repeats, warmup)
            host, both = (1000 * t for t in host_and_wall_seconds(lambda: call().backward(grad), dev, repeats, warmup))
            rows.append((name, f"{forward:8.3f} ms {both:8.3f} ms  (host {host:.3f} ms to issue forward + backward)"))
            if profile:
                rows.append(("", profile_table(lambda: call().backward(grad), dev, rows=15)))
        except Exception as error:  # a backend this device or build lacks: say so, time the others
            rows.append((name, f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:100]})"))
        for tensor in leaves:
            tensor.grad = None
    return rows


class _OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched under it, by kind: those that make a tensor without computing
    it (`ALLOCATIONS`), views, and the rest (each a kernel launch on a GPU). Our custom ops are counted
    and entered, so that what they dispatch inside is counted too; `paused` skips a kernel's own launch
    (under Triton's interpreter, the copies it makes are not the runtime's)."""

    ALLOCATIONS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "zeros",
                   "zeros_like", "new_zeros"}

    def __init__(self):
        super().__init__()
        self.counts: dict[str, list[str]] = {"compute": [], "allocation": [], "view": [], "custom op": []}
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if func.namespace == "cocolm":  # its Python body, with this mode on again, so its ops are counted
            self.counts["custom op"].append(name)
            with self:
                return OPDEFS[f"cocolm::{name}"]._init_fn(*args, **(kwargs or {}))
        if not self.paused:
            kind = ("allocation" if name in self.ALLOCATIONS else "view" if func.is_view else "compute")
            self.counts[kind].append(name)
        return func(*args, **(kwargs or {}))


def attention_ops(preset: str, seq_len: int, batch: int, dropout_p: float, device: str | None = None,
                  repeats: int = 20, warmup: int = 2) -> list[str]:
    """What one call of our Triton attention dispatches besides its kernels, forward and backward, at the
    preset's main-encoder shape, as the encoder calls it (the bias's lookup for every distance built
    once per pass, outside the call): aten operators by kind, custom ops and kernel launches. Runs on a
    GPU, or on the CPU under Triton's interpreter (TRITON_INTERPRET=1), whose own copies are not counted.
    Then the host's time to issue a call and the cProfile of a call, over `repeats` calls each (after
    `warmup`): under the interpreter a call takes about 0.35 s, so the counts alone need `repeats` 1."""
    dev = pick_device(device)
    cfg = bench_config(preset, "cocolm", dropout_p)[0].main
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    # q, k, v as the encoder has them: views of one fused projection, (B, T, 3, heads, d)
    qkv = torch.randn(batch, seq_len, 3, cfg.num_heads, cfg.head_dim, device=dev, dtype=dtype).requires_grad_()
    table = RelativePositionBias(cfg).to(dev).by_distance(seq_len).detach().requires_grad_()
    every = kernels.every_distance(table, seq_len)

    def call() -> torch.Tensor:
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        return kernels.relative_attention(q, k, v, table, None, dropout_p, every=every)

    call().float().sum().backward()  # tuned and compiled before counting
    qkv.grad = table.grad = None  # so that the counted backward hands its gradients over, adding nothing
    launches, run = [], kernels._run
    counter = _OpCounter()

    def counted_run(launch, block_m, block_n):
        launches.append(launch.kind)
        counter.paused = True
        try:
            run(launch, block_m, block_n)
        finally:
            counter.paused = False

    lines = []
    with mock.patch.object(kernels, "_run", counted_run):  # counts the launches; the kernels still run
        for name, work in (("forward", call), ("backward", lambda: out.backward(grad))):
            launches.clear()
            counter.counts = {kind: [] for kind in counter.counts}
            if name == "backward":
                grad = torch.ones_like(out)
            with counter:
                out = work()
            listed = "; ".join(f"{kind} {len(names)} ({', '.join(names)})" if names else f"{kind} 0"
                               for kind, names in counter.counts.items())
            lines.append(f"ops per call, {name}: kernel launches {len(launches)} ({', '.join(launches)}); {listed}")
    host, wall = host_and_wall_seconds(lambda: call().backward(grad), dev, repeats=repeats, warmup=warmup)
    lines.append(f"host {1000 * host:.3f} ms to issue one call forward + backward, {1000 * wall:.3f} ms until done")
    return lines + [python_profile(lambda: call().backward(grad), dev, repeats=repeats)]


def python_profile(call: Callable[[], object], device: torch.device, repeats: int = 20, rows: int = 30) -> str:
    """cProfile of `repeats` calls (then one device sync): the Python functions, ours, torch's and Triton's,
    with the most time of their own, to find what the host spends a call on."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeats):
        call()
    sync(device)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(rows)
    return out.getvalue()


def kernel_compiles(preset: str, seq_len: int, variant_name: str = "cocolm",
                    attention_dropout: float | None = None) -> tuple[set, set]:
    """(the attention shapes, the Triton kernel variants) one process compiles before its first step of
    this preset, as `TrainingStep.warm_up` probes and tunes them: the shapes are those one forward of the
    step meets (a training pass per sequence length, the sampling pass), found on the CPU without running
    the kernel (`model.backends.KernelProbes.planning`; one sequence, as the batch size changes neither), the variants
    counted from them (`model.backends.fused.kernel_variants`)."""
    model_cfg, objective_cfg, crop_fraction = bench_config(preset, variant_name, attention_dropout)
    model = build_pretraining_model(model_cfg, objective_cfg).train()
    for encoder in (m for m in model.modules() if isinstance(m, Encoder)):
        encoder.set_attention("triton")
    data = to_device(random_batch(1, seq_len, model_cfg.vocab_size, crop_fraction), torch.device("cpu"), MASK_RATE)
    with BACKENDS.probes.planning() as shapes:
        model(data)
    return shapes, kernel_variants(shapes)


def compiles_line(preset: str, seq_len: int, variant_name: str, attention_dropout: float | None) -> str:
    shapes, variants = kernel_compiles(preset, seq_len, variant_name, attention_dropout)
    per_kind = {kind: sum(1 for v in variants if v[0] == kind) for kind in ("forward", "dkdv", "dq")}
    listed = "; ".join(str(shape) for shape in sorted(shapes, key=lambda s: (-s.grad, -s.seq_len)))
    return (f"Triton kernel variants compiled per process before step 1: {len(variants)} (forward "
            f"{per_kind['forward']}, dK/dV {per_kind['dkdv']}, dQ {per_kind['dq']}) for {len(shapes)} shapes: {listed}")
