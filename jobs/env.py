"""Hermetic process settings and the one way the jobs start or join Ray."""

from __future__ import annotations

import os

# Quiet and offline by default; a user's own value always wins (setdefault).
HERMETIC_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",  # Ray 2.60 otherwise turns on token auth and writes ~/.ray
    "HF_HUB_OFFLINE": "1",  # read by huggingface_hub at import: set before importing transformers
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "TOKENIZERS_PARALLELISM": "false",  # Ray already runs one task per (fraction of a) core
}


def set_hermetic_env() -> None:
    for key, value in HERMETIC_ENV.items():
        os.environ.setdefault(key, value)


def init_ray(num_cpus: float | None = None, dashboard: bool = False) -> None:
    """Join the cluster in RAY_ADDRESS (set by `ray job submit`), else start a local one; no-op if up."""
    set_hermetic_env()
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()  # resources belong to the cluster: passing num_cpus here is an error
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=dashboard)
