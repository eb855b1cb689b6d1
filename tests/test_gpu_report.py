"""`python -m bench --gpu-report`: the plan a lent GPU runs, its time caps and budget, and its summary.
The whole plan runs here at toy shapes on the CPU, so that a typo in it shows before a GPU's minutes go."""

import subprocess
import sys

import pytest

from bench import gpu_report
from bench.gpu_report import PLAN, Check, ToyForks, figures, run_plan, toy

STEP_OUTPUT = """training step: preset=base seq_len=512 batch_size=32 attention_dropout=0.1
ours (cocolm)
device            NVIDIA H200
step time         101.5 ms
MFU               22.4%
attention         triton in training passes, triton in no-grad passes (choice: triton)
peer hf-electra (transformers, attn_implementation=sdpa)
step time         49.0 ms
MFU               26.4%
ours/peer MFU       0.85x
target MFU ours/hf-electra >= 1.0x (attention dropout 0.1): 0.85x (NOT met)
peak memory ours/hf-electra: 15.0 / 10.2 GiB
"""


def test_the_summary_has_one_line_per_figure_of_each_side():
    assert figures(STEP_OUTPUT) == [
        "ours (cocolm): step time 101.5 ms", "ours (cocolm): MFU 22.4%",
        "attention triton in training passes, triton in no-grad passes (choice: triton)",
        "peer hf-electra: step time 49.0 ms", "peer hf-electra: MFU 26.4%", "ours/peer MFU 0.85x",
        "target MFU ours/hf-electra >= 1.0x (attention dropout 0.1): 0.85x (NOT met)",
        "peak memory ours/hf-electra: 15.0 / 10.2 GiB",
    ]


def test_toy_shapes_replace_the_shape_flags_and_keep_the_rest():
    step = next(check for check in PLAN if check.name == "step-dropout0.1-triton-vs-electra")
    argv = toy(step).argv
    assert argv[argv.index("--preset") + 1] == "tiny" and argv.count("--preset") == 1
    assert argv.count("--seq-len") == argv.count("--steps") == 1 and "512" not in argv
    assert argv[-5:] == ("--compile", "--attention", "triton", "--peer", "hf-electra")
    tests = next(check for check in PLAN if check.argv[0] == "pytest")
    assert toy(tests).argv == (*tests.argv, "--collect-only")


@pytest.mark.parametrize("forked", [False, True], ids=["python-m", "forked"])
def test_a_check_past_its_cap_is_killed_and_one_the_budget_cannot_fit_is_skipped(tmp_path, forked):
    sleeper = ("timeit", "-n", "1", "-r", "1", "import time; time.sleep(30)")
    checks = [Check("quick", ("this",), 10), Check("sleeps", sleeper, 2), Check("late", ("this",), 30),
              Check("fails", ("json.tool", "missing.json"), 10),
              Check("plan-env", ("timeit", "-n", "1", "-r", "1", "import os; assert os.environ['PLAN'] == '1'"), 10)]
    # A check gets the plan's environment, forked too: from a server that started without it (another plan's).
    outcomes = run_plan(checks, tmp_path, budget_s=12, env={"PLAN": "1"}, forks=ToyForks({}) if forked else None)
    assert [o.status for o in outcomes] == ["exit 0", "timed out", "skipped (budget)", "exit 2", "exit 0"]
    assert outcomes[1].seconds < 10 and "killed at its cap" in outcomes[1].log.read_text()
    assert "Beautiful is better than ugly." in outcomes[0].log.read_text()  # the check's output, in its log
    assert "missing.json" in outcomes[3].log.read_text()


def test_an_unknown_check_is_one_usage_line():
    result = subprocess.run([sys.executable, "-m", "bench", "--gpu-report", "out", "--only", "nope"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "unknown checks ['nope']" in result.stderr.splitlines()[-1]


@pytest.mark.slow(seconds=50)
def test_the_whole_plan_runs_at_toy_shapes_on_the_cpu(tmp_path):
    # The plan as written, one check after the other, each in its own process (forked: bench.gpu_report.ToyForks;
    # alone: 49 s and 58 core-s, against 87 s and 97 with a fresh `python -m` per check). Not two halves at once:
    # under `pytest -n 2` the other worker keeps the second core busy, and two halves beside it cost 22
    # core-seconds more than one (three processes on 2 cores: 127 against 100 core-s, measured alone).
    # A budget past the plan's: on a busy AVX2-only Zen 3 the plan takes minutes, and a check the default
    # budget no longer fits would be skipped, not run.
    report = subprocess.run([sys.executable, "-m", "bench", "--gpu-report", str(tmp_path), "--toy", "--budget", "840"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=880)
    summary = (tmp_path / "summary.txt").read_text()
    assert report.returncode == 0, summary + report.stderr[-3000:]
    for check in gpu_report.PLAN:
        assert f"{check.name}: exit 0" in summary
        if "--attention-alone" in check.argv:
            assert f"{check.name}: attention alone: triton (ours), bias by distance: " in summary
        elif check.argv[0] == "bench" and "--attention-ops" not in check.argv:
            assert f"{check.name}: ours (" in summary and f"{check.name}: attention " in summary
    assert "attention-ops-dropout0.1: ops per call, backward: kernel launches 2 (dq, dkdv)" in summary
