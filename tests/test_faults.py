"""The fault-injection hook of the recovery tests: read from the environment, never from a config."""

from __future__ import annotations

import json

import pytest

from jobs import faults
from jobs.pretraining.config import TrainConfig, resolve


def test_no_plan_means_no_faults_and_a_bad_plan_is_named(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.planned() == faults.Faults()
    monkeypatch.setenv(faults.ENV, json.dumps({"pretraining_step": 3, "trials": {"t-seed0": 2}}))
    assert faults.planned() == faults.Faults(pretraining_step=3, trials={"t-seed0": 2})
    monkeypatch.setenv(faults.ENV, json.dumps({"pretrain_step": 3}))
    with pytest.raises(ValueError, match="COCOLM_INJECT_FAULTS.*pretrain_step"):
        faults.planned()


def test_a_trial_fails_exactly_its_planned_attempts(tmp_path):
    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match=f"injected failure {attempt} of 2 for t-seed0"):
            faults.fail_first_attempts(tmp_path / "markers", "t-seed0", 2)
    faults.fail_first_attempts(tmp_path / "markers", "t-seed0", 2)  # the third attempt runs
    faults.fail_first_attempts(tmp_path / "markers", "t-seed1", 0)  # not planned: never fails


def test_fault_injection_is_not_an_experiment_setting():
    assert not any("fail" in name for name in TrainConfig.__dataclass_fields__ if name != "max_failures")
    assert not any("fail" in key and key != "train.max_failures" for key in resolve("tiny").flat())
