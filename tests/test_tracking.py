"""jobs.tracking: the UI links every job prints, the storage check, and the tracking server's credentials."""

import base64
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

from helpers import empty_store, one_line_in_process

from jobs.cli import UserError, redact
from jobs.pretraining.config import resolve, to_yaml
from jobs.submit import runtime_env
from jobs.tracking import (COMMIT_ENV, CREDENTIAL_VARIABLES, check_storage, check_tracking, git_commit, holding_run,
                           lock_path, ui_links)


def test_jobs_print_direct_links_to_the_run_the_runs_table_and_the_compare_view():
    local = ui_links("sqlite:////home/u/cocolm-ray/mlflow.db", "3", "abc", compare=["abc", "def"]).splitlines()
    assert local[0].startswith("start the UI:  mlflow ui --backend-store-uri sqlite:////home/u/cocolm-ray/mlflow.db")
    assert local[1] == "this run:      http://127.0.0.1:5000/#/experiments/3/runs/abc"
    assert local[2] == "runs table:    http://127.0.0.1:5000/#/experiments/3/runs"  # not the empty GenAI overview
    compare = urllib.parse.unquote(local[3])
    assert compare == 'compare runs:  http://127.0.0.1:5000/#/compare-runs?runs=["abc", "def"]&experiments=["3"]'
    server = ui_links("http://mlflow.internal:5000/", "7", "abc").splitlines()
    assert server == ["this run:      http://mlflow.internal:5000/#/experiments/7/runs/abc",
                      "runs table:    http://mlflow.internal:5000/#/experiments/7/runs"]  # no local UI to start


def test_storage_must_be_writable(tmp_path):
    check_storage(str(tmp_path / "new" / "dir"))  # created
    assert (tmp_path / "new" / "dir").is_dir() and list((tmp_path / "new" / "dir").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"storage .*file/sub is not writable"):
        check_storage(str(tmp_path / "file" / "sub"))
    check_storage("s3://bucket/prefix")  # cloud storage is Ray's to check when it first writes


# ----------------------------------------------------------------------------- a server with MLflow's basic auth


class AuthServer:
    """A stand-in for `mlflow server --app-name basic-auth` on 127.0.0.1: /health answers anyone (as
    MLflow's does), every other request needs `user`:`secret`; `deny` answers 403 to that user instead.
    `seen` keeps each request's Authorization header."""

    def __init__(self, deny: bool = False):
        outer, good = self, "Basic " + base64.b64encode(b"user:secret").decode()
        self.seen: list[str | None] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/health":
                    outer.seen.append(self.headers.get("Authorization"))
                if self.path == "/health":
                    status, body = 200, b"OK"
                elif self.headers.get("Authorization") != good:
                    status, body = 401, b"You are not authenticated."
                else:
                    status, body = (403, b"Permission denied") if deny else (200, b'{"experiments": []}')
                self.send_response(status)
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def no_mlflow_credentials(monkeypatch, tmp_path):
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials of the user's


def test_a_server_that_wants_credentials_is_one_error_naming_the_variables(no_mlflow_credentials, monkeypatch):
    server = AuthServer()
    try:
        with pytest.raises(UserError, match=r"requires credentials and none are set \(HTTP 401\): set "
                                                  r"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"):
            check_tracking(server.uri)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "user")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
        with pytest.raises(UserError, match="refused the credentials in MLFLOW_TRACKING_USERNAME and "
                                                  r"MLFLOW_TRACKING_PASSWORD \(HTTP 401\)"):
            check_tracking(server.uri)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "secret")
        check_tracking(server.uri)  # accepted: sent as MLflow's client sends them, HTTP basic auth
        assert server.seen == [None, "Basic dXNlcjp3cm9uZw==", "Basic dXNlcjpzZWNyZXQ="]
    finally:
        server.close()


def test_a_server_that_denies_the_account_says_so(no_mlflow_credentials, monkeypatch):
    server = AuthServer(deny=True)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "user")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "secret")
    try:
        with pytest.raises(UserError, match=r"denies access to the account in MLFLOW_TRACKING_USERNAME "
                                                  r"and MLFLOW_TRACKING_PASSWORD \(HTTP 403\)"):
            check_tracking(server.uri)
    finally:
        server.close()


def test_a_job_refused_by_the_server_prints_one_error_line_before_any_compute(no_mlflow_credentials, tmp_path, capsys,
                                                                             monkeypatch):
    """As a user runs `python -m jobs.pretraining --tracking-uri <server with auth>` with no credentials (the
    command's `run_main` in this process, Ray's start trapped: tests/test_cli.py runs one such command as a
    new Python)."""
    from jobs.pretraining.job import main

    server = AuthServer()
    try:
        one_line_in_process(capsys, monkeypatch, tmp_path, main, ["--preset", "tiny", "--tracking-uri", server.uri],
                            f"error: MLflow tracking server {server.uri} requires credentials and none are set "
                            "(HTTP 401): set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
                            "MLFLOW_TRACKING_TOKEN)")
    finally:
        server.close()
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir())  # nothing made


def test_the_commit_says_dirty_when_the_tree_has_changes_and_a_submitted_job_takes_it_from_its_env(tmp_path, monkeypatch):
    monkeypatch.delenv(COMMIT_ENV, raising=False)
    assert git_commit(tmp_path) == "unknown"  # not a checkout
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "a"], cwd=tmp_path, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert git_commit(tmp_path) == sha
    (tmp_path / "new.py").write_text("y = 2\n")  # untracked and not ignored: Ray would ship it
    assert git_commit(tmp_path) == f"{sha}-dirty"
    monkeypatch.setenv(COMMIT_ENV, "abc123-dirty")  # what jobs.submit hands a job
    assert git_commit(tmp_path) == "abc123-dirty"


def test_submit_merges_the_commit_into_the_runtime_env_file(tmp_path):
    env_file = tmp_path / "runtime_env.yaml"
    env_file.write_text("env_vars:\n  COCOLM_HOME: /tmp/x\nexcludes:\n  - work/\n")
    env = runtime_env(str(env_file), "abc123")
    assert env == {"env_vars": {"COCOLM_HOME": "/tmp/x", COMMIT_ENV: "abc123"}, "excludes": ["work/"]}
    assert runtime_env(None, "abc123") == {"env_vars": {COMMIT_ENV: "abc123"}}
    env_file.write_text("- not a mapping\n")
    with pytest.raises(UserError, match="a runtime env is a mapping"):
        runtime_env(str(env_file), "abc123")


# ----------------------------------------------------------------------------- one command per run


def test_a_run_lock_is_exclusive_released_on_failure_and_taken_over_from_a_dead_process(tmp_path, capsys):
    storage = str(tmp_path / "storage")
    lock = lock_path(storage, "mine")
    with pytest.raises(KeyError):
        with holding_run(storage, "mine"):
            holder = json.loads(lock.read_text())
            assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname() and holder["user"]
            assert lock.stat().st_mode & 0o777 == 0o600 and lock.parent.stat().st_mode & 0o777 == 0o700
            with pytest.raises(UserError, match=f"run mine is live: it is held by .* pid {os.getpid()}"):
                with holding_run(storage, "mine"):
                    pass  # a second command on the same run
            raise KeyError("the run failed")
    assert not lock.exists()  # released on the way out, on failure too
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that ran on this host and is gone: a driver killed mid-run
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "user": "u", "started": "then"}))
    with holding_run(storage, "mine"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert f"run mine: taking over its lock from pid {dead.pid} on {socket.gethostname()}" in capsys.readouterr().out
    lock.write_text(json.dumps({"host": "another-host", "pid": dead.pid, "user": "u", "started": "then"}))
    with pytest.raises(UserError, match=f"held by u's command, pid {dead.pid} on another-host"):
        with holding_run(storage, "mine"):
            pass  # this host cannot tell whether it still runs there
    assert json.loads(lock.read_text())["host"] == "another-host"  # and it is not removed


def test_credentials_in_a_corpus_uri_are_never_logged_or_stored(tmp_path):
    assert redact("s3://AKIAKEY:s3cr3t@bucket/corpus/") == "s3://***@bucket/corpus/"
    assert redact("https://user:pw@host/x.jsonl?X-Amz-Signature=abc") == "https://***@host/x.jsonl?***"
    assert redact("data/corpus") == "data/corpus" and redact("gs://bucket/x") == "gs://bucket/x"
    cfg = resolve("tiny", "cocolm", ['data.paths=["s3://AKIAKEY:s3cr3t@bucket/corpus/", "https://u:pw@h/x"]'])
    assert cfg.data.paths[0] == "s3://AKIAKEY:s3cr3t@bucket/corpus/"  # what Ray Data reads keeps them
    shown = str(cfg.flat()) + to_yaml(cfg) + cfg.digest()
    assert "s3cr3t" not in shown and "u:pw" not in shown and "s3://***@bucket/corpus/" in cfg.flat()["data.paths"]
    rotated = resolve("tiny", "cocolm", ['data.paths=["s3://AKIAKEY:n3w@bucket/corpus/", "https://u:pw2@h/x"]'])
    assert rotated.digest() == cfg.digest()  # new credentials, the same run


def test_the_store_and_checkpoint_folders_are_owner_only_when_made_not_after(tmp_path):
    """Made under umask 077: no moment in which another account could open them (outside $COCOLM_HOME,
    where nothing is tightened after the fact, so this sees the mode they were created with)."""
    previous = os.umask(0o022)  # a usual login's: new files readable by all
    try:
        check_tracking(f"sqlite:///{tmp_path}/new/store/mlflow.db")
        check_storage(str(tmp_path / "checkpoints" / "mine"))
        assert os.umask(0o022) == 0o022  # given back as it was
    finally:
        os.umask(previous)
    modes = {p.relative_to(tmp_path).as_posix(): p.stat().st_mode & 0o777 for p in
             (tmp_path / "new", tmp_path / "new" / "store", tmp_path / "new" / "store" / "mlflow.db",
              tmp_path / "checkpoints", tmp_path / "checkpoints" / "mine")}
    assert modes == {"new": 0o700, "new/store": 0o700, "new/store/mlflow.db": 0o600, "checkpoints": 0o700,
                     "checkpoints/mine": 0o700}


@pytest.mark.parametrize("error, status", [
    (KeyboardInterrupt(), "KILLED"),  # Ctrl-C
    (SystemExit(15), "KILLED"),  # a SIGTERM: Ray's driver handler raises SystemExit
    (RuntimeError("a worker died"), "FAILED"),  # a crash is the recipe's, or the code's
])
def test_a_stopped_run_ends_killed_and_a_broken_one_failed(tmp_path, error, status):
    """Issue 33: the gate counts a FAILED pretraining run against its recipe and leaves a KILLED one out
    (jobs.gate.UNFINISHED), so a study stopped with Ctrl-C or SIGTERM must leave its runs KILLED."""
    from mlflow.tracking import MlflowClient

    from jobs.tracking import ending_run

    client = MlflowClient(empty_store(tmp_path))
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    with pytest.raises(type(error)), ending_run(client, run_id):
        raise error
    assert client.get_run(run_id).info.status == status


def test_a_run_broken_by_its_command_stopping_ends_killed(tmp_path):
    """jobs.studies.ablate, stopped, shuts its Ray down under the runs of its other threads: the Ray error
    they then end with is the stop, not the recipe (tracking.STOPPING)."""
    from mlflow.tracking import MlflowClient

    from jobs import tracking

    client = MlflowClient(empty_store(tmp_path))
    experiment = client.create_experiment("e")
    run_ids = [client.create_run(experiment).info.run_id for _ in range(2)]
    try:
        with pytest.raises(RuntimeError), tracking.ending_run(client, run_ids[0]):
            raise RuntimeError("ray is not running")
        tracking.STOPPING.set()
        with pytest.raises(RuntimeError), tracking.ending_run(client, run_ids[1]):
            raise RuntimeError("ray is not running")
    finally:
        tracking.STOPPING.clear()
    assert [client.get_run(r).info.status for r in run_ids] == ["FAILED", "KILLED"]
