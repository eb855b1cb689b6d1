"""Everything a lent GPU should measure, in one command that never stops at the first failure:

    python -m bench --gpu-report OUTDIR [--budget SECONDS] [--only CHECK,...] [--toy]

Runs the plan below, most important first, each check a child process under its own time cap and all
of them inside one budget (540 s: 9 minutes of a 10-minute window); a check the budget no longer fits
is recorded as skipped, never started. Writes OUTDIR/NN-name.log per check (its command line first),
OUTDIR/summary.txt with one line per figure (ms per call, MFU, ratios, what attention ran, each
check's exit status and time) and OUTDIR/versions.txt. The same command on a new cluster's GPU node
shows whether the GPU path works there. Needs only torch, transformers and pytest (no Ray, no MLflow).

`--toy` runs the same plan at toy shapes on the CPU (preset tiny, a short sequence, one step, the
compiler's aot_eager backend, the Triton kernel under its interpreter), so a typo in the plan shows on
a laptop and in the test suite, not in the first minutes on a GPU. There each check is forked from one
process that imported torch, transformers, the bench and pytest once (`ToyForks`), instead of a fresh
`python -m` that imports them again: at toy shapes the imports were 40% of the plan's CPU time.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.forkserver
import os
import re
import runpy
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

try:
    import triton
except ImportError:  # the CPU wheel of torch brings none
    triton = None

DEFAULT_BUDGET_S = 540
BASE = ("--preset", "base", "--seq-len", "512", "--batch-size", "32", "--steps", "10", "--warmup", "3")
TOY = ("--preset", "tiny", "--seq-len", "16", "--batch-size", "1", "--steps", "1", "--warmup", "1",
       "--device", "cpu", "--compile-backend", "aot_eager")
SHAPE_FLAGS = {"--preset", "--seq-len", "--batch-size", "--steps", "--warmup"}
TOY_CAP_S = 480.0
NO_DROPOUT = ("--attention-dropout", "0")
# -v: each test's outcome is in the log as it ends, even if the cap kills the run before its tally
PYTEST = ("pytest", "-v", "-p", "no:cacheprovider")


@dataclass(frozen=True)
class Check:
    name: str
    argv: tuple[str, ...]  # after `python -m`
    cap_s: int


def _bench(*flags: str) -> tuple[str, ...]:
    return ("bench", *BASE, *flags)


# Most important first: the attention call, the kernel's correctness on this device (every test of it;
# on a CPU they run it under the interpreter), the step against the ELECTRA peer with the paper's
# attention dropout (per layer compiled, then the whole step as CUDA graphs), SDPA's step for 'auto';
# then the marked GPU tests, the fast setting (no attention dropout), the remaining peers. The caps add
# up to about 19 minutes: the default budget runs the first six or seven, `--budget 1200` all of them.
PLAN = (
    Check("attention-alone-dropout0.1", _bench("--attention-alone", "--profile", "--steps", "30"), 60),
    Check("tests-triton-kernel", (*PYTEST, "tests/test_triton_attention.py"), 100),
    Check("attention-ops-dropout0.1", _bench("--attention-ops"), 30),
    Check("step-dropout0.1-triton-vs-electra", _bench("--compile", "--attention", "triton", "--peer", "hf-electra"), 130),
    # the whole step as CUDA graphs; --compile gives the peer its per-layer compile
    Check("step-dropout0.1-cuda-graphs-vs-electra", _bench("--compile", "--fixed-shapes", "--compile-step",
                                                           "reduce-overhead", "--attention", "triton", "--peer",
                                                           "hf-electra"), 170),
    Check("step-dropout0.1-sdpa", _bench("--compile", "--attention", "sdpa"), 70),
    # 90 s on an H200 with 8 workers, two of its tests failing early; passing, they train 5 compiled steps
    Check("tests-gpu-marked", (*PYTEST, "-m", "gpu"), 180),
    Check("step-dropout0.1-compiled-whole", _bench("--fixed-shapes", "--compile-step", "default",
                                                   "--attention", "triton"), 110),
    Check("attention-alone-dropout0", _bench("--attention-alone", *NO_DROPOUT, "--steps", "30"), 50),
    Check("step-dropout0-auto-vs-electra", _bench("--compile", *NO_DROPOUT, "--peer", "hf-electra"), 110),
    Check("step-dropout0-triton", _bench("--compile", *NO_DROPOUT, "--attention", "triton"), 60),
    Check("step-roberta-vs-hf-roberta", _bench("--compile", "--variant", "roberta_mlm", "--peer", "hf-roberta"), 80),
)


def check_names() -> list[str]:
    return [check.name for check in PLAN]


def toy(check: Check) -> Check:
    """The same check at toy shapes on the CPU: the bench's shape flags replaced, the compiler on
    aot_eager; pytest only collects (the suite runs these tests on the CPU anyway). A cap is the GPU's
    time for the check: on a busy 2-core CPU the toy attention-ops check took 26 s of its 30, so a toy
    check gets TOY_CAP_S. That bounds a hung check, not a slow machine's: beside other work on a busy
    2-core Zen 4 a toy check took up to 99 s, which is about 250 s on an AVX2-only Zen 3, 2.5 times slower."""
    if check.argv[0] == "pytest":
        return Check(check.name, (*check.argv, "--collect-only"), TOY_CAP_S)
    argv, flags = [], iter(check.argv[1:])
    for flag in flags:
        if flag in SHAPE_FLAGS:
            next(flags)
        else:
            argv.append(flag)
    return Check(check.name, ("bench", *TOY, *argv), TOY_CAP_S)


@dataclass(frozen=True)
class Outcome:
    check: Check
    status: str  # "exit 0", "exit 1", "timed out", "skipped (budget)"
    seconds: float
    log: Path | None


class ToyForks:
    """How the toy plan starts its checks: each forked from one server process (multiprocessing's
    forkserver) that imported torch, transformers, the bench and pytest once, with the plan's environment
    (TRITON_INTERPRET=1 before triton's import). Each check is still a process of its own, in its own
    process group, under its cap, its output in its log: at toy shapes on the 2-core machine the plan's test
    took 58 core-seconds so against 97 with a fresh `python -m` per check, whose imports were the difference.
    On a GPU every check stays a fresh `python -m` process, the command a user would type."""

    PRELOAD = ("torch", "torch._dynamo", "transformers", "pytest", "bench.cli", "bench.peers", "bench.steps")

    def __init__(self, env: dict[str, str]) -> None:
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(self.PRELOAD))
        # The server is multiprocessing's, one per process, started with this process's environment and kept:
        # a process runs one toy plan (the bench's command line).
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def start(self, argv: tuple[str, ...], log: Path, env: dict[str, str]) -> "ForkedCheck":
        process = self.context.Process(target=_forked_check, args=(argv, str(log), env))
        process.start()
        return ForkedCheck(process)


class ForkedCheck:
    """A forked check as `subprocess.Popen` is waited for: its pid, `wait(timeout)`."""

    def __init__(self, process: multiprocessing.Process) -> None:
        self.process, self.pid = process, process.pid

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"check {self.pid}", timeout)
        return self.process.exitcode


def _forked_check(argv: tuple[str, ...], log: str, env: dict[str, str]) -> None:
    """In the forked process: its own process group, the check's environment (as `Popen(env=...)` gives it;
    what the preloaded modules read at import is the server's), its output to `log`, then `python -m argv`."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    out = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


def run_check(check: Check, log: Path, cap_s: float, env: dict[str, str], forks: ToyForks | None = None) -> Outcome:
    """One check in its own process group (a timeout kills the compile workers too), output to `log`:
    a `python -m` child, or forked by `forks`."""
    command = [sys.executable, "-m", *check.argv]
    start = time.perf_counter()
    with log.open("w") as out:
        out.write(f"== {check.name} (cap {cap_s:.0f} s): python -m {' '.join(check.argv)}\n")
        out.flush()
        if forks is None:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        else:
            process = forks.start(check.argv, log, env)
        try:
            status = f"exit {process.wait(timeout=cap_s)}"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = "timed out"
            out.write(f"\n== killed at its cap of {cap_s:.0f} s\n")
    return Outcome(check, status, time.perf_counter() - start, log)


def run_plan(checks: list[Check], out: Path, budget_s: float, env: dict[str, str],
             forks: ToyForks | None = None) -> list[Outcome]:
    """Every check in order, each capped at the smaller of its cap and what is left of the budget; one
    that would get less than a third of its cap is skipped. Progress goes to stdout as it happens."""
    deadline = time.perf_counter() + budget_s
    outcomes = []
    for number, check in enumerate(checks, 1):
        left = deadline - time.perf_counter()
        if left < check.cap_s / 3:
            outcomes.append(Outcome(check, "skipped (budget)", 0.0, None))
        else:
            outcomes.append(run_check(check, out / f"{number:02d}-{check.name}.log", min(check.cap_s, left), env,
                                      forks))
        print(f"{check.name:40s} {outcomes[-1].status:18s} {outcomes[-1].seconds:6.1f} s", flush=True)
    return outcomes


# Lines of the bench's output that are figures, and what a summary line calls them.
_SIDE = re.compile(r"^(ours \(.*\)|peer \S+)")
_SIDE_FIGURES = ("step time", "MFU", "tokens/s", "peak memory")
_ATTENTION_ROW = re.compile(r"^(.+?)\s{2,}(\s*[\d.]+ ms\s+[\d.]+ ms.*|n/a.*)$")


def figures(log_text: str) -> list[str]:
    """The figures in one check's log, one per line: per side its step time, MFU, tokens/s and memory;
    the ratios, what attention ran, the targets; attention alone's ms per call; pytest's tally."""
    found, side = [], ""
    for line in log_text.splitlines():
        if line.startswith("attention alone:"):  # the header, not a figure
            continue
        if match := _SIDE.match(line):
            side = match.group(1)
        elif line.startswith(("ours/peer", "attention ", "target", "peak memory ours")):
            found.append(re.sub(r"\s{2,}", " ", line.strip()))
        elif side and line.startswith(_SIDE_FIGURES) and len(parts := re.split(r"\s{2,}", line.strip(), 1)) == 2:
            found.append(f"{side}: {parts[0]} {parts[1]}")
        elif (match := _ATTENTION_ROW.match(line)) and not line.startswith((" ", "attention alone:")):
            found.append(f"attention alone: {match.group(1).strip()}: {' '.join(match.group(2).split())}"
                         " (forward; forward + backward)")
        elif re.match(r"^=*\s*\d+ (passed|failed|skipped|error)", line) or re.search(r"\d+ (passed|failed) in ", line):
            found.append("pytest: " + line.strip(" ="))
        elif line.startswith(("ops per call", "host ")) or re.match(r"^\d+ tests? collected", line):
            found.append(line.strip())
    return found


def summary(outcomes: list[Outcome]) -> str:
    lines = []
    for outcome in outcomes:
        name = outcome.check.name
        lines.append(f"{name}: {outcome.status} in {outcome.seconds:.0f} s")
        if outcome.log is not None:
            lines += [f"{name}: {figure}" for figure in figures(outcome.log.read_text(errors="replace"))]
    return "\n".join(lines) + "\n"


def versions() -> str:
    triton_version = "none" if triton is None else triton.__version__
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (no CUDA device)"
    return (f"device {device}\ntorch {torch.__version__}\ntriton {triton_version}\n"
            f"transformers {transformers.__version__}\npython {sys.version.split()[0]}\n")


def gpu_report(out: Path, budget_s: float = DEFAULT_BUDGET_S, toy_shapes: bool = False,
               only: list[str] | None = None) -> list[Outcome]:
    """Runs the plan (or the checks named in `only`, in the plan's order) and writes the report."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "versions.txt").write_text(versions())
    env = dict(os.environ)
    checks = [check for check in PLAN if not only or check.name in only]
    if importlib.util.find_spec("xdist") and not toy_shapes:  # the kernel's tests in parallel, on one GPU
        checks = [Check(c.name, (*c.argv, "-n", "8"), c.cap_s) if c.argv[0] == "pytest" else c for c in checks]
    if toy_shapes:
        checks = [toy(check) for check in checks]
        env["TRITON_INTERPRET"] = "1"  # the Triton kernel runs on the CPU under its interpreter
    print(f"gpu report: {len(checks)} checks within {budget_s:.0f} s, logs in {out}", flush=True)
    outcomes = run_plan(checks, out, budget_s, env, ToyForks(env) if toy_shapes else None)
    (out / "summary.txt").write_text(summary(outcomes))
    print((out / "versions.txt").read_text() + (out / "summary.txt").read_text(), end="")
    return outcomes
