"""Hermetic process settings, set when the `jobs` package is imported: before ray and transformers are."""

from __future__ import annotations

import os

# Quiet and offline by default; a user's own value always wins (setdefault). Ray's token
# authentication is left to Ray on purpose (docs/design.md section 8): a local Ray started by a job
# turns it on and uses Ray's own token (`ray get-auth-token`); nothing here may switch it off.
HERMETIC_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",  # read by huggingface_hub at import: set before importing transformers
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "TOKENIZERS_PARALLELISM": "false",  # Ray already runs one task per (fraction of a) core
    # Ray's own deprecation warnings (raised inside Ray Train and Ray Data, not by our calls) reach
    # every user's console through the workers; they are for Ray's developers.
    "PYTHONWARNINGS": "ignore::DeprecationWarning",
    # Tune adds a TensorBoard logger (and prints "To visualize your results with TensorBoard") unless
    # this is set; the sweep passes Tune's CSV and JSON result loggers itself, which its ResultGrid reads.
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # Worker lines the driver never prints (Ray reads this when ray is imported: jobs/__init__.py sets
    # the environment first): an error-level line Ray Train's own PreemptionWatcher actor triggers on
    # every run, and Ray Data's deprecation warning (two lines) from inside Ray Train's dataset manager.
    "RAY_DEDUP_LOGS_SKIP_REGEX": (r"PreemptionWatcher.*constructor arguments in the object store|"
                                  r"RayDeprecationWarning|^\s*self\.exclude_resources = exclude_resources\s*$|"
                                  # and Ray Data's note, from each dataset's coordinator, that its bars are off
                                  r"Progress bars disabled\. To enable"),
}


def set_hermetic_env() -> None:
    for key, value in HERMETIC_ENV.items():
        os.environ.setdefault(key, value)
