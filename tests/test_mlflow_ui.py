"""The MLflow UI pages the jobs link to, rendered by headless Chromium: the experiment's runs table
lists the runs, and the compare view of an ablation study lists both variant runs. Needs Debian's
`chromium` (tests/system_packages.sh installs it); without it this FAILS."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from helpers import empty_store, free_ports
from jobs.tracking import compare_url, experiment_id, run_url, runs_table_url

INSTALL = "apt-get update && apt-get install -y chromium"
# docs/design.md section 5.3: the flags Debian's chromium needs to render headless in a container.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def wait_for_health(url: str, server: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mlflow server not healthy after {timeout}s:\n{log.read_text()[-3000:]}")


def rendered_dom(chromium: str, url: str, profile: Path, budget_ms: int = 30_000) -> str:
    """The DOM after the page's scripts ran: --virtual-time-budget lets the JS app fetch and render first."""
    out = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                          f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, f"chromium failed ({out.returncode}): {out.stderr[-2000:]}"
    return out.stdout


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_compare_runs_page_lists_both_variant_runs(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:  # CI installs it (tests/system_packages.sh, the README's test command): there it must run
        message = f"headless Chromium is needed to check the MLflow UI; install it with: {INSTALL}"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    exp = experiment_id(client, "ablation-tiny", uri)
    names, run_ids = {}, []
    for variant, loss in (("cocolm", 2.5), ("rtd_only", 3.0)):
        run = client.create_run(exp, run_name=f"tiny-{variant}-uitest",
                                tags={"kind": "pretraining", "preset": "tiny", "variant": variant})
        client.log_metric(run.info.run_id, "loss", loss)
        client.set_terminated(run.info.run_id)
        names[variant], run_ids = run.info.run_name, [*run_ids, run.info.run_id]

    (port,) = free_ports()
    base = f"http://127.0.0.1:{port}"
    mlflow = Path(sys.executable).with_name("mlflow")  # the venv's entry point, next to its python
    log = tmp_path / "server.log"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    with log.open("w") as sink:
        server = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", uri, "--default-artifact-root",
             (tmp_path / "artifacts").as_uri(), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # its own group: workers too
    try:
        wait_for_health(base, server, log)
        raw = urllib.request.urlopen(base, timeout=10).read().decode()
        assert names["cocolm"] not in raw  # the names can only come from the rendered JS app
        # The page a user lands on from a job's printed link: the runs table (MLflow 3 opens an
        # experiment on an empty GenAI overview otherwise), listing both runs.
        table = rendered_dom(chromium, runs_table_url(base, exp), tmp_path / "chromium-profile")
        for name in names.values():
            assert name in table, f"run {name} not in the rendered runs table"
        assert run_url(base, exp, run_ids[0]).startswith(runs_table_url(base, exp))
        dom = rendered_dom(chromium, compare_url(base, exp, run_ids), tmp_path / "chromium-profile")
        assert "Comparing 2 Runs" in dom, dom[-3000:]
        for name in names.values():
            assert name in dom, f"run {name} not on the rendered compare page"
        assert ">variant<" in dom  # the tags table of the compare view shows the variant tag
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server we started, and its uvicorn workers
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
