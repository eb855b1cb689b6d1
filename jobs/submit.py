"""`ray job submit` that keeps the code's provenance and ships only the project.

    python -m jobs.submit [--address URL] [--runtime-env FILE] [ray job submit flags] -- COMMAND ...

Run it from the project's root (the checkout whose pyproject.toml names cocolm-ray, the one holding
this jobs package): that folder, and nothing else, is the job's working directory, uploaded to the
cluster without what `.gitignore` excludes (`.venv`, `work/`, `mlflow.db`, `.env` files, private
runtime envs `*.private.yaml`) and without `.git`; anywhere else it refuses, saying why. Ray ships no
`.git`, so a submitted job cannot ask git which code it runs: this command asks git here, at submit
time, and passes the answer to the job in its runtime env (`COCOLM_GIT_COMMIT`: the commit, with
`-dirty` when the tree has changes that are not committed, as `git describe --dirty` says it); every
run the job makes records it as its `git_commit` tag. Then it runs Ray's own `ray job submit` with
that runtime env merged into the one in FILE, so Ray's authentication, logs and exit status are Ray's.
The merged runtime env (which may hold an MLflow password) goes to Ray as an owner-only file in a
private temporary folder, removed when Ray returns: never on a command line, where `ps` shows it to
every user for the whole job. Flags it does not know go to `ray job submit`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jobs
from jobs.cli import UserError, run_main
from jobs.config_reader import read_yaml
from jobs.tracking import COMMIT_ENV, git_commit

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
PROJECT = "cocolm-ray"  # pyproject.toml's [project] name
ROOT = Path(jobs.__file__).resolve().parent.parent  # the checkout this jobs package runs from
ALWAYS_EXCLUDED = [".git"]  # Ray ships .git otherwise; the commit travels as COCOLM_GIT_COMMIT


def project_root(cwd: Path) -> Path:
    """The folder to upload: the current one, if it is the project's own root; else a UserError saying why."""
    try:
        pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        pyproject = ""
    if not re.search(rf'^name = "{PROJECT}"$', pyproject, re.MULTILINE):  # tomllib is Python 3.11+
        raise UserError(f"{ROOT} is not a {PROJECT} checkout (no pyproject.toml naming {PROJECT}): jobs.submit "
                        "uploads the project's checkout as the job's working directory; run it from one")
    if cwd.resolve() != ROOT:
        raise UserError(f"run python -m jobs.submit from the project's root {ROOT}, not {cwd}: it uploads the "
                        "current folder to every node as the job's working directory")
    return ROOT


def ignored(root: Path) -> list[str]:
    """The patterns of root/.gitignore (gitignore syntax, which Ray's `excludes` take), plus .git (a folder, or a file in a worktree)."""
    try:
        lines = (root / ".gitignore").read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    return ALWAYS_EXCLUDED + [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def runtime_env(file: str | None, commit: str, excludes: list[str] | None = None) -> dict[str, Any]:
    """The runtime env of FILE (platform/runtime_env.yaml or the user's), with the commit in its env_vars
    and `excludes` (the project's ignored files) added to its own."""
    env = read_yaml(Path(file)) if file else {}
    # Name the type, never the value: formatting a YAML of nested aliases expands it (billion laughs).
    if not isinstance(env or {}, dict):
        raise UserError(f"{file}: a runtime env is a mapping (env_vars:, excludes:, ...), not a {type(env).__name__}")
    env = dict(env or {})
    for key, kind in (("env_vars", dict), ("excludes", list)):
        if not isinstance(env.get(key) or kind(), kind):
            raise UserError(f"{file}: {key} must be a {'mapping' if kind is dict else 'list'}, "
                            f"not a {type(env[key]).__name__}")
    for name, value in (env.get("env_vars") or {}).items():
        if not isinstance(value, str):  # Ray's env_vars are strings; a number needs quotes in YAML
            raise UserError(f"{file}: env_vars.{name} must be a string (quote it), not a {type(value).__name__}")
    env["env_vars"] = {**(env.get("env_vars") or {}), COMMIT_ENV: commit}
    if excludes:
        env["excludes"] = [*(env.get("excludes") or []), *(e for e in excludes if e not in (env.get("excludes") or []))]
    return env


def submit_command(address: str, env_file: Path, ray_flags: list[str], command: list[str]) -> list[str]:
    """`ray job submit` as the README's local flow runs it, with the runtime env in a file."""
    ray = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    return [ray, "job", "submit", "--address", address, "--working-dir", ".", "--runtime-env", str(env_file),
            *ray_flags, "--", *command]


def submit(address: str, env: dict[str, Any], ray_flags: list[str], command: list[str], cwd: Path) -> int:
    """Run `ray job submit` with `env` in an owner-only file (0600, in a 0700 folder), removed afterwards."""
    folder = tempfile.mkdtemp(prefix="cocolm-submit-")  # 0700, a name no one else can take first
    try:
        env_file = Path(folder) / "runtime_env.json"  # JSON is YAML, which `--runtime-env` reads
        with os.fdopen(os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(env, f)
        return subprocess.call(submit_command(address, env_file, ray_flags, command), cwd=cwd)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m jobs.submit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS,
                        help=f"the Ray dashboard's address (default: $RAY_ADDRESS, else {DEFAULT_ADDRESS})")
    parser.add_argument("--runtime-env", default=None, help="runtime env YAML, e.g. platform/runtime_env.yaml")
    opts, ray_flags = parser.parse_known_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        raise UserError("give the job's command after --, e.g. python -m jobs.submit -- python -m jobs.pretraining")
    if any(flag.split("=")[0] in ("--runtime-env-json", "--working-dir") for flag in ray_flags):
        raise UserError("jobs.submit sets Ray's --working-dir (the project's root) and takes the runtime env as "
                        "--runtime-env FILE: a runtime env on the command line would show its secrets in `ps`")
    root = project_root(Path.cwd())
    commit = git_commit(root)
    env = runtime_env(opts.runtime_env, commit, ignored(root))
    if commit == "unknown":
        print("warning: not a git checkout here, so the job's runs record git_commit=unknown", file=sys.stderr)
    else:
        print(f"code: {commit}", flush=True)
    return submit(opts.address, env, ray_flags, command, root)


if __name__ == "__main__":
    run_main(lambda argv: sys.exit(main(argv)))
