"""jobs.env and jobs.ray_session: the process settings every job starts with, and Ray's token authentication."""

import json
import logging
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import ray.data

from helpers import stop_processes_under
from jobs.env import HERMETIC_ENV, set_hermetic_env
from jobs.cli import UserError
from jobs.ray_session import LONGEST_SOCKET, check_socket_room, own_token_file, private_token_file, quiet_ray_data, temp_parent


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
        "2026-11-24 01:42:25,050\tWARNING __init__.py:28 -- Progress bars disabled. To enable, set "
        "`ray.data.DataContext.get_current().enable_progress_bars = True`.",
        "WARNING: 8 PYTHON worker processes have been started on node: 5f2c with address: 10.0.0.2, which is 4x "
        "the maximum expected startup concurrency (2). This could be a result of using a large number of actors",
    ]
    kept = ["step 10/20 | loss 54.435 | aux_mlm 8.288 copy 0.674 | lr 1.00e-04 | 11,000 tok/s | 0m12s left",
            "resumed from /tmp/x/checkpoint_step_00000010 at step 10", "Traceback (most recent call last):",
            "RuntimeError: checkpoint belongs to MLflow run a, not b"]
    assert all(skip.search(line) for line in dropped)
    assert not any(skip.search(line) for line in kept)


# ----------------------------------------------------------------------------- Ray's token authentication stays on

ROOT = Path(__file__).resolve().parents[1]


def test_the_platform_never_switches_ray_token_authentication_off():
    assert "RAY_AUTH_MODE" not in HERMETIC_ENV
    ci = (ROOT / ".ci" / "run").read_text()
    assert "RAY_AUTH_MODE" not in ci and "export RAY_AUTH_TOKEN_PATH=" in ci  # CI: a token of its own, in /tmp


def test_a_world_readable_token_file_is_made_owner_only(tmp_path, monkeypatch):
    token = tmp_path / "auth_token"
    token.write_text("0" * 64)
    token.chmod(0o644)  # as Ray writes it under the usual umask
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    private_token_file()
    assert stat.S_IMODE(token.stat().st_mode) == 0o600


def _request(url: str, token: str | None = None, data: bytes | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_process_told_to_exit_during_garbage_collection_prints_no_traceback_but_real_ones_stay():
    """Ray ends a finished trial's actor with SystemExit from its signal handler; landing in a weakref
    callback it printed 'Exception ignored in: <function WeakSet...> SystemExit: 1' after good sweeps."""
    code = ("import jobs\n"
            "class Exits:\n    def __del__(self): raise SystemExit(1)\n"
            "class Fails:\n    def __del__(self): raise ValueError('a real problem')\n"
            "Exits(); Fails(); print('done')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "done" in result.stdout
    assert "SystemExit" not in result.stderr and "Exits" not in result.stderr
    assert "Exception ignored in" in result.stderr and "ValueError: a real problem" in result.stderr


def test_without_a_terminal_no_progress_bar_lines_and_no_colour_codes_in_rays_own_lines():
    code = ("import os, logging, jobs\n"
            "from transformers.utils import logging as tl\n"
            "from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as bar\n"
            "print(tl.is_progress_bar_enabled(), bar.get())\n"
            "from jobs.ray_session import no_ansi\n"
            "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
            "log = logging.getLogger('ray._private.worker'); log.addFilter(no_ansi)\n"
            "log.info('Started a local Ray instance. View the dashboard at %s%s%s %s%s', '\\x1b[1m', '\\x1b[32m',"
            " 'http://127.0.0.1:8265', '\\x1b[39m', '\\x1b[22m')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False"]  # transformers' "Writing model shards", MLflow's downloads
    assert "View the dashboard at http://127.0.0.1:8265" in result.stderr and "\x1b[" not in result.stderr


# ----------------------------------------------------------------------------- a job's own Ray: never a stranger's

def test_a_missing_token_file_is_made_owner_only_in_an_owner_only_folder(tmp_path, monkeypatch):
    token = tmp_path / "home" / ".ray" / "auth_token"
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    saved = os.umask(0o022)  # the usual umask: what Ray would have written the token with
    try:
        own_token_file()
    finally:
        os.umask(saved)
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    assert re.fullmatch(r"[0-9a-f]{64}", token.read_text())  # Ray's format
    before = token.read_text()
    own_token_file()  # an existing token is Ray's (or the user's): kept
    assert token.read_text() == before


def _own_process(code: str, env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, **kwargs)


def test_the_token_is_made_owner_only_even_when_rays_start_fails(tmp_path):
    token = tmp_path / "auth_token"
    token.write_text("0" * 64)
    token.chmod(0o644)
    code = ("import ray\nfrom jobs.ray_session import start_own_ray\n"
            "try:\n    start_own_ray(num_cpus=-1, dashboard=False)\nexcept Exception as e:\n    print('failed:', e)\n")
    folder = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short enough for Ray's socket paths: Ray's own start fails
    env = {**os.environ, "RAY_TMPDIR": folder, "RAY_AUTH_TOKEN_PATH": str(token)}
    env.pop("RAY_AUTH_TOKEN", None)
    out, _ = _own_process(code, env).communicate(timeout=120)
    shutil.rmtree(folder, ignore_errors=True)
    assert "failed:" in out, out[-2000:]
    assert stat.S_IMODE(token.stat().st_mode) == 0o600


@pytest.mark.slow  # about a minute: two Rays start
@pytest.mark.timeout(300)
def test_a_job_started_directly_never_joins_the_ray_that_ray_start_left_running(tmp_path):
    """With `ray start --head` running (recorded in Ray's ray_current_cluster), a job's session starts a Ray
    of its own: Ray 2.60's `ray.init()` with no address joined the recorded one ("Connecting to existing Ray
    cluster"), maybe another user's."""
    folder = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_TMPDIR": folder, "RAY_AUTH_MODE": "token"}  # as the README's shell
    env.pop("RAY_ADDRESS", None)
    try:
        subprocess.run([Path(sys.executable).parent / "ray", "start", "--head", "--port=0", "--num-cpus=1",
                        "--include-dashboard=false", "--disable-usage-stats"], env=env, check=True, capture_output=True,
                       timeout=180)
        theirs = (Path(folder) / "ray" / "ray_current_cluster").read_text().strip()
        # Ray Data's hang detector, turned on as a user's DataContext (or a later Ray) may: in a job with no
        # dashboard its state API query would go to the recorded Ray, theirs, with this job's token
        code = ("import ray, ray.data\nfrom ray.data._internal.issue_detection.detectors import "
                "HangingExecutionIssueDetector as H\n"
                "ray.data.DataContext.get_current().issue_detectors_config.detectors.append(H)\n"
                "from jobs.ray_session import init_ray\ninit_ray(num_cpus=1)\n"
                "print('gcs', ray.get_runtime_context().gcs_address)\n"
                "print('hang detector', H in ray.data.DataContext.get_current().issue_detectors_config.detectors)\n"
                "ray.shutdown()\n")
        env.pop("RAY_AUTH_MODE")  # a job run directly, from a user's usual shell
        out, _ = _own_process(code, env).communicate(timeout=240)
        ours = next((line.split()[1] for line in out.splitlines() if line.startswith("gcs ")), None)
        assert ours and ours != theirs, out[-3000:]
        assert "Connecting to existing Ray cluster" not in out
        assert "hang detector False" in out, out[-3000:]
    finally:
        stop_processes_under(folder)
        shutil.rmtree(folder, ignore_errors=True)


# Each process starts its job's Ray, says where its dashboard is, waits until the test says both are up, then
# asks Ray's state API about an actor from a worker (what Ray Train's placement-group cleaner does every few
# seconds) and from the driver (Ray Data's hang detector).
TWO_JOBS = """
import sys, ray
from ray.util.state import get_actor
from jobs.ray_session import init_ray
init_ray(num_cpus=1, dashboard=True)
print('up', ray._private.worker.get_dashboard_url(), flush=True)
sys.stdin.readline()

@ray.remote(num_cpus=0)
class Held:
    def ping(self):
        return 1

@ray.remote(num_cpus=0)
def alive(actor_id):
    return get_actor(actor_id, timeout=60).state

held = Held.remote()
ray.get(held.ping.remote())
actor_id = held._actor_id.hex()
print('worker', ray.get(alive.remote(actor_id)), 'driver', get_actor(actor_id, timeout=60).state, flush=True)
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_jobs_started_at_once_each_keep_to_their_own_ray_whose_job_api_refuses_requests_without_its_token(
        tmp_path):
    """Two jobs start their Rays at once (jobs.ray_session.init_ray, with the dashboard, as the pretraining job
    starts it) in a user's environment (no RAY_AUTH_MODE, no RAY_ADDRESS).

    While both are up, the first one's job API: a job submission without the token is refused (401) and runs
    nothing, a wrong token too (403); with Ray's token the same API answers (200), and the refused job is not
    among its jobs. Then each job's worker and driver ask Ray's state API, and get their own Ray's answer."""
    env = {**os.environ}
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_API_SERVER_ADDRESS"):
        env.pop(name, None)
    jobs = [_own_process(TWO_JOBS, env, stdin=subprocess.PIPE) for _ in range(2)]
    logs, dashboards = ["", ""], ["", ""]
    planted = tmp_path / "planted"
    try:
        for i, job in enumerate(jobs):  # both Rays up before either asks
            for line in job.stdout:
                logs[i] += line
                if line.startswith("up "):
                    dashboards[i] = line.split()[1]
                    break
            assert dashboards[i], logs[i][-3000:]
        jobs_api = f"http://{dashboards[0]}/api/jobs/"
        submission = json.dumps({"entrypoint": f"touch {planted}"}).encode()
        assert _request(jobs_api, data=submission) == (401, "Unauthorized: Missing authentication token")
        assert _request(jobs_api) == (401, "Unauthorized: Missing authentication token")
        assert _request(jobs_api, token="0" * 64) == (403, "Forbidden: Invalid authentication token")
        token = Path(env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()  # Ray's token (tests/conftest.py)
        status, body = _request(jobs_api, token=token)
        assert status == 200  # accepted; and the refused submission never became a job
        assert [job["type"] for job in json.loads(body)] == ["DRIVER"]  # only the process that started Ray
        assert not planted.exists()
        for job in jobs:
            job.stdin.write("go\n")
            job.stdin.flush()
        for i, job in enumerate(jobs):
            logs[i] += job.communicate(timeout=300)[0]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
    for log in logs:
        assert "worker ALIVE driver ALIVE" in log, log[-3000:]
        assert "Found multiple active Ray instances" not in log and "Traceback" not in log, log[-3000:]
        # Ray's "token authentication is enabled ... Set RAY_AUTH_MODE=disabled to opt out" is not passed on
        assert "opt out" not in log


def test_a_missing_ray_tmpdir_is_made_owner_only(monkeypatch):
    folder = tempfile.mkdtemp(prefix="rn", dir="/tmp")
    try:
        monkeypatch.setenv("RAY_TMPDIR", f"{folder}/new")
        assert temp_parent() == f"{folder}/new" and stat.S_IMODE(os.stat(f"{folder}/new").st_mode) == 0o700
    finally:
        shutil.rmtree(folder)


def test_a_ray_tmpdir_too_long_for_rays_socket_paths_is_one_line_before_ray_starts(monkeypatch):
    """Ray's longest socket path is RAY_TMPDIR + 82 bytes: the platform's folder (/cr + 8 characters),
    /session_<26-character date>_<pid of up to 7 digits>, /sockets/dash_TaskEventsHead. Linux allows 107."""
    check_socket_room("/scratch/alice/ray")  # 18 bytes: a shared cluster's folder fits
    absent = f"/tmp/{secrets.token_hex(4)}"
    fits = f"{absent}/" + "x" * 11  # 25 bytes: 107 exactly
    check_socket_room(fits)
    monkeypatch.setenv("RAY_TMPDIR", fits + "y")
    try:
        with pytest.raises(UserError) as refused:
            temp_parent()
        assert str(refused.value) == (f"RAY_TMPDIR={fits}y makes Ray's socket paths 108 bytes long, over the 107 "
                                      f"allowed; use a shorter folder such as /tmp/r")
        assert not os.path.exists(absent)  # refused before anything is made
    finally:
        shutil.rmtree(absent, ignore_errors=True)


def test_the_longest_socket_path_follows_rays_own_code():
    """LONGEST_SOCKET names the session folder and the dashboard module socket of the installed Ray: a Ray
    with a longer module name or another session name would pass the check and still die on the limit."""
    root = Path(ray.__file__).parent
    node = (root / "_private" / "node.py").read_text()
    assert 'f"session_{date_str}_{os.getpid()}"' in node and '"%Y-%m-%d_%H-%M-%S_%f"' in node
    assert 'os.path.join(socket_dir, "dash_" + module_name)' in (root / "dashboard/subprocesses/utils.py").read_text()
    modules = {name for f in (root / "dashboard").rglob("*.py")
               for name in re.findall(r"^class (\w+)\([^)]*SubprocessModule", f.read_text(), re.M)}
    assert "MetricsHead" in modules and max(map(len, modules)) <= len(Path(LONGEST_SOCKET).name.removeprefix("dash_"))
    session, sockets, _ = Path(LONGEST_SOCKET).parts
    assert sockets == "sockets" and len(session) == len("session_") + 26 + 1 + len(str(4194304))
