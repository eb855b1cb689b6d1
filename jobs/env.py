"""Hermetic process settings, set when the `jobs` package is imported: before ray and transformers are."""

from __future__ import annotations

import os
import sys

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
    # How often Ray Train's controller polls its workers (2 s by default), which is also how soon it
    # sees a run end or a worker die: a finished 20-step tiny run waited 5.7 s from its last step to its
    # summary at 2 s, 1.1 s at 0.5 s. Read by the controller actor, so it reaches a local Ray this
    # process starts (a `ray start` cluster takes it from the shell that started it).
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    # Worker lines the driver never prints (Ray reads this when ray is imported: jobs/__init__.py sets
    # the environment first): an error-level line Ray Train's own PreemptionWatcher actor triggers on
    # every run, and Ray Data's deprecation warning (two lines) from inside Ray Train's dataset manager.
    "RAY_DEDUP_LOGS_SKIP_REGEX": (r"PreemptionWatcher.*constructor arguments in the object store|"
                                  r"RayDeprecationWarning|^\s*self\.exclude_resources = exclude_resources\s*$|"
                                  # and Ray Data's note, from each dataset's coordinator, that its bars are off
                                  r"Progress bars disabled\. To enable|"
                                  # and the raylet's warning that many worker processes started at once:
                                  # fractional CPUs (cluster.cpus_per_worker, data.data_cpus, Tune trials)
                                  # are this platform's choice, so it is nothing for the user to act on
                                  r"worker processes have been started on node: .* the maximum expected startup"),
}


# Without a terminal (ray job submit, CI, nohup, every Ray worker) each refresh of a progress bar is a
# log line: MLflow's "Downloading artifacts" bar and transformers' "Writing model shards" (read through
# huggingface_hub at import, hence here). The jobs print their own progress lines either way.
NO_TERMINAL_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def set_hermetic_env() -> None:
    for key, value in HERMETIC_ENV.items():
        os.environ.setdefault(key, value)
    if not sys.stdout.isatty():
        for key, value in NO_TERMINAL_ENV.items():
            os.environ.setdefault(key, value)
    sys.unraisablehook = quiet_exit_unraisable


def quiet_exit_unraisable(unraisable) -> None:
    """Python's hook for an exception nobody can catch (in a finaliser or a weakref callback), minus one
    case: a SystemExit. Ray ends a finished trial's actor by raising SystemExit from its signal handler;
    when that lands inside a garbage-collection callback, Python printed "Exception ignored in: <function
    WeakSet...> ... SystemExit: 1" into a sweep that had succeeded. The process is exiting as asked, so
    there is nothing to report; every other unraisable exception is still printed."""
    if isinstance(unraisable.exc_value, SystemExit) or unraisable.exc_type is SystemExit:
        return
    sys.__unraisablehook__(unraisable)
