"""The attention backends beside the kernels: flex, our Triton kernel and the dense implementations
behind one interface (`AttentionBackends`; `BACKENDS` is the process's), with the probes, fallbacks and
per-shape plans. The model's attention itself is `model.attention`."""

from .dispatch import BACKENDS, AttentionBackends, fallback_attention, resolve_attention
from .probes import KernelProbes, own_random_state

__all__ = ["BACKENDS", "AttentionBackends", "KernelProbes", "fallback_attention", "own_random_state",
           "resolve_attention"]
