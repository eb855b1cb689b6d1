"""The one way the jobs start or join Ray, and how quiet Ray Data is."""

from __future__ import annotations

import logging
import os
import sys

import ray
import ray.data

from jobs.env import set_hermetic_env


def init_ray(num_cpus: float | None = None, dashboard: bool = False) -> None:
    """Join the cluster in RAY_ADDRESS (set by `ray job submit`), else start a local one; no-op if up."""
    set_hermetic_env()
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init()  # resources belong to the cluster: passing num_cpus here is an error
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=dashboard)
    quiet_ray_data(sys.stdout.isatty())


def quiet_ray_data(interactive: bool) -> None:
    """Ray Data's progress bars and execution banners on a terminal only. Without one (`ray job
    submit`, CI, nohup) each bar refresh becomes log lines: a third of a short run's output. Set on
    the driver before any dataset is made, since a dataset carries a copy of this context to the
    processes that execute it; the jobs print their own progress lines either way."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = interactive
    context.print_on_execution_start = interactive
    logging.getLogger("ray.data").setLevel(logging.INFO if interactive else logging.WARNING)  # tips, plans
