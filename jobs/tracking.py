"""MLflow for the platform: the embedded sqlite store, reachability checks, and resumable runs.

The embedded default lives under $COCOLM_HOME (default ~/cocolm-ray), an absolute place on
purpose: `ray job submit --working-dir .` runs the job from a temporary copy of the repository,
so a store relative to the working directory would vanish with it.
"""

from __future__ import annotations

import contextlib
import datetime
import getpass
import json
import os
import socket
import sqlite3
import subprocess
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from mlflow.entities import Param, Run, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.credentials import get_default_host_creds
from mlflow.utils.rest_utils import http_request

from jobs.cli import UserError, check_name
from jobs.names import RUN_KEY_TAG

def home() -> Path:
    return Path(os.environ.get("COCOLM_HOME", "~/cocolm-ray")).expanduser().resolve()


@contextlib.contextmanager
def private_files():
    """Files and folders made inside the block are owner-only from the moment they exist (umask 077),
    not created open and tightened after: the tracking store, checkpoints and locks hold runs that
    other accounts on the machine must neither read nor replace (docs/design.md section 8)."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def private_folder(path: Path, tighten: bool = False) -> Path:
    """`path` and its missing parents, made owner-only (0700). With `tighten`, a folder that exists
    already and is this account's (an older $COCOLM_HOME, a run's folder) is set to 0700 too; a
    folder the user chose for other things (--storage, a tracking database's) is left as it is."""
    with private_files():
        path.mkdir(parents=True, exist_ok=True)
    if tighten and path.stat().st_uid == os.getuid():
        path.chmod(0o700)
    return path


def default_tracking_uri() -> str:
    return f"sqlite:///{home() / 'mlflow.db'}"


def default_storage() -> str:
    return str(home() / "ray_results")


def check_storage(storage: str) -> None:
    """A local checkpoint/results directory must be creatable and writable: said before Ray starts or
    an MLflow run is created (a cloud URI is checked by Ray when it first writes)."""
    if "://" in storage and not storage.startswith("file://"):
        return
    path = Path(storage.removeprefix("file://")).expanduser()
    try:
        with private_files():
            path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as error:
        raise UserError(f"storage {storage} is not writable ({error.strerror or error}): "
                              f"choose a writable --storage") from None


# MLflow's client reads these itself (a user name and password for basic auth, or a bearer token).
CREDENTIAL_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")


def check_tracking(uri: str, timeout: float = 5.0) -> None:
    """Fail before any compute is spent if the tracking store cannot be reached, or if a tracking server
    refuses this process's credentials (MLflow's basic-auth app, platform/mlflow/README.md)."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as response:
                if response.status != 200:
                    raise ConnectionError(f"HTTP {response.status}")
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as error:
            raise UserError(
                f"MLflow tracking server {uri} is unreachable ({error}). Start it (see platform/mlflow/README.md) "
                f"or pass --tracking-uri sqlite:///<path>/mlflow.db for a local store."
            ) from None
        check_credentials(uri, timeout)
    elif uri.startswith("sqlite:///"):
        database = Path(uri.removeprefix("sqlite:///"))
        private_folder(database.parent, tighten=database.parent == home())
        with private_files(), contextlib.suppress(FileExistsError):  # empty is a valid sqlite database
            os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        if database.parent == home() and database.stat().st_uid == os.getuid():
            database.chmod(0o600)  # one made world-readable before this rule
        check_sqlite(uri)


def check_sqlite(uri: str) -> None:
    """An existing sqlite store that is not a readable database (overwritten, truncated, another file) is
    one line naming it, before any work: MLflow would raise SQLAlchemy's DatabaseError with its traceback.
    Opened read-only, so a command that only reads the store never makes one."""
    if not uri.startswith("sqlite:///"):
        return
    database = Path(uri.removeprefix("sqlite:///"))
    if not database.is_file():
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{urllib.parse.quote(str(database))}?mode=ro", uri=True)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # reads the header and the schema
    except sqlite3.Error as error:
        raise UserError(f"the tracking store {uri} cannot be read: {database} is not a usable SQLite database "
                        f"({error}); point --tracking-uri at another store, or restore this file from a copy") from None


def check_credentials(uri: str, timeout: float = 5.0) -> None:
    """One authenticated read, sent as MLflow's client sends its requests (the same credentials, from the
    same variables): /health answers without credentials, so it cannot tell whether they are accepted."""
    creds = get_default_host_creds(uri)
    try:
        response = http_request(creds, "/api/2.0/mlflow/experiments/search", "GET", params={"max_results": 1},
                                max_retries=0, backoff_factor=0, timeout=timeout, raise_on_status=False)
    except (OSError, MlflowException) as error:
        raise UserError(f"MLflow tracking server {uri} did not answer a request ({error})") from None
    if response.status_code not in (401, 403):
        return
    given = [name for name in CREDENTIAL_VARIABLES if os.environ.get(name)]
    if given:
        source = " and ".join(given)
    elif creds.username or creds.password:
        source = "MLflow's credentials file (~/.mlflow/credentials)"
    else:
        source = None
    if response.status_code == 401:
        problem = f"refused the credentials in {source}" if source else "requires credentials and none are set"
    else:
        problem = f"denies access to the account in {source or '(no credentials)'}"
    raise UserError(
        f"MLflow tracking server {uri} {problem} (HTTP {response.status_code}): set MLFLOW_TRACKING_USERNAME "
        f"and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) to an account the server's admin made for "
        f"you, in the job's environment (platform/mlflow/README.md)")


def experiment_id(client: MlflowClient, name: str, tracking_uri: str) -> str:
    """Get or create; a sqlite store gets an explicit artifact root beside the database (MLflow 3 wants one)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        check_experiment_name(name, tracking_uri)
        location = (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts" / name).as_uri()
    return client.create_experiment(name, artifact_location=location)


def check_experiment_name(name: str, tracking_uri: str, what: str = "experiment") -> None:
    """In a sqlite store an experiment's name is its artifact folder's (experiment_id): a safe name."""
    if tracking_uri.startswith("sqlite:///"):
        check_name(what, name)


def find_run(client: MlflowClient, experiment: str, run_key: str) -> Run | None:
    """The run tagged with `run_key`, or None. MLflow's filter strings have no escape for a quote, so the
    key is a safe name (jobs.cli.check_name) before it is written into one."""
    check_name("run name", run_key)
    existing = client.search_runs([experiment], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'", max_results=1)
    return existing[0] if existing else None


def find_or_start_run(
    client: MlflowClient, experiment: str, run_key: str, run_name: str, tags: dict[str, str]
) -> tuple[str, str]:
    """The run tagged with `run_key` if one exists, else a new one. Returns (run_id, its status)."""
    run = find_run(client, experiment, run_key)
    if run is not None:
        if run.info.status != "FINISHED":
            client.update_run(run.info.run_id, status="RUNNING")
        return run.info.run_id, run.info.status
    run = client.create_run(experiment, run_name=run_name, tags={RUN_KEY_TAG: run_key, **tags})
    return run.info.run_id, "NEW"


def changed_settings(run: Run, params: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, logged value, new value) for each setting `run` logged with another value. MLflow keeps one
    value per param, so a run can only resume with the settings it started with; a key the run never
    logged (added to the config since) is not a change."""
    logged = run.data.params
    return [(key, logged[key], str(value)) for key, value in params.items()
            if key in logged and logged[key] != str(value)]


def check_same_settings(run: Run, params: dict[str, Any], run_name: str) -> None:
    """A named run re-run with another setting: one error naming the key and both values, said before
    anything starts and before the run is touched (its status stays what it was)."""
    changed = changed_settings(run, params)
    if not changed:
        return
    listed = "; ".join(f"{key} was {old}, now {new}" for key, old, new in changed[:3])
    more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
    raise UserError(
        f"run {run_name} (MLflow run {run.info.run_id}, {run.info.status}) has other settings: {listed}{more}. "
        f"A run keeps the settings it started with: re-run with those to resume it, or give the new "
        f"settings another --name")


# ----------------------------------------------------------------------------- one command per run


LOCK_FILE = ".cocolm-run.lock"  # in the run's storage folder, beside Ray Train's files


def lock_path(storage: str, run_name: str) -> Path:
    """The run's lock: in its storage folder when that is local; for cloud storage, under $COCOLM_HOME
    (so it keeps out two commands on this machine, not on two machines)."""
    if "://" in storage and not storage.startswith("file://"):
        where = home() / "locks" / urllib.parse.quote(storage.rstrip("/"), safe="")
    else:
        where = Path(storage.removeprefix("file://")).expanduser().resolve()
    return where / check_name("run name", run_name) / LOCK_FILE


@contextlib.contextmanager
def holding_run(storage: str, run_name: str):
    """The run for this command alone: a lock file created atomically (O_EXCL) in the run's folder,
    holding host, pid, user and start time, removed when the block ends, on failure too. A second
    command on the run is refused, naming who holds it; a lock left by a process that died on this
    host is taken over, with a line that says so."""
    path = lock_path(storage, run_name)
    private_folder(path.parent, tighten=True)  # the run's checkpoints go here: owner-only before Ray writes
    _take_lock(path, run_name)
    try:
        yield path
    finally:
        _release_lock(path)


def _take_lock(path: Path, run_name: str) -> None:
    mine = {"host": socket.gethostname(), "pid": os.getpid(), "user": _user(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            holder = _read_lock(path)
            if holder is None or not _died_here(holder):
                raise UserError(_held_message(run_name, path, holder)) from None
            print(f"run {run_name}: taking over its lock from pid {holder.get('pid')} on {holder.get('host')} "
                  f"(user {holder.get('user')}, since {holder.get('started')}), which is no longer running",
                  flush=True)
            if _read_lock(path) == holder:  # not taken over meanwhile by another command
                path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(mine, f)
        return
    raise UserError(_held_message(run_name, path, _read_lock(path)))


def _user() -> str:
    """The account's name, or its uid where it has none (a container's user without a passwd entry)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _held_message(run_name: str, path: Path, holder: dict | None) -> str:
    who = ("another command that is taking it now" if holder is None else
           f"{holder.get('user')}'s command, pid {holder.get('pid')} on {holder.get('host')}, "
           f"since {holder.get('started')}")
    return (f"run {run_name} is live: it is held by {who} (lock {path}). One command per run: wait for it "
            f"to end, or give this one another --name; if that process is gone and its host cannot say so, "
            f"delete the lock")


def _read_lock(path: Path) -> dict | None:
    """The holder a lock names; None while its writer has created it but not yet written it."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _died_here(holder: dict) -> bool:
    """The lock's process ran on this host and is gone (a pid another account runs still counts as alive)."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _release_lock(path: Path) -> None:
    holder = _read_lock(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)


STOPPING = threading.Event()
"""Set by a command that is being stopped (Ctrl-C, SIGTERM) before it stops the runs its other threads
hold (jobs.studies.ablate shuts its Ray down under them): their errors then mean "stopped", not
"broken", and the gate must not count such a run against the recipe (jobs.gate.UNFINISHED)."""


def end_run(client: MlflowClient, run_id: str, ok: bool, stopped: bool = False) -> None:
    status = RunStatus.FINISHED if ok else RunStatus.KILLED if stopped else RunStatus.FAILED
    client.set_terminated(run_id, status=RunStatus.to_string(status))


def was_stopped(error: BaseException) -> bool:
    """Ctrl-C (KeyboardInterrupt), a SIGTERM (Ray's driver handler turns it into SystemExit), or an error
    in a run whose command is stopping (STOPPING)."""
    return isinstance(error, (KeyboardInterrupt, SystemExit)) or STOPPING.is_set()


@contextlib.contextmanager
def ending_run(client: MlflowClient, run_id: str):
    """Marks the run FINISHED when the block succeeds, KILLED when the command was stopped (`was_stopped`),
    FAILED on any other exception, and re-raises."""
    try:
        yield
    except BaseException as error:
        end_run(client, run_id, ok=False, stopped=was_stopped(error))
        raise
    end_run(client, run_id, ok=True)


UI_ADDRESS = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default


def ui_base(tracking_uri: str) -> str:
    """The UI's address: the tracking server itself, or a local `mlflow ui` over a file/database store."""
    return tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else UI_ADDRESS


def runs_table_url(tracking_uri: str, experiment_id: str) -> str:
    """The experiment's runs table. MLflow 3 opens an experiment on its GenAI overview page (traces,
    all empty here), so every job links the runs table directly."""
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs"


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}"


def compare_url(tracking_uri: str, experiment_id: str, run_ids: list[str]) -> str:
    query = urllib.parse.urlencode({"runs": json.dumps(run_ids), "experiments": json.dumps([experiment_id])},
                                   quote_via=urllib.parse.quote)
    return f"{ui_base(tracking_uri)}/#/compare-runs?{query}"


def ui_links(tracking_uri: str, experiment_id: str, run_id: str | None = None, compare: list[str] = ()) -> str:
    """What a job prints at its end: how to start the UI (for a local store) and direct links to the
    run, its experiment's runs table and, for several runs, the compare view."""
    lines = [] if tracking_uri.startswith(("http://", "https://")) else [
        f"start the UI:  mlflow ui --backend-store-uri {tracking_uri}   (then open a link below)"]
    if run_id:
        lines.append(f"this run:      {run_url(tracking_uri, experiment_id, run_id)}")
    lines.append(f"runs table:    {runs_table_url(tracking_uri, experiment_id)}")
    if len(compare) > 1:
        lines.append(f"compare runs:  {compare_url(tracking_uri, experiment_id, list(compare))}")
    return "\n".join(lines)


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    """All params in batches of 100 (MLflow's limit); re-logging an identical value on resume is allowed."""
    items = [Param(k, str(v)) for k, v in params.items()]
    for start in range(0, len(items), 100):
        client.log_batch(run_id, params=items[start : start + 100])


COMMIT_ENV = "COCOLM_GIT_COMMIT"  # set by `python -m jobs.submit`: a submitted job's copy has no .git


def git_commit(repo: Path | None = None) -> str:
    """The commit of the code being run, `<sha>-dirty` when the checkout has uncommitted changes (untracked
    files that git does not ignore count: Ray ships them too); "unknown" outside a git checkout. Under
    `ray job submit` the copy has no .git, so the commit comes from COCOLM_GIT_COMMIT (jobs.submit)."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    where = repo or Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
        if head.returncode or not head.stdout.strip():
            return "unknown"
        status = subprocess.run(["git", "status", "--porcelain"], cwd=where, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")
