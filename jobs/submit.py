"""`ray job submit` that keeps the code's provenance.

    python -m jobs.submit [--address URL] [--runtime-env FILE] [ray job submit flags] -- COMMAND ...

Ray ships the working directory without `.git`, so a submitted job cannot ask git which code it runs.
This command asks git here, at submit time, and passes the answer to the job in its runtime env
(`COCOLM_GIT_COMMIT`: the commit, with `-dirty` when the tree has changes that are not committed, as
`git describe --dirty` says it); every run the job makes records it as its `git_commit` tag. Then it
runs Ray's own `ray job submit --working-dir .` with that runtime env merged into the one in FILE, so
Ray's authentication, logs and exit status are Ray's. Flags it does not know go to `ray job submit`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from jobs.cli import UserError, read_yaml, run_main
from jobs.tracking import COMMIT_ENV, git_commit

DEFAULT_ADDRESS = "http://127.0.0.1:8265"


def runtime_env(file: str | None, commit: str) -> dict[str, Any]:
    """The runtime env of FILE (platform/runtime_env.yaml or the user's), with the commit in its env_vars."""
    env = read_yaml(Path(file)) if file else {}
    if not isinstance(env or {}, dict):
        raise UserError(f"{file}: a runtime env is a mapping (env_vars:, excludes:, ...), not {env!r:.60}")
    env = dict(env or {})
    env["env_vars"] = {**(env.get("env_vars") or {}), COMMIT_ENV: commit}
    return env


def submit_command(address: str, env: dict[str, Any], ray_flags: list[str], command: list[str]) -> list[str]:
    """`ray job submit` as the README's local flow runs it, with the runtime env as JSON."""
    ray = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    return [ray, "job", "submit", "--address", address, "--working-dir", ".", "--runtime-env-json", json.dumps(env),
            *ray_flags, "--", *command]


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
    commit = git_commit(Path.cwd())
    if commit == "unknown":
        print("warning: not a git checkout here, so the job's runs record git_commit=unknown", file=sys.stderr)
    else:
        print(f"code: {commit}", flush=True)
    full = submit_command(opts.address, runtime_env(opts.runtime_env, commit), ray_flags, command)
    return subprocess.call(full)


if __name__ == "__main__":
    run_main(lambda argv: sys.exit(main(argv)))
