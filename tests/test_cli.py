"""What a user sees when a command is given something wrong: one line naming the problem, exit status
1, nothing started (no Ray, no MLflow run); `--debug` brings the traceback back. Run as a user runs
them, `python -m jobs.<name>` in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAY_STARTED = "Started a local Ray instance"


def run_job(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COCOLM_HOME": str(tmp_path / "home")}
    env.pop("COCOLM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def pretrain(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return run_job(tmp_path, "jobs.pretraining", "--preset", "tiny", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", *args)


def assert_one_line_error(result: subprocess.CompletedProcess, starts_with: str) -> None:
    assert result.returncode == 1, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0].startswith(starts_with), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and RAY_STARTED not in result.stdout + result.stderr
    assert "--debug" in lines[-1]  # the way to the traceback is named


def finished_or_failed_runs(tmp_path: Path) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    experiments = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(experiments)) if experiments else 0


def test_a_missing_corpus_is_one_line_before_ray_starts(tmp_path):
    missing = tmp_path / "no-such-corpus"
    result = pretrain(tmp_path, "--corpus", str(missing))
    assert_one_line_error(result, f"error: corpus path not found: {missing}")
    debug = pretrain(tmp_path, "--corpus", str(missing), "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "FileNotFoundError" in debug.stderr


def test_an_unwritable_storage_is_found_before_ray_and_before_any_mlflow_run(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    result = pretrain(tmp_path, "--storage", str(blocker / "checkpoints"))
    assert_one_line_error(result, f"error: storage {blocker / 'checkpoints'} is not writable")
    assert finished_or_failed_runs(tmp_path) == 0  # no FAILED run left behind


@pytest.mark.parametrize("override,message", [
    ("train.max_steps=[5", "error: --set train.max_steps: cannot read the value '[5'"),
    ("train.max_stepz=5", "error: unknown config key(s) ['train.max_stepz']"),
])
def test_a_bad_override_is_one_line_naming_the_key(tmp_path, override, message):
    assert_one_line_error(pretrain(tmp_path, "--set", override), message)


def test_a_tokenizer_directory_without_a_tokenizer_is_named(tmp_path):
    empty = tmp_path / "tok"
    empty.mkdir()
    assert_one_line_error(pretrain(tmp_path, "--tokenizer", str(empty)), f"error: tokenizer directory {empty}")
