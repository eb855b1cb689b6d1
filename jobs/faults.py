"""Fault injection for the recovery tests, kept out of every experiment config.

A test sets `COCOLM_INJECT_FAULTS` (JSON) in the driver's environment; the driver reads it once and
hands the plan to its workers, so it never becomes a config field or an MLflow parameter:

    {"pretraining_step": 12}            rank 0 of the pretraining loop dies once, at step 12
    {"storage_error_step": 10}          the pretraining checkpoint of step 10 cannot be written (as a full disk)
    {"trials": {"<trial name>": 2}}     that fine-tuning trial fails its first 2 attempts
    {"interrupt_after_trials": 1}       the fine-tuning driver gets a Ctrl-C (SIGINT) once 1 trial ended

Attempts are counted with marker files in a directory of the run's storage, which outlives the
processes that die.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from jobs.cli import UserError

ENV = "COCOLM_INJECT_FAULTS"


@dataclass(frozen=True)
class Faults:
    pretraining_step: int = 0  # 0: the pretraining loop never dies
    storage_error_step: int = 0  # 0: every pretraining checkpoint is written
    trials: dict[str, int] = field(default_factory=dict)  # trial name -> attempts that fail
    interrupt_after_trials: int = 0  # fine-tuning: Ctrl-C the driver once this many trials ended; 0 = never


def planned() -> Faults:
    raw = os.environ.get(ENV, "")
    if not raw:
        return Faults()
    try:
        return Faults(**json.loads(raw))
    except (TypeError, ValueError) as error:
        raise UserError(f"{ENV}={raw!r} is not a fault plan ({error}); see jobs/faults.py") from error


def fail_first_attempts(markers: Path, name: str, attempts: int) -> None:
    """Raise on each of `name`'s first `attempts` calls (counted across processes by marker files)."""
    if not attempts:
        return
    markers.mkdir(parents=True, exist_ok=True)
    done = len(list(markers.glob(f"{name}.*")))
    if done < attempts:
        (markers / f"{name}.{done}").touch()
        raise RuntimeError(f"injected failure {done + 1} of {attempts} for {name}")
