"""jobs.submit: no secret on a command line, only the project's own files uploaded, bad files named."""

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "s3cret-mlflow-password-0123"

# A stand-in for Ray's `ray` command, first on PATH: it records what `ps` would show (its argv) and the
# runtime-env file it was handed (mode, folder mode, content). Ray itself is exercised end to end by
# tests/test_pretrain.py::test_a_killed_run_resubmitted_as_a_ray_job_resumes_in_its_mlflow_run_and_recovers_from_a_
# worker_failure.
RAY_STUB = textwrap.dedent("""\
    #!{python}
    import json, os, stat, sys
    argv = sys.argv[1:]
    env_file = argv[argv.index("--runtime-env") + 1] if "--runtime-env" in argv else None
    record = {{"argv": argv, "cwd": os.getcwd()}}
    if env_file:
        record["mode"] = stat.S_IMODE(os.stat(env_file).st_mode)
        record["folder_mode"] = stat.S_IMODE(os.stat(os.path.dirname(env_file)).st_mode)
        record["env"] = json.load(open(env_file))
        record["file"] = env_file
    json.dump(record, open({out!r}, "w"))
    """)


def _submit(tmp_path: Path, *args: str, cwd: Path = ROOT, timeout: float = 60) -> tuple[subprocess.CompletedProcess, dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "ray-argv.json"
    stub = bin_dir / "ray"
    stub.write_text(RAY_STUB.format(python=sys.executable, out=str(record)))
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run([sys.executable, "-m", "jobs.submit", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout)
    return result, (json.loads(record.read_text()) if record.exists() else {})


def test_the_runtime_env_reaches_ray_as_an_owner_only_file_never_on_its_command_line(tmp_path):
    secret_env = tmp_path / "runtime_env.private.yaml"
    secret_env.write_text(f"env_vars:\n  MLFLOW_TRACKING_USERNAME: alice\n  MLFLOW_TRACKING_PASSWORD: {PASSWORD}\n"
                          "excludes:\n  - data/big/\n")
    result, seen = _submit(tmp_path, "--runtime-env", str(secret_env), "--", "python", "-m", "jobs.pretraining")
    assert result.returncode == 0, result.stderr
    assert not any(PASSWORD in arg for arg in seen["argv"])  # what `ps` shows every user for the whole job
    assert "--runtime-env-json" not in seen["argv"]
    assert seen["mode"] == 0o600 and seen["folder_mode"] == 0o700
    assert seen["env"]["env_vars"]["MLFLOW_TRACKING_PASSWORD"] == PASSWORD  # Ray still gets it
    assert not Path(seen["file"]).parent.exists()  # removed once Ray returns
    assert PASSWORD not in result.stdout + result.stderr
    # The upload: the project's root, without .git and without what .gitignore excludes.
    assert seen["cwd"] == str(ROOT) and seen["argv"][seen["argv"].index("--working-dir") + 1] == "."
    excludes = seen["env"]["excludes"]
    assert {".git", ".venv/", "/mlflow.db", ".env", "*.private.yaml", "data/big/"} <= set(excludes)


def test_ray_gets_exactly_the_gitignored_paths_to_leave_out():
    """Ray's `excludes` (gitignore syntax, pathspec) drop what git ignores from the upload and keep the code."""
    from ray._private.runtime_env.packaging import _get_excludes  # the matcher Ray applies to the upload

    from jobs.submit import ignored

    excluded = _get_excludes(ROOT, ignored(ROOT))
    for path in (".git", ".git/config", ".venv/bin/python", "work/blocks/blocks.json", "mlflow.db", "platform/mlflow/.env",
                 "platform/runtime_env.private.yaml", "jobs/__pycache__/x.pyc"):
        assert excluded(ROOT / path), path
    for path in ("jobs/submit.py", "platform/runtime_env.yaml", "data/README.md", "pyproject.toml"):
        assert not excluded(ROOT / path), path


def test_submit_refuses_to_upload_a_folder_that_is_not_the_projects_root(tmp_path):
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = x\n")
    result, seen = _submit(tmp_path, "--", "python", "-m", "jobs.pretraining", cwd=home)
    assert result.returncode == 1 and not seen  # Ray was never called
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: run python -m jobs.submit from the project's root {ROOT}, not {home}"), first
    assert "Traceback" not in result.stderr


def test_a_runtime_env_on_rays_command_line_is_refused(tmp_path):
    result, seen = _submit(tmp_path, "--runtime-env-json", json.dumps({"env_vars": {"P": PASSWORD}}), "--", "true")
    assert result.returncode == 1 and not seen
    assert result.stderr.startswith("error: jobs.submit sets Ray's --working-dir")


def _bomb(depth: int = 9) -> str:
    """A 'billion laughs' YAML: each list holds nine aliases of the one before, 9**9 items once expanded."""
    lines = ["- &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"- &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, depth)]
    return "\n".join(lines) + "\n"


def test_a_runtime_env_of_nested_aliases_is_one_quick_error_line(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    assert len(bomb.read_bytes()) < 500 and isinstance(yaml.safe_load(bomb.read_text()), list)
    start = time.monotonic()
    result, seen = _submit(tmp_path, "--runtime-env", str(bomb), "--", "true", timeout=60)
    assert time.monotonic() - start < 30 and result.returncode == 1 and not seen
    # YAML is read without aliases (jobs.config_reader.load_yaml): one line naming the file and the alias's line
    assert result.stderr.splitlines()[0].startswith(f"error: {bomb}, line 2: not valid YAML (an alias")
    # The same aliases as a value of env_vars
    bomb.write_text(_bomb().replace("- &", "  - &").replace("  - &a0", "x:\n  - &a0") + "env_vars: {P: *a8}\n")
    result, seen = _submit(tmp_path, "--runtime-env", str(bomb), "--", "true", timeout=60)
    assert result.returncode == 1 and not seen
    assert result.stderr.splitlines()[0].startswith(f"error: {bomb}, line ") and "an alias" in result.stderr
    # Without aliases, a value of the wrong type is named by its type, never formatted whole
    bomb.write_text("- a\n- b\n")
    result, seen = _submit(tmp_path, "--runtime-env", str(bomb), "--", "true", timeout=60)
    assert result.stderr.splitlines()[0] == f"error: {bomb}: a runtime env is a mapping (env_vars:, excludes:, ...), not a list"
    bomb.write_text("env_vars: {P: [1, 2]}\n")
    result, seen = _submit(tmp_path, "--runtime-env", str(bomb), "--", "true", timeout=60)
    assert result.stderr.splitlines()[0] == f"error: {bomb}: env_vars.P must be a string (quote it), not a list"
