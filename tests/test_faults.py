"""Faults: the fault-injection hook of the recovery tests (read from the environment, never from a config),
and what a crash leaves in storage."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from helpers import empty_store

from jobs import faults
from jobs.pretraining import checkpoint
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


# ----------------------------------------------------------------------------- torn checkpoints

def tiny_checkpoints(storage: Path, run_name: str, steps: tuple[int, ...]) -> Path:
    """Checkpoints of one run as the loop writes them (real torch.save'd files, each with its manifest), and
    Ray Train's snapshot recording them, the last the latest: what a resume finds in storage."""
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import (_CheckpointManagerState,
                                                                                 _TrainingResultState)

    from jobs.pretraining.config import to_yaml, with_vocab_size
    from jobs.pretraining.loop import build_training

    cfg = with_vocab_size(resolve("tiny", "cocolm", ["model.hidden_size=32", "model.ffn_size=64",
                                                     "model.num_layers=1"]), 300)
    model, optimizer, scheduler = build_training(cfg)
    results = []
    for step in steps:
        name = checkpoint.directory_name(step)
        checkpoint.save(storage / run_name / name, model, optimizer, scheduler,
                        checkpoint.TrainState(step=step, mlflow_run_id="run-a"), to_yaml(cfg), None)
        results.append(_TrainingResultState(checkpoint_dir_name=name, metrics={"step": step}))
    snapshot = _CheckpointManagerState(
        checkpoint_results=results, checkpoint_report_indices=list(range(len(steps))),
        latest_checkpoint_result=results[-1], pending_training_results=[], pending_validation_specs=[],
        current_report_index=len(steps), validated_checkpoint_dir_names=[],
        timed_out_validation_checkpoint_dir_names=[], failed_validation_checkpoint_dir_names=[])
    (storage / run_name / CHECKPOINT_MANAGER_SNAPSHOT_FILENAME).write_text(snapshot.json())
    return storage / run_name


def ray_resumes_from(storage: Path, run_name: str) -> str:
    """The checkpoint folder Ray Train 2.60 gives a resumed run's workers (ray.train.get_checkpoint)."""
    from ray.train import CheckpointConfig
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import CheckpointManager
    from ray.train.v2._internal.execution.storage import StorageContext

    manager = CheckpointManager(CheckpointConfig(), StorageContext(str(storage), run_name))
    manager._assert_checkpoints_exist()  # what Ray checks when the run restarts
    return Path(manager.latest_checkpoint_result.checkpoint.path).name


def tear(path: Path, how: str) -> None:
    if how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "delete":
        path.unlink()
    else:  # garbage of the same size: only the hash tells
        path.write_bytes(bytes(random.Random(0).getrandbits(8) for _ in range(path.stat().st_size)))


def test_a_torn_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_newest_intact_one(tmp_path, capsys):
    template = tiny_checkpoints(tmp_path / "template", "run", (20, 40, 60))
    newest = template / checkpoint.directory_name(60)
    names = sorted(p.relative_to(newest).as_posix() for p in newest.rglob("*") if p.is_file())
    assert {"model.pt", "optimizer.pt", "state.json", checkpoint.MANIFEST} <= set(names)
    for name in names:
        for how in ("truncate", "delete", "garbage"):
            storage = tmp_path / f"{name}-{how}"
            shutil.copytree(template, storage / "run")
            tear(storage / "run" / checkpoint.directory_name(60) / name, how)
            chosen = checkpoint.newest_intact(str(storage), "run")
            assert chosen == str(storage / "run" / checkpoint.directory_name(40)), (name, how)
            assert ray_resumes_from(storage, "run") == checkpoint.directory_name(40), (name, how)
            line = capsys.readouterr().out.strip()
            assert "\n" not in line and line.startswith(f"skipping checkpoint {storage}/run/checkpoint_step_00000060: ")
            assert (storage / "run" / f"{checkpoint.TORN_PREFIX}checkpoint_step_00000060" / "state.json").exists() \
                or name == "state.json"
    # An intact run is left as it is, silently.
    assert checkpoint.newest_intact(str(template.parent), "run") == str(newest)
    assert ray_resumes_from(template.parent, "run") == newest.name and capsys.readouterr().out == ""


def test_checkpoints_from_before_manifests_are_judged_by_loading_them(tmp_path, capsys):
    run = tiny_checkpoints(tmp_path, "run", (20, 40))
    for manifest in run.glob(f"*/{checkpoint.MANIFEST}"):
        manifest.unlink()
    assert checkpoint.newest_intact(str(tmp_path), "run") == str(run / checkpoint.directory_name(40))
    tear(run / checkpoint.directory_name(40) / "model.pt", "truncate")
    assert checkpoint.newest_intact(str(tmp_path), "run") == str(run / checkpoint.directory_name(20))
    assert "model.pt does not load" in capsys.readouterr().out


# ----------------------------------------------------------------------------- storage write errors

@pytest.mark.parametrize("error, named", [
    (OSError(28, "Error writing bytes to file. Detail: [errno 28] No space left on device"),  # pyarrow: no file
     "/s/run/checkpoint_step_00000005: Error writing bytes to file. Detail: [errno 28] No space left on device"),
    (PermissionError(13, "Permission denied", "/s/run/checkpoint_step_00000005/model.pt"),
     "/s/run/checkpoint_step_00000005/model.pt: Permission denied"),
])
def test_a_checkpoint_that_cannot_be_written_is_one_line_naming_storage_file_and_cause(monkeypatch, error, named):
    """A full disk under --storage was a traceback ("[repeated 2x across cluster]") naming neither. Now the
    line goes to every rank (Ray Train's broadcast from rank 0), and nothing is reported."""
    import ray.train

    from jobs.pretraining import loop
    from jobs.pretraining.config import to_yaml, with_vocab_size
    from jobs.pretraining.context import LoopContext

    cfg = with_vocab_size(resolve("tiny", "cocolm", ["model.hidden_size=32", "model.ffn_size=64",
                                                     "model.num_layers=1"]), 300)
    model, optimizer, scheduler = loop.build_training(cfg)

    def persist(*args):
        raise error

    broadcast = []
    monkeypatch.setattr(loop, "persist", persist)
    monkeypatch.setattr(loop, "broadcast_from_rank_zero", lambda data: broadcast.append(data) or data)
    monkeypatch.setattr(ray.train, "report", lambda *a, **k: pytest.fail("a checkpoint that was not written is reported"))
    ctx = LoopContext("run-a", "sqlite:///unused.db", "", storage="/s/run")
    failure = loop.save_and_report(model, optimizer, scheduler, checkpoint.TrainState(step=5), cfg, ctx, rank=0)
    line = f"the checkpoint could not be written to storage /s/run: {named}"
    assert failure == line and broadcast == [line]


def test_the_driver_ends_a_run_whose_checkpoint_cannot_be_written_with_that_line_and_a_rerun_starts_clean(
        monkeypatch, tmp_path):
    """The loop tags the run with the line and returns (every rank, together); the driver makes it the one
    error line, and the run ends FAILED with it. The same command run again (the storage fixed) resumes:
    an earlier attempt's stop is not this attempt's."""
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient

    from jobs.cli import UserError
    from jobs.names import STOP_TAG
    from jobs.pretraining import job

    line = "the checkpoint could not be written to storage /s/run: /s/run/checkpoint_step_00000005: No space left"
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id

    class Trainer:  # stands in for Ray Train: what the loop leaves behind, without starting workers
        stops_with = line

        def __init__(self, *args, **kwargs):
            pass

        def fit(self):
            assert STOP_TAG not in client.get_run(run_id).data.tags, "an earlier attempt's stop was kept"
            if self.stops_with:
                client.set_tag(run_id, STOP_TAG, self.stops_with)
            return SimpleNamespace(checkpoint=SimpleNamespace(path=str(tmp_path / "checkpoint_step_00000005")))

    monkeypatch.setattr(job, "TorchTrainer", Trainer)
    stream = SimpleNamespace(blocks=None, long_blocks=None, tokenizer_dir="", special=None)
    with pytest.raises(UserError, match=f"^{line}; free space or fix the storage"):
        job._fit(resolve("tiny"), stream, run_id, "run", uri, str(tmp_path))
    assert client.get_run(run_id).data.tags[STOP_TAG] == line
    Trainer.stops_with = ""
    assert job._fit(resolve("tiny"), stream, run_id, "run", uri, str(tmp_path)).endswith("checkpoint_step_00000005")
