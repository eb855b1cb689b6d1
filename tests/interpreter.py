"""The one harness for tests of the Triton kernels on a CPU: Triton's interpreter is switched on by
TRITON_INTERPRET=1 only before triton is first imported, which a pytest session has already done, so the
kernel tests run once, together, in a child pytest started with it (one start of torch and Triton for
all of them), and each test here reports its outcome from there. Standard library only: the GPU machines
run these test files without Ray or MLflow."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_in_interpreter_child(test_file: str | Path, names: tuple[str, ...]) -> tuple[dict[str, tuple[str, str]], str]:
    """Runs the tests `names` of `test_file` in a child pytest with TRITON_INTERPRET=1 (and without
    conftest.py, which they do not need): (name -> (outcome, details)) from its JUnit report, and the tail
    of its output."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.xml"
        node_ids = [f"{Path(test_file).resolve()}::{name}" for name in names]
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                   f"--junitxml={report}", *node_ids]
        result = subprocess.run(command, cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"},
                                capture_output=True, text=True, timeout=900)
        outcomes = {}
        if report.exists():
            for case in ElementTree.parse(report).getroot().iter("testcase"):
                status, details = "passed", ""
                for tag in ("failure", "error", "skipped"):
                    element = case.find(tag)
                    if element is not None:
                        status = tag
                        details = (element.get("message") or "") + "\n" + (element.text or "")
                outcomes[case.get("name")] = (status, details)
    return outcomes, (result.stdout + result.stderr)[-4000:]
