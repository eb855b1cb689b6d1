"""What several test files share that is not a fixture: the tiny encoder, a user task, fake runs as the
jobs log them, a sweep's inputs, the attention fallback's check. A plain module (`from helpers import ...`;
pytest puts tests/ on the path), so conftest.py holds only fixtures and hooks."""

from __future__ import annotations

import atexit
import functools
import json
import os
import random
import shutil
import signal
import socket
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from tokenizers import Tokenizer

from jobs.names import (KIND_PRETRAINING, KIND_SWEEP, KIND_TAG, PRETRAINING_SEED_TAG, PRETRAINING_TAG, SEED_STAT,
                        best_task_metric)
from model import EncoderConfig, ModelConfig, ObjectiveConfig

# MLflow is imported where a helper uses it: `python -m pytest -m gpu` runs on GPU machines that have
# torch, transformers and pytest but no MLflow or Ray.
if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

GPU_TEST_MODULES = ("test_attention.py", "test_flex_attention.py", "test_compile.py", "test_step.py")

# Ray settings of the suite's own (tests/conftest.py sets them before any Ray starts, and every Ray a test
# starts inherits them), not a user's: a test that checks what a user sees drops them (as_a_users_shell).
# The suite starts dozens of Ray Train and Tune runs; three tiny pretraining runs took 99 core-seconds with
# Ray's defaults and 83 with these.
SUITE_RAY_ENV = {
    # Ray kills an idle worker process above its soft limit (the CPU count) after 1 s and boots another,
    # about 1.3 core-seconds, for the next task; a run's stages (the stream's fractional-CPU tasks, then
    # its actors) keep asking for them.
    "RAY_idle_worker_killing_time_threshold_ms": "60000",
    # Ray Train's PreemptionWatcher: an actor per run waiting for spot-node preemption notices, which a
    # local Ray never gets.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


def as_a_users_shell(env: dict[str, str]) -> dict[str, str]:
    """`env` without SUITE_RAY_ENV: for a Ray a test starts to show what a user's shows."""
    return {key: value for key, value in env.items() if key not in SUITE_RAY_ENV}


def preset_configs(preset: str, variant_name: str = "cocolm") -> tuple[ModelConfig, ObjectiveConfig, float]:
    """A preset's model and objective with a variant applied, and its crop fraction, as the pretraining job
    resolves them (`jobs.pretraining.config.resolve`, which imports without Ray, MLflow or pandas)."""
    from jobs.pretraining.config import resolve

    cfg = resolve(preset, variant_name)
    return cfg.model, cfg.objective, cfg.data.crop_fraction


WORDS = ["good", "fine", "great", "bad", "poor", "awful"]


# A fine-tuning grid of one point (one epoch at lr 1e-3): the sweeps and studies that test bookkeeping, not search.
ONE_POINT_GRID = ("max_length: 32\nspaces:\n  t: {epochs: [1], lr: [1.0e-3], batch_size: [16], warmup: [0.1]}\n"
                  "tasks: {default: t}\n")


def tiny_encoder_config(tokenizer_dir: Path) -> EncoderConfig:
    """The one tiny encoder of the fine-tuning and representation tests, sized to the test tokenizer."""
    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    return EncoderConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=2, ffn_size=64, embedding_size=32,
                         max_positions=64)


class SimulatedTritonError(RuntimeError):
    """What a kernel's probe raises in the fallback tests, as Triton's own errors did on an H100."""


def assert_falls_back_to_sdpa(enc, ids, mask, backend: str, warning: str) -> None:
    """`enc` set to `backend`, whose probe fails: its forward warns (`warning`, a regular expression) and equals
    the SDPA forward, and the next one stays on SDPA without another warning."""
    enc.set_attention("sdpa")
    expected = enc(ids, mask)
    enc.set_attention(backend)
    with pytest.warns(RuntimeWarning, match=warning):
        assert torch.equal(enc(ids, mask), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(enc(ids, mask), expected)


def sentiment_file(path: Path, n: int = 100) -> Path:
    """A user task: the label is whether the sentence's adjective is positive."""
    rows = [{"text": f"the film was {WORDS[i % 6]} and the story {i}", "label": "pos" if i % 6 < 3 else "neg"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@functools.cache
def _store_made_by_mlflow() -> Path:
    """An empty MLflow sqlite store, made once per test session by MLflow itself."""
    from mlflow.tracking import MlflowClient

    folder = tempfile.mkdtemp(prefix="cocolm-empty-store-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    database = Path(folder) / "mlflow.db"
    MlflowClient(f"sqlite:///{database}").search_experiments()  # its tables made, at this MLflow's schema
    return database


def empty_store(folder: Path) -> str:
    """The URI of a new, empty MLflow sqlite store `folder/mlflow.db`: a copy of the one MLflow made for the
    session. A new store costs MLflow its whole chain of schema migrations, about 1 s (56 new stores took 54 s
    of the fast lane's 304 s); the copy holds the same tables at the same schema version, and everything
    after that is MLflow's own. Tests of how a store is made or refused make their own."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_store_made_by_mlflow(), folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}"


def fake_pretraining_run(client: MlflowClient, exp: str, variant: str, curves: dict[str, list[float]],
                         preset: str = "tiny", seed: int | None = None) -> str:
    """A finished pretraining run as jobs.pretraining leaves it: tags and loss curves (step 10, 20, ...); with
    `seed`, tagged with its pretraining seed as jobs.studies.ablate tags it."""
    from mlflow.entities import Metric

    tags = {KIND_TAG: KIND_PRETRAINING, "preset": preset, "variant": variant}
    if seed is not None:
        tags[PRETRAINING_SEED_TAG] = str(seed)
    run_id = client.create_run(exp, run_name=f"{preset}-{variant}", tags=tags).info.run_id
    client.log_batch(run_id, metrics=[Metric(k, v, 0, 10 * (i + 1)) for k, vs in curves.items()
                                      for i, v in enumerate(vs)])
    client.set_terminated(run_id)
    return run_id


def pretraining_run_with_encoder(tmp_path: Path, exported: Path) -> tuple[str, MlflowClient, str]:
    """A fresh sqlite store holding a finished pretraining run with the exported encoder, as
    jobs.pretraining.job leaves it: (tracking URI, client, run id)."""
    from mlflow.tracking import MlflowClient

    from jobs.tracking import experiment_id

    tracking_uri = empty_store(tmp_path)
    client = MlflowClient(tracking_uri)
    run_id = client.create_run(experiment_id(client, "pretraining", tracking_uri), run_name="tiny").info.run_id
    client.log_artifacts(run_id, str(exported), "encoder")
    client.log_param(run_id, "preset", "tiny")
    client.set_terminated(run_id)
    return tracking_uri, client, run_id


def sweep_inputs(tmp_path: Path, exported: Path, monkeypatch, grid: str) -> tuple[str, MlflowClient, str, Path]:
    """What a sweep test starts from, in `tmp_path`: COCOLM_HOME there, a pretraining run holding the
    `exported` encoder, and the grid file `grid` (its YAML text): (tracking URI, client, run id, grid path)."""
    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    path = tmp_path / "grid.yaml"
    path.write_text(grid)
    return (*pretraining_run_with_encoder(tmp_path, exported), path)


def fake_sweep_run(client: MlflowClient, exp: str, pretraining_run: str, scores: dict[str, float],
                   status: str = "FINISHED", spread: float | None = None) -> str:
    """A sweep parent run as jobs.finetuning leaves it: the best point's median per task (and a mean), and
    with `spread` five seeds' scores (median + spread x -1, -1/2, 0, 1/2, 1) with their min and max."""
    run_id = client.create_run(exp, run_name="sweep", tags={KIND_TAG: KIND_SWEEP,
                                                            PRETRAINING_TAG: pretraining_run}).info.run_id
    for task, score in scores.items():
        client.log_metric(run_id, best_task_metric(task, "median"), score)
        client.log_metric(run_id, best_task_metric(task, "mean"), score - 0.5)  # never read as the median
        if spread is not None:
            client.log_metric(run_id, best_task_metric(task, "min"), score - spread)
            client.log_metric(run_id, best_task_metric(task, "max"), score + spread)
            for seed, offset in enumerate((-1.0, -0.5, 0.0, 0.5, 1.0)):
                client.log_metric(run_id, best_task_metric(task, f"{SEED_STAT}{seed}"), score + offset * spread)
    if spread is not None:
        client.log_param(run_id, "seeds", "0,1,2,3,4")
    client.set_terminated(run_id, status)
    return run_id


def stop_processes_under(folder: str) -> None:
    """End the Ray processes a test started, by their ids: give its Ray a RAY_TMPDIR of its own, `folder`;
    every process of that Ray names it in its command line or has it in its environment (Ray renames its
    agents and workers, `ray::DashboardAgent`, and they outlive the raylet). `ray stop` would end every Ray
    of this user on the machine, a study running beside the suite included. SIGKILL at once, as `ray stop
    --force` does: Ray's gcs_server, raylet and autoscaler monitor outlive a SIGTERM (a 30 s grace for it
    was spent in full every time), and nothing of a test's throwaway Ray is kept."""
    marks = (folder.encode(), f"RAY_TMPDIR={folder}".encode())

    def mine() -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and int(entry.name) != os.getpid() and (
                        marks[0] in (entry / "cmdline").read_bytes()
                        or marks[1] in (entry / "environ").read_bytes().split(b"\0")):
                    pids.append(int(entry.name))
            except OSError:  # ended meanwhile, or another user's
                continue
        return pids

    for pid in mine():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while mine() and time.monotonic() < deadline:
        time.sleep(0.5)


ABOVE_RAY_WORKER_PORTS = 20000  # Ray's default --max-worker-port is 19999 (--min-worker-port 10002)


def free_ports(count: int = 1) -> list[int]:
    """`count` distinct TCP ports nothing on this machine listens on now (all held at once while picked),
    for a test's own servers. Drawn below the OS's ephemeral range, which every bind to port 0 draws from:
    a Ray started right after binds its object manager so, and can take a port picked there and released;
    its dashboard agent, given that port, then never listens, and every job is refused for want of an
    agent. Above Ray's worker ports too."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768  # Linux's default
    candidates = list(range(ABOVE_RAY_WORKER_PORTS, ephemeral))
    random.SystemRandom().shuffle(candidates)  # not the global generator, which a test may have seeded
    sockets: list[socket.socket] = []
    try:
        for port in candidates:
            sock = socket.socket()
            try:
                sock.bind(("", port))  # every address: a port held on any one of them is taken
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
            if len(sockets) == count:
                return [sock.getsockname()[1] for sock in sockets]
        raise RuntimeError(f"fewer than {count} free ports between {ABOVE_RAY_WORKER_PORTS} and {ephemeral}")
    finally:
        for sock in sockets:
            sock.close()


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
