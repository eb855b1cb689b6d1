"""jobs.finetuning.tune, the Tune machinery of the sweep and of few-shot: what a trial asks Ray for, through
each job's own path, and the one --gpus-per-trial flag both commands take."""

from __future__ import annotations

import pytest
import ray
from ray import tune

from helpers import empty_store

from jobs.finetuning import fewshot, sweep
from jobs.finetuning.tune import GPU_SHARE, ParentRun, trial_resources

GPU_CLUSTER = {"CPU": 16.0, "GPU": 1.0}


def test_trials_share_a_gpu_where_the_cluster_has_one_and_ask_none_elsewhere():
    assert trial_resources(1.0, None, cluster=GPU_CLUSTER) == {"cpu": 1.0, "gpu": GPU_SHARE}
    assert trial_resources(2.0, None, cluster={"CPU": 16.0}) == {"cpu": 2.0}
    assert trial_resources(1.0, 0.5, cluster={"CPU": 16.0}) == {"cpu": 1.0, "gpu": 0.5}  # asked for: asked for
    assert trial_resources(1.0, 0.0, cluster=GPU_CLUSTER) == {"cpu": 1.0}  # --gpus-per-trial 0: CPU only


def _few_shot_job(opts_gpus: float | None, tmp_path) -> None:
    opts = fewshot.FewShotOptions(source="unused", gpus_per_trial=opts_gpus)
    configs = [{"task": "t", "method": "head", "lr": 1e-3, "split": 13}]
    fewshot._tune(opts, configs, {"t/13": "data"}, None, _parent(tmp_path), str(tmp_path / "ray"))


def _sweep_job(opts_gpus: float | None, tmp_path) -> None:
    opts = sweep.SweepOptions(source="unused", gpus_per_trial=opts_gpus, storage=str(tmp_path / "ray"))
    point = {"task": "t", "lr": 1e-3, "batch_size": 16, "epochs": 1, "warmup": 0.1}
    plan = sweep._Plan(encoder=None, pretraining_run="", encoded={"t": "data"}, points=[point], params={}, notes="")
    sweep._tune(opts, plan, [{"point": point, "seed": 0}], _parent(tmp_path))


def _parent(tmp_path) -> ParentRun:
    return ParentRun(empty_store(tmp_path), "0", "parent")


@pytest.mark.parametrize("job", [_few_shot_job, _sweep_job], ids=["fewshot", "sweep"])
def test_each_jobs_trials_ask_for_a_gpu_on_a_cluster_with_one(job, ray_local, tmp_path, monkeypatch):
    """Few-shot once asked Ray for CPUs only, so Ray hid the GPUs from its trials. Both jobs now build their
    trials through the same machinery: on a (faked) GPU cluster each trial asks for a share of one."""
    asked = []
    with_resources = tune.with_resources
    monkeypatch.setattr(tune, "with_resources", lambda trainable, resources: asked.append(resources)
                        or with_resources(trainable, resources))
    monkeypatch.setattr(tune.Tuner, "fit", lambda self: [])  # the trials themselves are not the point here
    monkeypatch.setattr(ray, "cluster_resources", lambda: GPU_CLUSTER)
    job(None, tmp_path)
    job(0.0, tmp_path)
    assert asked == [{"cpu": 1.0, "gpu": GPU_SHARE}, {"cpu": 1.0}]


@pytest.mark.parametrize("module", [fewshot, sweep], ids=["fewshot", "sweep"])
def test_both_commands_take_gpus_per_trial(module, monkeypatch):
    monkeypatch.setattr(module, "run", lambda opts: opts)
    opts = module.main(["--from", "last", "--gpus-per-trial", "0.5", "--cpus-per-trial", "2"])
    assert (opts.gpus_per_trial, opts.cpus_per_trial) == (0.5, 2.0)
    assert module.main(["--from", "last"]).gpus_per_trial is None  # default: a share where there are GPUs
