"""The one way the jobs start or join Ray, and how quiet Ray Data is."""

from __future__ import annotations

import logging
import os
import re
import secrets
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import ray
import ray.data
from ray.data._internal.issue_detection.detectors import HangingExecutionIssueDetector

from jobs.cli import UserError
from jobs.env import set_hermetic_env


OWN_DASHBOARD: dict[str, str] = {}  # the URL start_own_ray gave RAY_API_SERVER_ADDRESS, taken back on the next start


def init_ray(num_cpus: float | None = None, dashboard: bool = False) -> None:
    """Join the cluster that RAY_ADDRESS names (`ray job submit` sets it; so may the user), else start a
    Ray of this job's own; no-op if up.

    Joining is explicit: without RAY_ADDRESS a job never joins a cluster it finds on the machine (Ray's
    `ray.init()` joins whatever `ray start` last recorded, maybe another user's), it starts its own
    (`start_own_ray`)."""
    set_hermetic_env()
    if not ray.is_initialized():
        if OWN_DASHBOARD and os.environ.get("RAY_API_SERVER_ADDRESS") == OWN_DASHBOARD["url"]:
            del os.environ["RAY_API_SERVER_ADDRESS"]  # the dashboard of a Ray this process started and ended
        if os.environ.get("RAY_ADDRESS"):
            ray.init()  # resources belong to the cluster: passing num_cpus here is an error
        else:
            start_own_ray(num_cpus, dashboard)
    quiet_ray_data(sys.stdout.isatty())
    if not sys.stdout.isatty():  # worker lines reach a log file or a pipe: no ANSI colour codes in them
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def start_own_ray(num_cpus: float | None, dashboard: bool) -> None:
    """A new local Ray for this job alone (docs/design.md section 8):

    - `address="local"`: a new cluster, never one `ray start` recorded;
    - Ray's token authentication (on by default since Ray 2.59 for clusters `ray.init` starts), its token
      file made owner-only before Ray reads it (`own_token_file`);
    - its dashboard (and job API) listens on 127.0.0.1; Ray 2.60 opens its RPC ports on every interface
      whatever `ray.init` is told, and checks the token on them;
    - a private temporary root (a fresh 0700 folder) for its sessions, sockets and logs;
    - its workers, and the driver's state API, told which cluster is theirs: Ray's state API (Ray Train's
      placement-group cleaner, Ray Data's hang detector) otherwise looks for "the" local Ray by listing
      every GCS process on the machine, and with a second Ray running (another job's) fails with
      `ConnectionError: Found multiple active Ray instances`."""
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
    # Ray's sessions, sockets and logs: mkdtemp's folder is 0700, with a name no other user can take first,
    # in $RAY_TMPDIR (else $TMPDIR, /tmp) like Ray's own /tmp/ray; it stays after the job, for its logs.
    temp_root = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=temp_parent())
    try:
        own_token_file()
        started = ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host="127.0.0.1",
                           _temp_dir=temp_root,
                           runtime_env={"worker_process_setup_hook": worker_setup_hook()})
    finally:
        private_token_file()  # also when the start fails
    if dashboard:  # the driver's state API (Ray Data's hang detector): this job's dashboard
        OWN_DASHBOARD["url"] = os.environ["RAY_API_SERVER_ADDRESS"] = f"http://{started.dashboard_url}"
    else:
        no_hang_detector()


# Every byte of the folder Ray keeps its sessions in is repeated in every socket path Ray makes, and
# Linux's AF_UNIX path is 107 bytes at most: the platform's own folder is as short as mkdtemp allows.
TEMP_PREFIX = "cr"  # + mkdtemp's 8 random characters
# Ray 2.60's longest socket path under that folder (ray/_private/node.py, ray/dashboard/subprocesses/utils.py):
# session_<%Y-%m-%d_%H-%M-%S_%f>_<pid>/sockets/dash_<dashboard module>; a pid has up to 7 digits
# (pid_max 4194304), TaskEventsHead is the longest module name (plasma_store and raylet are shorter).
LONGEST_SOCKET = os.path.join("session_2026-01-01_00-00-00_000000_1234567", "sockets", "dash_TaskEventsHead")
SOCKET_PATH_MAX = (104 if sys.platform == "darwin" else 108) - 1  # Ray's own limit (validate_socket_filepath)


def temp_parent() -> str | None:
    """$RAY_TMPDIR, made owner-only when missing (Ray makes its own folder too), once it is known that
    Ray's socket paths under it fit; None when it is unset (mkdtemp's default, $TMPDIR or /tmp)."""
    parent = os.environ.get("RAY_TMPDIR")
    check_socket_room(os.path.abspath(parent or tempfile.gettempdir()), "RAY_TMPDIR" if parent else "TMPDIR")
    if parent:
        try:
            os.makedirs(parent, mode=0o700, exist_ok=True)
        except OSError as error:
            raise UserError(f"RAY_TMPDIR={parent} cannot be made: {error.strerror}") from None
    return parent


def check_socket_room(parent: str, name: str = "RAY_TMPDIR") -> None:
    """UserError before Ray starts when the socket paths Ray would make under `parent` pass the limit: Ray's
    dashboard would die on it with a traceback ("AF_UNIX path length cannot exceed 107 bytes")."""
    longest = len(os.path.join(parent, TEMP_PREFIX + "x" * 8, LONGEST_SOCKET).encode())
    if longest > SOCKET_PATH_MAX:
        raise UserError(f"{name}={parent} makes Ray's socket paths {longest} bytes long, over the {SOCKET_PATH_MAX} "
                        f"allowed; use a shorter folder such as /tmp/r")


def no_hang_detector() -> None:
    """Keep Ray Data's hang detector off in a driver whose Ray has no dashboard. The detector asks Ray's
    state API about a slow task with no address; without RAY_API_SERVER_ADDRESS or RAY_ADDRESS that API
    takes the Ray that `ray start` recorded in /tmp/ray, or the one GCS process it finds on the machine,
    maybe another user's, and sends it this job's token (`ray.dashboard.utils.
    get_address_for_submission_client`). Ray 2.60 leaves the detector out of its defaults ("enable once
    it's non-blocking"); this keeps it out if a later Ray or a user's DataContext turns it on."""
    config = ray.data.DataContext.get_current().issue_detectors_config
    config.detectors = [d for d in config.detectors if d is not HangingExecutionIssueDetector]



def worker_setup_hook() -> Callable[[], None]:
    """The function every worker of a job's own Ray runs when it starts (`worker_process_setup_hook`):
    RAY_ADDRESS names the cluster the worker belongs to, so Ray's state API in it asks that cluster, not
    whichever Ray process it finds on the machine (`start_own_ray`). Made here, not at module level, so Ray
    sends it by value: a worker need not import this module (an installed copy may be another version)."""

    def know_own_cluster() -> None:
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address

    return know_own_cluster


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


def own_token_file() -> None:
    """Make the token file, owner-only from the moment it exists, when it is missing (Ray would make it with
    the umask's mode, usually world-readable, in a folder it makes world-readable): in a folder created
    owner-only, written under umask 077 with O_EXCL and mode 0600, Ray's format (64 hex digits)."""
    path = token_file()
    if path is None or path.exists() or os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return
    saved = os.umask(0o077)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
    except FileExistsError:  # another job made it between the check and here: theirs is the token
        pass
    finally:
        os.umask(saved)


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
