"""jobs.env: the process settings every job starts with."""

import logging
import os

import ray.data

from jobs.env import HERMETIC_ENV, set_hermetic_env
from jobs.ray_session import quiet_ray_data


def test_ray_data_shows_progress_bars_on_a_terminal_only():
    context = ray.data.DataContext.get_current()
    saved = context.enable_progress_bars, context.print_on_execution_start, logging.getLogger("ray.data").level
    try:
        quiet_ray_data(interactive=False)  # ray job submit, CI, nohup: bar frames would flood the log
        assert not context.enable_progress_bars and not context.print_on_execution_start
        assert logging.getLogger("ray.data").level == logging.WARNING  # no tips or execution plans
        quiet_ray_data(interactive=True)
        assert context.enable_progress_bars and context.print_on_execution_start
    finally:
        context.enable_progress_bars, context.print_on_execution_start = saved[:2]
        logging.getLogger("ray.data").setLevel(saved[2])


def test_hermetic_env_never_overrides_a_users_value(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    set_hermetic_env()
    assert os.environ["PYTHONWARNINGS"] == "default"
    assert {"HF_HUB_OFFLINE", "PYTHONWARNINGS", "RAY_DEDUP_LOGS_SKIP_REGEX"} <= set(HERMETIC_ENV)


def test_the_worker_lines_the_driver_drops_are_only_rays_own_noise():
    import re

    skip = re.compile(HERMETIC_ENV["RAY_DEDUP_LOGS_SKIP_REGEX"])
    dropped = [
        "[2026-11-22 21:13:02,079 E 15530 15566] core_worker.cc:2465: Actor with class name: 'PreemptionWatcher' "
        "and ID: '9385a92d' has constructor arguments in the object store and max_restarts > 0",
        "/x/ray/data/_internal/execution/interfaces/execution_options.py:436: RayDeprecationWarning: "
        "`ExecutionOptions.exclude_resources` is deprecated and will be removed",
        "  self.exclude_resources = exclude_resources",
    ]
    kept = ["step 10/20 | loss 54.435 | aux_mlm 8.288 copy 0.674 | lr 1.00e-04 | 11,000 tok/s | 0m12s left",
            "resumed from /tmp/x/checkpoint_step_00000010 at step 10", "Traceback (most recent call last):",
            "RuntimeError: checkpoint belongs to MLflow run a, not b"]
    assert all(skip.search(line) for line in dropped)
    assert not any(skip.search(line) for line in kept)
