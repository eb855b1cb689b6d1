"""What this process learned about the attention kernels: which configurations were probed, which run,
why the others were given up, and the shapes a plan collects (`KernelProbes`).

One `KernelProbes` belongs to the process's `model.backends.BACKENDS` and lives as long as the process
(a probe's answer holds for this device and this torch); `reset()` forgets everything, which the tests
do to start from an empty memory.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Hashable, Iterator

import torch

# A problem the Triton kernel is probed for (`model.backends.fused.TritonShape`): anything hashable
# whose str() names it in a warning.
Shape = Hashable


def failure_cause(error: Exception) -> str:
    """An exception as a warning or a log names it: its type and first line."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def own_random_state(device: torch.device) -> contextlib.AbstractContextManager:
    """Torch's random state (CPU, and `device`'s where it is a GPU) put back on exit: a probe draws its
    random inputs and its dropout seeds without moving the stream a seeded run draws from, so a run gives
    the same numbers whether or not a probe ran before its first call."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


class KernelProbes:
    """The memory of flex's and the Triton kernel's probes in one process, and of the plans in progress."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every probe, failure and plan: the next pass probes again, from an empty memory."""
        self._flex_checked: dict[tuple, bool] = {}
        self._flex_failure: str | None = None  # the cause, once flex failed: every later check answers False
        self._triton_checked: dict[Shape, bool] = {}
        self._triton_failures: dict[Shape, str] = {}  # shape -> why the kernel does not run there
        self._plans: list[set[Shape]] = []  # while `planning()`: the shapes the kernel would be probed at

    def flex_works(self, key: tuple, probe: Callable[[], None]) -> bool:
        """Whether compiled flex runs for the configuration `key`: `probe()` once per key, and after the
        first failure never again. A failure warns once, naming the cause, and SDPA takes over: a GPU
        run never dies because a kernel config does not fit (tiles over a GPU's shared memory, say, or a
        torch version whose kernel options differ)."""
        if self._flex_failure is not None:
            return False
        if key not in self._flex_checked:
            try:
                probe()
                self._flex_checked[key] = True
            except Exception as error:  # inductor, Triton and CUDA raise many types; all mean "not here"
                self._flex_failure = failure_cause(error)
                self._flex_checked[key] = False
                warnings.warn(f"FlexAttention does not run on this device ({self._flex_failure}); attention uses "
                              "SDPA from here on in this process", RuntimeWarning, stacklevel=3)
        return self._flex_checked[key]

    def flex_failure(self) -> str | None:
        """Why flex was given up in this process, or None while it works (or was never tried)."""
        return self._flex_failure

    def triton_works(self, shape: Shape, probe: Callable[[], None]) -> bool:
        """Whether the Triton kernel runs at `shape`: `probe()` once per shape, eagerly. A failure there (in
        compile, tuning, forward or backward) warns once, naming the shape and the cause, and that shape runs
        `fallback_attention` from then on in this process; every other shape keeps the kernel."""
        if shape not in self._triton_checked:
            try:
                probe()
                self._triton_checked[shape] = True
            except Exception as error:  # Triton, its compiler and CUDA raise many types; all mean "not here"
                self._triton_checked[shape] = False
                self._triton_failures[shape] = failure_cause(error)
                warnings.warn(f"the Triton attention kernel does not run at {shape} ({self._triton_failures[shape]}); "
                              "that shape uses flex (no attention dropout active) or SDPA (dropout active) from here "
                              "on in this process, the others keep the kernel", RuntimeWarning, stacklevel=3)
        return self._triton_checked[shape]

    def triton_probed(self, shape: Shape) -> bool:
        """Whether the Triton kernel was probed at `shape` and runs there, without probing: what a compiled
        step asks while it is traced, when no probe can run. A shape first met there was not warmed up before
        the step was compiled (`model.step.TrainingStep.warm_up`): it falls back, recorded but not warned
        about (a warning would break the graph); `model.encoder.attention_fallbacks` names it."""
        if shape not in self._triton_checked:
            self._triton_checked[shape] = False
            self._triton_failures[shape] = "not probed before the step was compiled (no eager warm-up met this shape)"
        return self._triton_checked[shape]

    def triton_checked(self) -> dict[Shape, bool]:
        """Every shape the Triton kernel was probed (or asked about) at, and whether it runs there."""
        return dict(self._triton_checked)

    def triton_failures(self) -> dict[Shape, str]:
        """Every shape at which the Triton kernel was given up in this process, with the cause."""
        return dict(self._triton_failures)

    @contextlib.contextmanager
    def planning(self) -> Iterator[set[Shape]]:
        """Yields the set of every `model.backends.fused.TritonShape` the encoders' passes meet inside the block, on any device,
        without probing or running the Triton kernel (they run its fallback): what
        `model.backends.fused.kernel_variants` counts for `python -m bench --compiles`."""
        shapes: set[Shape] = set()
        self._plans.append(shapes)
        try:
            yield shapes
        finally:
            self._plans.pop()

    def planned(self, shape: Shape) -> bool:
        """Inside `planning()`: records `shape` and answers True (the caller then runs the fallback)."""
        if self._plans:
            self._plans[-1].add(shape)
        return bool(self._plans)
