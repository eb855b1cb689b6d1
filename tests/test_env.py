"""jobs.env: the process settings every job starts with."""

import logging
import os

import ray.data

from jobs.env import HERMETIC_ENV, quiet_ray_data, set_hermetic_env


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
    assert {"HF_HUB_OFFLINE", "PYTHONWARNINGS", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"} <= set(HERMETIC_ENV)
