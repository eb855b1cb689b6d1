"""The attention backends behind one interface: `AttentionBackends` (extending the model's
`model.attention.DenseAttention`) chooses the implementation of each encoder pass, probes the kernels
it may fall back from, builds the bias that pass reads and gives the function every layer calls.

- 'sdpa' and 'reference' read the model's dense additive mask (`model.attention`).
- 'flex' is FlexAttention (`model.backends.flex`), probed once per configuration on a GPU, with SDPA
  behind it.
- 'triton' is our fused kernel (`model.backends.fused`), probed per shape on a GPU, with what 'auto'
  picks behind each shape that fails.

'auto' (the default) picks what measured fastest on an H100 (docs/design.md 7.2): on CUDA flex while
no attention dropout is active and SDPA with it, SDPA elsewhere. Our kernel is chosen by name
('triton'): its three kernels take 1.25 ms per call at base (T 512, dropout 0.1), against SDPA's
1.88 ms, but the call as a whole took 2.04 ms and the COCO-LM step 134.1 ms against SDPA's 127.1 ms;
until the call is as fast as its kernels, 'auto' does not pick it.

`BACKENDS` is the process's instance; it owns what the probes learned (`KernelProbes`), for the life of
the process. The tests reset it with `BACKENDS.probes.reset()`.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..attention import (
    AttentionPass, DenseAttention, RelativePositionBias, check_attention_choice, reference_attention, sdpa_attention,
)
from .flex import device_flex_options, flex_bias, flex_relative_attention, probe_flex
from .fused import PROBE_BLOCKS, TritonShape, probe_triton, triton_bias, triton_relative_attention
from .probes import KernelProbes


def resolve_attention(choice: str, device: torch.device, dropout_active: bool) -> str:
    """The implementation to run for `choice`: 'auto' is `fallback_attention` (flex on CUDA without active
    attention dropout, SDPA otherwise: the fastest measured on an H100, this module's docstring); explicit 'flex'
    with active attention dropout is an error, never a silent drop. Where 'triton' fails at a shape, the
    encoder runs `fallback_attention` there."""
    check_attention_choice(choice)
    if choice == "auto":
        return fallback_attention(device, dropout_active)
    if choice == "flex" and dropout_active:
        raise ValueError(
            "flex attention has no attention dropout: set the model's attention_dropout to 0 "
            "(the fast path), evaluate in eval mode, or use 'sdpa'"
        )
    return choice


def fallback_attention(device: torch.device, dropout_active: bool) -> str:
    """'auto''s choice, and what runs where the Triton kernel does not: flex on CUDA while no attention
    dropout is active (itself probed, with SDPA behind it), SDPA otherwise."""
    return "flex" if device.type == "cuda" and not dropout_active else "sdpa"


# Where compiled flex and the Triton kernel can fail to build (tiles, shared memory, a Triton version)
# and are probed before first use.
PROBED_DEVICE_TYPES = ("cuda",)


class AttentionBackends(DenseAttention):
    """Every implementation, with the probes and fallbacks of flex and the Triton kernel."""

    def __init__(self, probed_device_types: tuple[str, ...] = PROBED_DEVICE_TYPES) -> None:
        self.probed_device_types = probed_device_types
        self.probes = KernelProbes()

    def probes_on(self, device: torch.device) -> bool:
        """Whether attention kernels are probed before they run on `device` (`probed_device_types`)."""
        return device.type in self.probed_device_types

    def choose(self, choice: str, request: AttentionPass) -> str:
        """`resolve_attention`, then the fallbacks: where the Triton kernel fails at this shape,
        `fallback_attention`; where compiled flex fails on this GPU, SDPA."""
        dropout_active = request.dropout_p > 0
        implementation = resolve_attention(choice, request.device, dropout_active)
        if implementation == "triton" and not self._triton_runs(request):
            implementation = fallback_attention(request.device, dropout_active)
        if implementation == "flex" and not self._flex_runs(request):
            implementation = "sdpa"
        return implementation

    def bias(self, implementation: str, request: AttentionPass, relative: RelativePositionBias | None,
             padding: torch.Tensor | None) -> object:
        """For 'triton' the bias per distance, (h, 2S + 1), and no (h, T, T) lookup at all; for 'flex' the
        BlockMask and the (h, T, T) table; else the additive mask. Built once, for all the layers."""
        if implementation == "triton":
            distance_bias = relative.by_distance(request.seq_len) if relative is not None else None
            return triton_bias(distance_bias, padding, None if request.grad else PROBE_BLOCKS, request.seq_len)
        if implementation == "flex":
            position_bias = relative(request.seq_len) if relative is not None else None
            bias_dtype = None if position_bias is None else position_bias.dtype
            options = device_flex_options(request.device, request.head_dim, request.dtype, bias_dtype)
            return flex_bias(padding, position_bias, options)
        return super().bias(implementation, request, relative, padding)

    def function(self, implementation: str) -> Callable[..., torch.Tensor]:
        return {"sdpa": sdpa_attention, "flex": flex_relative_attention, "triton": triton_relative_attention,
                "reference": reference_attention}[implementation]

    def fallbacks(self) -> str:
        """Every fallback of this process with its cause, or '' where there was none: the Triton kernel's per
        shape (flex or SDPA ran there instead) and flex's (SDPA ran instead)."""
        lines = [f"the Triton kernel at {shape} fell back to flex/SDPA ({cause})"
                 for shape, cause in self.probes.triton_failures().items()]
        if failure := self.probes.flex_failure():
            lines.append(f"flex fell back to SDPA ({failure})")
        return "; ".join(lines)

    def _flex_runs(self, request: AttentionPass) -> bool:
        """False when compiled flex fails on this GPU (checked once per process and configuration, then
        SDPA runs: `KernelProbes.flex_works`). CPU flex is torch's unfused reference path, and inside a
        compiled region the check has already run or cannot."""
        if not self.probes_on(request.device) or torch.compiler.is_compiling():
            return True
        r = request
        key = (str(r.device), r.heads, r.head_dim, r.dtype, r.relative)
        return self.probes.flex_works(key, lambda: probe_flex(r.device, r.heads, r.head_dim, r.dtype, r.relative))

    def _triton_runs(self, request: AttentionPass) -> bool:
        """False where the Triton kernel fails at this shape on this GPU (probed once per process and
        `TritonShape`, eagerly, then `fallback_attention` runs for that shape alone: `KernelProbes.triton_works`).
        Inside a compiled region no probe can run: a shape the eager warm-up did not meet falls back
        (`KernelProbes.triton_probed`). Inside `KernelProbes.planning` the shape is recorded and not run.
        Off CUDA it is not probed (on CPU it runs under Triton's interpreter or raises, naming why)."""
        r = request
        shape = TritonShape(str(r.device), r.heads, r.head_dim, r.dtype, r.relative, r.seq_len, r.padded, r.dropout_p,
                            r.grad)
        if self.probes.planned(shape):
            return False
        if not self.probes_on(request.device):
            return True
        if torch.compiler.is_compiling():
            return self.probes.triton_probed(shape)
        return self.probes.triton_works(shape, lambda: probe_triton(shape, request.batch, request.reach))


BACKENDS = AttentionBackends()
