"""What the pretraining driver hands each Ray Train worker besides the config: `LoopContext`.

A module of its own, light by rule (`tests/test_layout.py`): Ray Train's controller unpickles the loop's
config (Ray Train carries `train_loop_config` in its run context), so every module an object there comes
from is imported by the controller, on the head node, once per run. The config travels as plain data for
the same reason (`jobs.pretraining.job.loop_config`): `jobs.pretraining.loop` and `PretrainConfig`'s module
bring MLflow, the model's attention backends and triton, a core-second and about 115 MB per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model.config import SpecialTokens


@dataclass(frozen=True)
class LoopContext:
    """What the driver hands every worker besides the config."""

    run_id: str
    tracking_uri: str
    tokenizer_dir: str
    fail_at_step: int = 0  # fault injection (jobs.faults): rank 0 dies once at this step; 0 = never
    failure_marker: str = ""  # file whose existence means the injected failure already happened
    storage: str = ""  # the run's folder in checkpoint storage, named when a checkpoint cannot be written
    # `--init-from`: a Ray object ref of the `InitWeights` a new run starts from (the object store carries them
    # to workers on any node); None: a fresh initialisation
    init_weights: Any = None
    special: SpecialTokens = SpecialTokens()  # the tokenizer's ids (`Stream.special`): corruption and objective
    storage_error_step: int = 0  # fault injection (jobs.faults): this step's checkpoint write fails; 0 = never
