"""The pretraining step: the one function both the Ray Train worker loop and `bench` time.

Plain PyTorch (no Ray, no MLflow), so a GPU machine with only torch installed runs exactly the step
the job runs: bf16 autocast on CUDA, backward of each micro-batch scaled by 1/accumulation (DDP's
all-reduce skipped on all but the last), gradient clipping, the paper's AdamW (fused) and
the warm-up / linear-decay schedule. A non-finite gradient norm skips the update, so the weights
and the last checkpoint stay good; the caller reads the norms at its next log line (`Interval`) and
stops. Nothing in a step makes the host wait for the device, given a batch from
`model.objective.to_device`: the host queues the next step while the GPU still runs this one.
With fixed shapes the forward can be compiled whole (`compile_step`) and, on CUDA, replayed as
CUDA graphs (`TrainingStep(cuda_graphs=True)`).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn

from .backends import BACKENDS, own_random_state
from .encoder import PASS_KINDS, Encoder
from .objective import PretrainingOutput


@dataclass(frozen=True)
class AdamW:
    """The paper's AdamW settings, declared once: the pretraining, fine-tuning and few-shot configs embed
    it (`train.adamw.*` in a preset). Weight decay applies to weight matrices only (`param_groups`)."""

    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6

    def build(self, model: nn.Module, lr: float, position_bias_lr_scale: float = 1.0,
              fused: bool | None = None) -> torch.optim.AdamW:
        """AdamW over `param_groups(model)` at learning rate `lr`."""
        groups = param_groups(model, self.weight_decay, position_bias_lr_scale, lr)
        return torch.optim.AdamW(groups, lr=lr, betas=(self.beta1, self.beta2), eps=self.eps, fused=fused)


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW and its schedule (the paper's base setting; the job fills it from `train.*`)."""

    peak_lr: float = 5e-4
    warmup_steps: int = 10_000
    max_steps: int = 125_000
    adamw: AdamW = field(default_factory=AdamW)
    clip_norm: float = 2.0
    # Learning rate of the relative position bias tables, as a multiple of the others' (1: the paper's
    # one learning rate). Adam moves each table entry by about the learning rate per step, and a key
    # attended to among T needs a bias of about ln T to stand out, so at lr 2e-3 the tables alone take
    # ~2,000 steps to make attention local: the unigram plateau of small models (docs/design.md 5.4).
    position_bias_lr_scale: float = 1.0


def param_groups(model: nn.Module, weight_decay: float, position_bias_lr_scale: float = 1.0,
                 peak_lr: float = 1.0) -> list[dict]:
    """Weight decay on weight matrices only: never on biases and LayerNorms (the 1-D parameters), nor on
    the relative position bias tables, which are biases however they are stored; the tables get their
    own group at `position_bias_lr_scale` x `peak_lr` when the scale is not 1."""
    decay, no_decay, position = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if "relative_bias" in name and position_bias_lr_scale != 1:
            position.append(p)
        else:
            (no_decay if p.ndim < 2 or "relative_bias" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if position:
        groups.append({"params": position, "weight_decay": 0.0, "lr": peak_lr * position_bias_lr_scale})
    return groups


def warmup_linear_decay(warmup: int, total: int) -> Callable[[int], float]:
    """LR multiplier: linear warm-up to the peak over `warmup` steps, then linear decay to 0 at `total`."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return factor


def build_optimizer(
    model: nn.Module, cfg: OptimizerConfig, device: torch.device
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `param_groups` and its schedule. Fused (one kernel for all parameters, on CUDA and
    CPU alike), because only the fused kernel can skip a non-finite update without the host reading
    the gradient norm (`TrainingStep.update`)."""
    optimizer = cfg.adamw.build(model, cfg.peak_lr, cfg.position_bias_lr_scale, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(cfg.warmup_steps, cfg.max_steps))
    return optimizer, scheduler


# `train.compile_step`: off, or torch.compile's mode for the whole step ("reduce-overhead": CUDA graphs).
STEP_COMPILE_MODES = ("off", "default", "reduce-overhead")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX tiles), where `train.bf16_on_cpu` pays;
    elsewhere oneDNN emulates bf16 and the step runs slower than in fp32. torch's probes are private, so a
    torch without them answers False (the job then only warns)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def step_precision(device: torch.device, bf16: bool, bf16_on_cpu: bool) -> str:
    """What a pretraining step computes in: "bf16" (autocast) or "fp32". On CUDA, `bf16`; on a CPU, only
    where `bf16_on_cpu` asks for it and the CPU multiplies bf16 natively: without AVX512-BF16 or AMX,
    oneDNN emulates bf16 and a study-cpu step takes about 10x as long as in fp32 (an AVX2-only Zen 3:
    4,960 ms against 523, `python -m bench --preset study-cpu --seq-len 64 --batch-size 32 --variant clm_only
    [--cpu-bf16]`, 1 thread), so the job and the curve probe run fp32 there and say so."""
    if device.type == "cuda":
        return "bf16" if bf16 else "fp32"
    return "bf16" if bf16 and bf16_on_cpu and cpu_has_native_bf16() else "fp32"


def fp32_fallback_note(device: torch.device, bf16: bool, bf16_on_cpu: bool) -> str:
    """The one line the job and the curve probe print where `bf16_on_cpu` asked for bf16 and
    `step_precision` ran fp32 instead, else ''."""
    if device.type != "cpu" or not (bf16 and bf16_on_cpu) or step_precision(device, bf16, bf16_on_cpu) == "bf16":
        return ""
    return ("train.bf16_on_cpu: this CPU has no native bf16 (AVX512-BF16 or AMX), where bf16 is emulated and a "
            "step takes about 10x as long, so the step runs in fp32")


def compile_step(model: nn.Module, mode: str, backend: str = "inductor") -> None:
    """`torch.compile` the whole pretraining forward in place, as one graph (`fullgraph=True`): both
    encoders, the sampling, the heads and the losses; the backward follows through AOT autograd. Needs
    fixed shapes (`model.objective.to_device(..., fixed_rate=...)`): a batch's masked-position count
    would otherwise be a new shape, so a new compilation, per batch. Randomness is drawn from torch's
    generator on every call (dropout, sampling, the Triton kernel's seed tensor), never baked into the
    graph; a `torch.Generator` argument is for eager runs only. `Module.compile` leaves the
    `state_dict` keys as they are. `backend` is torch.compile's; `mode` applies to inductor only
    ("aot_eager" in the CPU tests: no C++ toolchain)."""
    if mode not in STEP_COMPILE_MODES:
        raise ValueError(f"unknown step compile mode {mode!r}; choose one of {STEP_COMPILE_MODES}")
    if mode == "off":
        return
    for encoder in (m for m in model.modules() if isinstance(m, Encoder)):
        # Each encoder records the attention that ran in a dict (`Encoder.attention_ran`); dynamo guards
        # on its keys, so a first trace with the dict still empty would compile the step twice.
        for kind in PASS_KINDS:
            encoder.attention_ran.setdefault(kind, "")
    options = {"mode": mode} if backend == "inductor" else {}
    model.compile(fullgraph=True, dynamic=False, backend=backend, **options)


@dataclass
class Interval:
    """Sums over one log interval, kept as device tensors so a micro-batch costs no device sync;
    turned into means (NaN entries, such as an accuracy over an empty set, left out) when logged.
    Also each optimizer step's gradient norm, read all at once by `nonfinite`."""

    started: float = field(default_factory=time.perf_counter)
    steps: int = 0
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    counts: dict[str, torch.Tensor] = field(default_factory=dict)
    grad_norms: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    def record(self, step: int, grad_norm: torch.Tensor) -> None:
        """One optimizer step of the interval, numbered `step`, with its norm (left on the device)."""
        self.steps += 1
        self.grad_norms.append((step, grad_norm))

    def nonfinite(self) -> list[tuple[int, float]]:
        """(step, norm) of every step so far whose gradient norm was not finite, so its update was
        skipped: one host wait for the whole interval."""
        if not self.grad_norms:
            return []
        norms = torch.stack([norm for _, norm in self.grad_norms]).tolist()
        return [(step, norm) for (step, _), norm in zip(self.grad_norms, norms) if not math.isfinite(norm)]

    def add(self, values: dict[str, torch.Tensor]) -> None:
        for key, value in values.items():
            present = ~torch.isnan(value)
            self.sums[key] = self.sums.get(key, 0.0) + torch.where(present, value, 0.0)
            self.counts[key] = self.counts.get(key, 0.0) + present.float()

    def means(self) -> dict[str, float]:
        keys = list(self.sums)
        sums, counts = (torch.stack([d[k] for k in keys]).tolist() for d in (self.sums, self.counts))
        return {key: total / count for key, total, count in zip(keys, sums, counts) if count}


@dataclass
class StepResult:
    """One optimizer step: each micro-batch's values (detached, on the device) and the gradient norm
    before clipping, on the device; where it is not finite, the update was skipped."""

    values: list[dict[str, torch.Tensor]]
    grad_norm: torch.Tensor


class TrainingStep:
    """Forward, backward, clip and update for one optimizer step over `accumulation` micro-batches.

    `model` maps a batch dict to a `PretrainingOutput` (or to a loss tensor, as the benchmark's
    transformers peers do); it may be DDP-wrapped, in which case `no_sync` skips the all-reduce on
    all micro-batches but the last. `parameters` are the ones to clip (the unwrapped model's).
    """

    def __init__(
        self, model: Callable[[dict[str, torch.Tensor]], PretrainingOutput | torch.Tensor],
        parameters: Iterable[nn.Parameter], optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None, device: torch.device, *,
        clip_norm: float, accumulation: int = 1, bf16: bool = True, bf16_on_cpu: bool = False,
        cuda_graphs: bool = False,
    ):
        if cuda_graphs and accumulation > 1:
            # CUDA graph trees hand a gradient buffer of one replay to .grad, and the next micro-batch's
            # replay overwrites it (pytorch/pytorch#169545): gradients would be wrong or the step fail.
            raise ValueError("a step replayed as CUDA graphs (compile mode reduce-overhead) takes one micro-batch "
                             f"per optimizer step, not {accumulation}: raise data.batch_size, or compile with 'default'")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.cuda_graphs = cuda_graphs
        self.parameters = [p for p in parameters if p.requires_grad]
        self.clip_norm, self.accumulation = clip_norm, accumulation
        # bf16 autocast on CUDA; on a CPU only when asked (`bf16_on_cpu`): tests and laptops stay fp32, while
        # a CPU with native bf16 dot products (AVX512-BF16, AMX) runs a study-cpu step 1.5x faster so.
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16,
                                       enabled=bf16 and (device.type == "cuda" or bf16_on_cpu))
        self.device = device
        self._no_sync = getattr(model, "no_sync", None)
        if not all(group.get("fused") for group in optimizer.param_groups):
            raise ValueError("TrainingStep needs a fused optimizer (model.step.build_optimizer): only the fused "
                             "kernel skips a non-finite update without the host reading the gradient norm")

    def warm_up(self, batch: dict[str, torch.Tensor], module: nn.Module) -> bool:
        """Run `module`'s forward (the unwrapped, uncompiled forward: `module.forward`) once eagerly on
        `batch`, under the step's autocast, where the attention kernels are probed (a GPU): each encoder
        pass probes its attention at its shape before any compiled step is traced (a probe cannot run
        while dynamo traces), tunes the Triton kernel there (so CUDA graph capture never meets a shape
        to tune) and falls back per shape where it fails (`model.backends.AttentionBackends.choose`). Torch's
        random state is put back afterwards: the run draws what it would have drawn without it.

        Under torch.distributed, rank 0 warms up first, alone; the others wait at a barrier and then warm
        up too, reading rank 0's tuning from Triton's on-disk autotuning cache instead of timing the
        tiles again (and so picking the same ones). Returns whether a warm-up ran here: not where
        nothing is probed (CPU) nor for a module without our encoders (the benchmark's peers)."""
        if not BACKENDS.probes_on(self.device) or not any(isinstance(m, Encoder) for m in module.modules()):
            return False
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        first = not distributed or torch.distributed.get_rank() == 0
        if first:
            self._forward_once(batch, module)
        if distributed:
            torch.distributed.barrier()
            if not first:
                self._forward_once(batch, module)
        return True

    def _forward_once(self, batch: dict[str, torch.Tensor], module: nn.Module) -> None:
        with own_random_state(self.device), self.autocast:
            module.forward(batch)  # not module(batch): a compiled module would trace here

    def micro_batch(self, batch: dict[str, torch.Tensor], last: bool) -> dict[str, torch.Tensor]:
        """Forward and backward of one micro-batch (gradients accumulate); its values, still on the device."""
        skip_all_reduce = not last and self._no_sync is not None
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are dead from here on
        with (self._no_sync() if skip_all_reduce else contextlib.nullcontext()), self.autocast:
            out = self.model(batch)
            loss = out.loss if isinstance(out, PretrainingOutput) else out
            (loss / self.accumulation).backward()
        values = out.values() if isinstance(out, PretrainingOutput) else {"loss": loss.detach().float()}
        # A replayed graph's outputs live in memory the next replay overwrites; the values outlive it.
        return {k: v.clone() for k, v in values.items()} if self.cuda_graphs else values

    def update(self) -> torch.Tensor:
        """Clip, step the optimizer and the schedule, clear the gradients; returns the norm before
        clipping, on the device.

        Where the norm is not finite, the fused kernel leaves the weights and Adam's moments and step
        count as they were (`found_inf`, as torch's GradScaler uses it), decided on the device, so the
        host never waits here. The schedule moves on regardless: callers stop at their next check
        (`Interval.nonfinite`). The norm is identical on every rank after DDP's all-reduce.
        """
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.clip_norm)
        self.optimizer.found_inf = (~torch.isfinite(grad_norm)).float()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def __call__(self, batches: Iterable[dict[str, torch.Tensor]]) -> StepResult:
        """One optimizer step over `accumulation` micro-batches."""
        batches = list(batches)
        if len(batches) != self.accumulation:
            raise ValueError(f"a step takes {self.accumulation} micro-batches, got {len(batches)}")
        values = [self.micro_batch(b, last=i == len(batches) - 1) for i, b in enumerate(batches)]
        return StepResult(values, self.update())
