"""What a user sees when a command is given something wrong: one line naming the problem, exit status
1, nothing started (no Ray, no MLflow run); `--debug` brings the traceback back. Run as a user runs
them, `python -m jobs.<name>` in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import one_line_in_process

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
    """The runs in the command's store. A store file that is missing or empty (the tracking check makes an
    empty one) holds none: MLflow never wrote its tables there. Opening it would make them (about 1 s)."""
    from mlflow.tracking import MlflowClient

    database = tmp_path / "m.db"
    if not database.exists() or database.stat().st_size == 0:
        return 0
    client = MlflowClient(f"sqlite:///{database}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(experiments)) if experiments else 0


def test_a_missing_corpus_is_one_line_before_ray_starts(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-corpus"
    result = pretrain(tmp_path, "--corpus", str(missing))
    assert_one_line_error(result, f"error: corpus path not found: {missing}")
    # --debug: the error itself leaves the command, and Python prints its traceback (here, in this process:
    # a second Python would only import the same modules again)
    from jobs.cli import UserError, run_main
    from jobs.pretraining.job import main

    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    with pytest.raises(UserError, match=f"corpus path not found: {missing}"):
        run_main(main, ["--preset", "tiny", "--corpus", str(missing), "--debug"])


def test_an_unwritable_storage_is_found_before_ray_and_before_any_mlflow_run(capsys, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    pretrain_in_process(capsys, monkeypatch, tmp_path, ["--storage", str(blocker / "checkpoints")],
                        f"error: storage {blocker / 'checkpoints'} is not writable")  # and no FAILED run left behind


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


@pytest.mark.parametrize("preset", ["base", "study"])
def test_a_preset_meant_for_a_real_corpus_is_refused_without_one(capsys, monkeypatch, tmp_path, preset):
    """Every preset but tiny and study-cpu is sized for a user's corpus: without --corpus it would train on
    the 3.4M-token demo text, silently. `--corpus shipped` asks for that text on purpose."""
    from jobs.pretraining.job import PretrainOptions, check_corpus, main

    argv = ["--preset", preset, "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
    one_line_in_process(capsys, monkeypatch, tmp_path, main, argv, f"error: preset {preset} trains on your corpus")
    check_corpus(PretrainOptions(preset=preset, corpus=("shipped",)).config())  # on purpose: accepted
    check_corpus(PretrainOptions(preset="study-cpu").config())  # sized for the demo corpus


def test_shipped_names_the_shipped_corpus_among_other_paths(tmp_path):
    from jobs.data.config import DataConfig
    from jobs.data.corpus import corpus_paths, shipped_corpus

    mine = str(tmp_path / "mine.jsonl")
    assert corpus_paths(DataConfig(paths=("shipped", mine))) == [*shipped_corpus(), mine]
    assert corpus_paths(DataConfig(paths="shipped")) == corpus_paths(DataConfig()) == shipped_corpus()


def test_a_local_storage_without_room_for_one_checkpoint_is_refused_before_ray(capsys, monkeypatch, tmp_path):
    """tiny's checkpoint is about 4 MiB (weights and AdamW's moments): a storage with 1 MiB free would train
    to its first checkpoint and fail there."""
    import shutil

    from jobs.pretraining.job import PretrainOptions, checkpoint_bytes

    assert 2**20 < checkpoint_bytes(PretrainOptions().config()) < 64 * 2**20
    monkeypatch.setattr("jobs.pretraining.job.shutil.disk_usage", lambda path: shutil._ntuple_diskusage(1, 0, 2**20))
    pretrain_in_process(capsys, monkeypatch, tmp_path, ["--storage", str(tmp_path / "small")],
                        f"error: storage {tmp_path / 'small'} has 1.0 MiB free, less than one checkpoint")


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


def test_a_malformed_variant_file_is_one_line_naming_file_and_line(capsys, monkeypatch, tmp_path):
    variant = ROOT / "platform" / "variants" / f"zz-broken-{os.getpid()}.yaml"
    variant.write_text("train:\n  max_steps: [4\n")
    try:
        pretrain_in_process(capsys, monkeypatch, tmp_path, ["--variant", variant.stem],
                            f"error: {variant}, line 3: not valid YAML")
    finally:
        variant.unlink()


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


# ----------------------------------------------------------------------------- names, files and runs a user gives

LAUGHS = "".join(f"- &{c} [{', '.join([f'*{p}' if p else 'lol'] * 9)}]\n"
                 for p, c in zip(["", *"abcdefgh"], "abcdefghi"))  # 9^9 strings once expanded, in 387 bytes


def test_a_billion_laughs_file_is_one_quick_error(capsys, monkeypatch, tmp_path):
    """Loading it was safe, but the error message formatted the whole expanded value (minutes, GBs)."""
    import time

    from jobs.finetuning.sweep import main

    grid = tmp_path / "laughs.yaml"
    grid.write_text(LAUGHS)
    started = time.perf_counter()
    argv = ["--from", "x", "--grid", str(grid), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
    one_line_in_process(capsys, monkeypatch, tmp_path, main, argv, f"error: {grid}, line 2: not valid YAML (an alias")
    assert time.perf_counter() - started < 10


def test_an_error_message_shows_a_huge_value_without_walking_it():
    import time

    import yaml

    from jobs.cli import short_repr

    expanded = yaml.safe_load(LAUGHS)  # what a loader that accepts aliases gives: 9^9 strings
    started = time.perf_counter()
    shown = short_repr(expanded)
    assert len(shown) <= 60 and shown.startswith("[['lol', 'lol'") and time.perf_counter() - started < 0.1


@pytest.mark.parametrize("args,message", [
    (["--name", "it's"], "error: --name \"it's\" is not a safe name"),
    (["--name", "../../elsewhere"], "error: --name '../../elsewhere' is not a safe name"),
    (["--experiment", "../../elsewhere"], "error: --experiment '../../elsewhere' is not a safe name"),
])
def test_names_that_would_leave_their_folder_or_break_a_filter_are_refused(capsys, monkeypatch, tmp_path, args, message):
    pretrain_in_process(capsys, monkeypatch, tmp_path, args, message)


def test_a_preset_path_outside_the_presets_folder_is_refused(capsys, monkeypatch, tmp_path):
    """A preset file outside platform/presets, named by a relative path, used to be loaded, and the run's
    checkpoints went where its name pointed."""
    from jobs.pretraining.config import PRESETS
    from jobs.pretraining.job import main

    (tmp_path / "x.yaml").write_text((PRESETS / "tiny.yaml").read_text())
    escape = os.path.relpath(tmp_path / "x", PRESETS)
    argv = ["--preset", escape, "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
    one_line_in_process(capsys, monkeypatch, tmp_path, main, argv, f"error: preset {escape!r:.80} is not a safe name")


def named_run(tmp_path: Path, name: str, status: str, *overrides: str) -> str:
    """A run of `jobs.pretraining --preset tiny --name NAME` as the job leaves it (its params and tags),
    in the sqlite store the tests' commands use; its run id."""
    from mlflow.tracking import MlflowClient

    from jobs.names import RUN_KEY_TAG
    from jobs.pretraining.config import resolve
    from jobs.tracking import experiment_id, log_params

    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    run_id = client.create_run(experiment_id(client, "pretraining", uri), run_name=name,
                               tags={RUN_KEY_TAG: name}).info.run_id
    log_params(client, run_id, resolve("tiny", "cocolm", list(overrides)).flat())
    client.set_terminated(run_id, status)
    return run_id


def run_status(tmp_path: Path, run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{tmp_path}/m.db").get_run(run_id).info.status


@pytest.mark.parametrize("status", ["FINISHED", "FAILED"])
def test_a_named_run_with_a_changed_setting_is_one_error_and_keeps_its_status(capsys, monkeypatch, tmp_path, status):
    """Used to mark the run RUNNING, start Ray, then fail on MLflow's "Changing param values is not
    allowed" and leave it RUNNING; a FINISHED one said "already finished" and ran nothing (exit 0)."""
    from jobs.pretraining.job import main

    run_id = named_run(tmp_path, "mine", status, "train.peak_lr=0.001")
    capsys.readouterr()  # MLflow's lines from making that store
    argv = ["--preset", "tiny", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--name", "mine"]
    one_line_in_process(capsys, monkeypatch, tmp_path, main, argv + ["--set", "train.peak_lr=0.002"],
                        f"error: run mine (MLflow run {run_id}, {status}) has other settings: "
                        f"train.peak_lr was 0.001, now 0.002")
    assert run_status(tmp_path, run_id) == status
    assert not list((tmp_path / "home" / "ray_results" / "mine").iterdir())  # the lock is gone too


def test_the_same_settings_still_resume_and_the_run_is_private_from_its_first_file(monkeypatch, tmp_path):
    """The README's resume: the same command goes on past every check (to Ray, trapped here). What it
    made is owner-only: $COCOLM_HOME, the tracking database, the run's checkpoint folder."""
    from jobs.pretraining.job import main

    run_id = named_run(tmp_path, "mine", "FAILED", "train.peak_lr=0.001")

    def ray_starts(*args, **kwargs):
        raise RuntimeError("Ray starts here")

    monkeypatch.setattr("jobs.pretraining.job.init_ray", ray_starts)
    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    with pytest.raises(RuntimeError, match="Ray starts here"):
        main(["--preset", "tiny", "--name", "mine", "--set", "train.peak_lr=0.001"])
    assert run_status(tmp_path, run_id) == "FAILED"  # not touched before Ray: it is marked when training starts
    home = tmp_path / "home"
    assert [(p.name, p.stat().st_mode & 0o777) for p in (home, home / "mlflow.db", home / "ray_results" / "mine")] \
        == [("home", 0o700), ("mlflow.db", 0o600), ("mine", 0o700)]
    assert list((home / "ray_results" / "mine").iterdir()) == []  # its lock released on the way out


def test_a_run_another_command_holds_is_refused_with_who_holds_it(capsys, monkeypatch, tmp_path):
    """Two identical commands 2 s apart used to both run to the end on one MLflow run."""
    import getpass
    import socket

    from jobs.pretraining.job import main
    from jobs.tracking import holding_run

    argv = ["--preset", "tiny", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--name", "mine"]
    with holding_run(str(tmp_path / "home" / "ray_results"), "mine"):  # the first command, live (this process)
        one_line_in_process(capsys, monkeypatch, tmp_path, main, argv,
                            f"error: run mine is live: it is held by {getpass.getuser()}'s command, pid {os.getpid()} "
                            f"on {socket.gethostname()}, since ")
    assert finished_or_failed_runs(tmp_path) == 0


def test_a_repeated_list_flag_adds_to_the_list_in_every_command():
    """`--corpus a.jsonl --corpus b.txt` trained on b.txt alone (argparse kept the last flag's values)."""
    import argparse
    import dataclasses
    import importlib

    from jobs.cli import add_options, parse_options
    from jobs.pretraining.job import PretrainOptions

    lists = []
    for module, name in OPTIONS.items():
        cls = getattr(importlib.import_module(module), name)
        for f in dataclasses.fields(cls):
            if f.metadata.get("many"):
                parser = argparse.ArgumentParser()
                add_options(parser, cls, only=[f.name])
                flag = "--" + f.name.replace("_", "-")
                assert getattr(parser.parse_args([flag, "a", flag, "b", "c"]), f.name) == ["a", "b", "c"], flag
                assert getattr(parser.parse_args([]), f.name) in (None, []), flag
                lists.append(f"{module} {flag}")
    assert "jobs.pretraining.job --corpus" in lists and len(lists) >= 5, lists
    opts = parse_options("p", None, PretrainOptions, ["--corpus", "a.jsonl", "--corpus", "b.txt"])
    assert opts.corpus == ("a.jsonl", "b.txt") and tuple(opts.config().data.paths) == ("a.jsonl", "b.txt")


def test_a_tracking_store_that_is_not_a_database_is_one_line_before_any_work(capsys, monkeypatch, tmp_path):
    """An mlflow.db whose first 8 KB were overwritten: SQLAlchemy's DatabaseError with its traceback before."""
    from mlflow.tracking import MlflowClient

    from jobs.finetuning.sweep import main as sweep
    from jobs.studies.probe import main as probe
    from jobs.tracking import check_sqlite

    store = tmp_path / "mlflow.db"
    MlflowClient(f"sqlite:///{store}").search_experiments()  # a real store first: its tables made
    check_sqlite(f"sqlite:///{store}")
    capsys.readouterr()  # MLflow's lines about making the tables
    with store.open("r+b") as f:
        f.write(os.urandom(8192))
    uri = f"sqlite:///{store}"
    expected = f"error: the tracking store {uri} cannot be read: {store} is not a usable SQLite database"
    one_line_in_process(capsys, monkeypatch, tmp_path, sweep,
                        ["--from", "last", "--tasks", "snli", "--grid", "quick", "--tracking-uri", uri], expected)
    one_line_in_process(capsys, monkeypatch, tmp_path, probe, ["--from-experiment", "pretraining", "--tracking-uri", uri],
                        expected)
    check_sqlite(f"sqlite:///{tmp_path}/absent.db")  # a store that is only read is not made
    assert not (tmp_path / "absent.db").exists()
