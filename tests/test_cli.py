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


def one_line_in_process(capsys, monkeypatch, tmp_path: Path, main, argv: list[str], starts_with: str) -> None:
    """As `assert_one_line_error`, without a new Python per case: `run_main` in this process, with
    Ray's start trapped, so a check that ran too late fails here instead of starting Ray."""
    import jobs.ray_session
    from jobs.cli import run_main

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the mistake was found")

    for module in ("jobs.ray_session", "jobs.pretraining.job", "jobs.finetuning.tune"):
        monkeypatch.setattr(f"{module}.init_ray", no_ray)
    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("COCOLM_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_status:
        run_main(main, argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_status.value.code == 1 and lines[0].startswith(starts_with), err[-2000:]
    assert "Traceback" not in err and "--debug" in lines[-1]
    assert jobs.ray_session.init_ray is no_ray


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
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "UserError" in debug.stderr


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
def test_a_bad_override_is_one_line_naming_the_key(capsys, monkeypatch, tmp_path, override, message):
    pretrain_in_process(capsys, monkeypatch, tmp_path, ["--set", override], message)


def pretrain_in_process(capsys, monkeypatch, tmp_path: Path, args: list[str], message: str) -> None:
    from jobs.pretraining.job import main

    argv = ["--preset", "tiny", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", *args]
    one_line_in_process(capsys, monkeypatch, tmp_path, main, argv, message)
    assert finished_or_failed_runs(tmp_path) == 0  # no MLflow run was made


def test_a_tokenizer_directory_without_a_tokenizer_is_named(capsys, monkeypatch, tmp_path):
    empty = tmp_path / "tok"
    empty.mkdir()
    pretrain_in_process(capsys, monkeypatch, tmp_path, ["--tokenizer", str(empty)], f"error: tokenizer directory {empty}")


@pytest.mark.parametrize("args,message", [
    (("--workers", "0"), "error: --workers=0 is out of range: it must be 1 <= --workers"),
    (("--set", "cluster.workers=0"), "error: cluster.workers=0 is out of range: it must be 1 <= cluster.workers"),
    (("--set", "train.max_steps=-5"), "error: train.max_steps=-5 is out of range: it must be 1 <= train.max_steps"),
    (("--set", "data.mask_rate=1.5"), "error: data.mask_rate=1.5 is out of range: it must be 0 < data.mask_rate <= 1"),
    (("--set", "train.peak_lr=0"), "error: train.peak_lr=0.0 is out of range: it must be 0 < train.peak_lr"),
    (("--set", "data.batch_size=0"), "error: data.batch_size=0 is out of range"),
    (("--variant", "converged_aux"), "error: the converged_aux variant needs --set train.aux_checkpoint"),
])
def test_a_value_out_of_range_is_one_line_naming_key_and_range(capsys, monkeypatch, tmp_path, args, message):
    pretrain_in_process(capsys, monkeypatch, tmp_path, list(args), message)


def test_a_malformed_variant_file_is_one_line_naming_file_and_line(tmp_path):
    variant = ROOT / "platform" / "variants" / f"zz-broken-{os.getpid()}.yaml"
    variant.write_text("train:\n  max_steps: [4\n")
    try:
        result = pretrain(tmp_path, "--variant", variant.stem)  # as a user runs it: a new Python
    finally:
        variant.unlink()
    assert_one_line_error(result, f"error: {variant}, line 3: not valid YAML")


def test_a_bug_keeps_its_traceback(tmp_path):
    """Only a UserError is one line: a ValueError from a fault keeps the traceback that finds it."""
    code = ("from jobs.cli import run_main\n"
            "def main(argv): raise ValueError('a bug')\n"
            "run_main(main, [])\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Traceback" in result.stderr and "ValueError: a bug" in result.stderr


OPTIONS = {"jobs.pretraining.job": "PretrainOptions", "jobs.finetuning.sweep": "SweepOptions",
           "jobs.finetuning.fewshot": "FewShotOptions", "jobs.studies.ablate": "AblationOptions",
           "jobs.studies.represent": "RepresentOptions", "jobs.studies.curves": "CurvesOptions",
           "analysis.report": "ReportOptions", "jobs.data.tokenizer": "TokenizerOptions",
           "jobs.data.pack": "PackOptions", "jobs.data.stream_bench": "StreamBenchOptions"}


def test_every_numeric_option_of_every_command_has_its_range():
    """A number a user types is checked before any work: by its `bounds`, or by its own parser."""
    import dataclasses
    import importlib
    import typing

    unchecked = []
    for module, name in OPTIONS.items():
        cls = getattr(importlib.import_module(module), name)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kinds = {k for k in typing.get_args(hints[f.name]) or (hints[f.name],)} - {type(None), Ellipsis}
            kinds |= {a for k in kinds for a in typing.get_args(k)}  # tuple[int, ...]
            numeric = kinds & {int, float} and bool not in kinds
            if "help" in f.metadata and numeric and not (f.metadata["bounds"] or f.metadata["parse"]):
                unchecked.append(f"{module} --{f.name.replace('_', '-')}")
    assert not unchecked, unchecked


@pytest.mark.parametrize("args,message", [
    (("jobs.finetuning.fewshot", "--from", "x", "--splits", "6"), "error: --splits=6 is out of range: it must be 1 <= --splits <= 5"),
    (("jobs.finetuning.fewshot", "--from", "x", "--lrs", "0,1e-5"), "error: --lrs=0.0 is out of range"),
    (("jobs.finetuning", "--from", "x", "--max-length", "2"), "error: --max-length=2 is out of range"),
    (("jobs.finetuning", "--from", "x", "--cpus-per-trial", "0"), "error: --cpus-per-trial=0.0 is out of range"),
])
def test_a_fine_tuning_number_out_of_range_is_one_line_before_any_work(capsys, monkeypatch, tmp_path, args, message):
    import importlib

    module = importlib.import_module(args[0] if args[0].endswith("fewshot") else "jobs.finetuning.sweep")
    one_line_in_process(capsys, monkeypatch, tmp_path, module.main, list(args[1:]), message)


def test_a_malformed_grid_file_is_one_line_naming_file_and_line(capsys, monkeypatch, tmp_path):
    from jobs.finetuning.sweep import main

    grid = tmp_path / "grid.yaml"
    grid.write_text("spaces:\n  a: {lr: [1e-5\n")
    argv = ["--from", "x", "--grid", str(grid), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
    one_line_in_process(capsys, monkeypatch, tmp_path, main, argv, f"error: {grid}, line 3: not valid YAML")


@pytest.mark.parametrize("override,message", [
    ("train.compile_step=default", "error: train.compile_step=default needs train.fixed_shapes=true"),
    ("train.compile_step=sometimes", "error: train.compile_step must be one of"),
])
def test_step_compile_options_are_checked_before_ray_starts(capsys, monkeypatch, tmp_path, override, message):
    pretrain_in_process(capsys, monkeypatch, tmp_path, ["--set", override], message)
