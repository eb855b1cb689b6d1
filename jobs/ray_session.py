"""The one way the jobs start or join Ray, and how quiet Ray Data is."""

from __future__ import annotations

import logging
import os
import re
import stat
import sys
from pathlib import Path

import ray
import ray.data

from jobs.env import set_hermetic_env


def init_ray(num_cpus: float | None = None, dashboard: bool = False) -> None:
    """Join the cluster in RAY_ADDRESS (set by `ray job submit`), else start a local one; no-op if up.

    A local Ray has Ray's token authentication (on by default since Ray 2.59 for clusters that
    `ray.init` starts): Ray generates its token once, in Ray's default place, and this keeps that
    file readable by its owner only (Ray writes it with the umask, usually world-readable)."""
    set_hermetic_env()
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init()  # resources belong to the cluster: passing num_cpus here is an error
        else:
            if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
                logging.getLogger(__name__).warning(
                    "RAY_AUTH_MODE=disabled: anyone who can reach this machine's Ray ports can run code as you "
                    "(docs/design.md section 8); unset it to keep Ray's token authentication")
            # Ray's notice that it turned token authentication on ends "Set RAY_AUTH_MODE=disabled to opt
            # out": advice this platform never gives (docs/design.md section 8). Its warning for a
            # cluster started without authentication stays.
            logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(no_opt_out_advice)
            if not sys.stdout.isatty():  # its "Started a local Ray instance" line colours the dashboard's URL
                logging.getLogger("ray._private.worker").addFilter(no_ansi)
            ray.init(num_cpus=num_cpus, include_dashboard=dashboard)
            private_token_file()
    quiet_ray_data(sys.stdout.isatty())
    if not sys.stdout.isatty():  # worker lines reach a log file or a pipe: no ANSI colour codes in them
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def no_opt_out_advice(record: logging.LogRecord) -> bool:
    """A logging filter (one function, so adding it again on every start keeps one copy)."""
    return "to opt out" not in record.getMessage()


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def no_ansi(record: logging.LogRecord) -> bool:
    """A logging filter that keeps the record and strips ANSI colour codes from it (a log file or a pipe
    shows them as `[1m[32m`)."""
    record.msg = ANSI.sub("", str(record.msg))
    if isinstance(record.args, tuple):
        record.args = tuple(ANSI.sub("", a) if isinstance(a, str) else a for a in record.args)
    return True


def token_file() -> Path | None:
    """The file Ray reads its authentication token from (RAY_AUTH_TOKEN_PATH, else Ray's default
    ~/.ray/auth_token); None when the token comes from the RAY_AUTH_TOKEN variable."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def private_token_file() -> None:
    """The token is the key to run code through Ray: make its file owner-only when it is ours and is not."""
    path = token_file()
    try:
        info = path.stat() if path else None
    except OSError:
        return
    if info and info.st_uid == os.getuid() and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        path.chmod(0o600)


def quiet_ray_data(interactive: bool) -> None:
    """Ray Data's progress bars and execution banners on a terminal only. Without one (`ray job
    submit`, CI, nohup) each bar refresh becomes log lines: a third of a short run's output. Set on
    the driver before any dataset is made, since a dataset carries a copy of this context to the
    processes that execute it; the jobs print their own progress lines either way."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = interactive
    context.print_on_execution_start = interactive
    logging.getLogger("ray.data").setLevel(logging.INFO if interactive else logging.WARNING)  # tips, plans
    # and its note that the bars are off, which says only what this function just chose
    logging.getLogger("ray.data._internal.progress").setLevel(logging.NOTSET if interactive else logging.ERROR)
