"""What a Ray Tune trial actor runs around a job's trial: the trainable both fine-tuning jobs hand to Tune
(`in_actor`: the actor's threads, then the fault hook, then the trial).

A new trial actor imports the modules of everything it unpickles: this one, the job's trial module
(`trial.py` for the sweep, `fewshot_trial.py` for few-shot), `jobs.pretraining.pretrained` for the encoder,
and the trial's name function. Those stay light by rule (tests/test_layout.py): torch, Ray Tune, the model and
the tasks' scoring, never MLflow, transformers or the hub, which the driver alone uses and which took 3 s more
of every actor's start. How the trials are placed, retried and tracked is the driver's `tune.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import torch

from jobs import faults
from jobs.pretraining.pretrained import PretrainedEncoder

Trial = Callable[[dict[str, Any], dict[str, ray.ObjectRef], PretrainedEncoder], None]  # (config, data, encoder)


def in_actor(config: dict[str, Any], trial: Trial, name_of: Callable[[dict[str, Any]], str],
             data: dict[str, ray.ObjectRef], encoder: PretrainedEncoder, settings: dict[str, Any]) -> None:
    """A Tune function trainable: the trial, with the actor's threads set and the fault hook passed first."""
    torch.set_num_threads(settings["threads"])
    maybe_inject_failure(name_of(config), settings)
    trial(config, data, encoder)


def maybe_inject_failure(name: str, settings: dict[str, Any]) -> None:
    """Fault injection for tests (jobs.faults): the trial fails its first N attempts."""
    faults.fail_first_attempts(Path(settings["marker_dir"]), name, settings["inject_failures"].get(name, 0))
