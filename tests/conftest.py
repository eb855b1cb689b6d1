"""Shared fixtures and hooks: one local Ray session and one small tokenizer for the whole test run.
What tests share that is not a fixture lives in helpers.py."""

from __future__ import annotations

import atexit
import fcntl
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import pytest
import torch

from helpers import GPU_TEST_MODULES, SUITE_RAY_ENV, empty_store, tiny_encoder_config
from model import Encoder
from model.export import export_encoder


def private_ray_token() -> None:
    """Ray's token authentication stays on in the tests (docs/design.md section 8), with a token of their
    own in a temporary folder (RAY_AUTH_TOKEN_PATH), so the suite leaves nothing in ~/.ray. Ray aborts on
    a RAY_AUTH_TOKEN_PATH it cannot read (it generates a missing token only at its default path), so the
    file is written here, owner-only, as `ray get-auth-token --generate` would. Every Ray the suite starts
    (in process, `ray start`, the simulated cluster) and every `ray job` command reads it. A token the
    user set (RAY_AUTH_TOKEN, or a RAY_AUTH_TOKEN_PATH that exists, as .ci/run sets) is kept."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return
    if not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        folder = tempfile.mkdtemp(prefix="cocolm-ray-auth-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ["RAY_AUTH_TOKEN_PATH"] = os.path.join(folder, "auth_token")
    path = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(32))


private_ray_token()  # at import: before any fixture or test module starts or joins a Ray

# The number of logical CPUs Ray gets in tests: 2, the size of the smallest machine we support, so
# the suite proves that the stream (fractional-CPU tasks) cannot starve or deadlock there.
RAY_TEST_CPUS = 2


def pytest_configure(config: pytest.Config) -> None:
    # Before any test module imports transformers / huggingface_hub, which read HF_HUB_OFFLINE at import.
    from jobs.env import set_hermetic_env

    set_hermetic_env()
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    for key, value in SUITE_RAY_ENV.items():
        os.environ.setdefault(key, value)
    share_the_cpus_among_workers()


def share_the_cpus_among_workers() -> None:
    """Under pytest-xdist (`-n 2`, the README's test command), each worker's torch, and every process it
    starts (Ray's workers too: Ray keeps a thread count they inherit), runs its share of the machine's
    cores in threads. Each would otherwise run as many threads as there are cores, twice as many as the
    cores in all: on the 2-core CI machine the toy GPU plan's test took 197 s so, and 114 s with one
    thread per worker (the whole suite 913 s and 837 s)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Under `pytest -n 2` (pytest-xdist; the README's test command) a test goes to whichever worker is free,
# except the tests of these files, which go to one worker together: their kernel tests run in one child
# pytest under Triton's interpreter (tests/interpreter.py) started by each worker that runs any of them,
# and a child takes about a minute.
ONE_WORKER_FILES = frozenset({"test_triton_attention.py", "test_attention_fallback.py"})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's scheduling by scope, a scope being a file of ONE_WORKER_FILES or else a single test.
    Its own `--dist loadgroup` would do it with marks, but does not group on pytest 9.2
    (pytest-dev/pytest-xdist#1386: the group is added to a node id that pytest no longer lets change).
    Another `--dist` mode asked for on the command line is kept."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerPerFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if Path(path).name in ONE_WORKER_FILES else nodeid

    return OneWorkerPerFile(config, log)


# The modules holding `gpu` tests. They import only torch, transformers and the model package, so
# `python -m pytest -m gpu` runs on a GPU machine without Ray or MLflow: such a run collects these alone.


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    marker_expression = config.getoption("markexpr") or ""
    if marker_expression.strip() == "gpu" and collection_path.suffix == ".py":
        return collection_path.name.startswith("test_") and collection_path.name not in GPU_TEST_MODULES
    return None


def start_order(item: pytest.Item) -> tuple[bool, float]:
    """The end-to-end tests (marked slow) first, the longest first (`slow(seconds=N)`: serial seconds on the
    2-core machine): under `pytest -n 2` a worker takes the next test when it is free, so the longest run
    beside each other from the start and the short ones fill the end, instead of a long one started late
    running alone at the end. (xdist starts the files of ONE_WORKER_FILES before them: it orders its
    scopes by their number of tests.)"""
    slow = item.get_closest_marker("slow")
    return slow is None, -(slow.kwargs.get("seconds", 0) if slow else 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=start_order)
    # The one place GPU tests are selected: `-m gpu` runs them on a CUDA machine; elsewhere they skip.
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="gpu test: needs a CUDA device (run `python -m pytest -m gpu` on one)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def fresh_attention_state():
    """The attention backends' process-wide memory of probes and fallbacks (`model.backends.BACKENDS.probes`,
    a `KernelProbes`), emptied for one test and again after it: a failure left by another test would
    otherwise decide this one's path, and this one's would decide the next's."""
    from model.backends import BACKENDS

    BACKENDS.probes.reset()
    yield BACKENDS.probes
    BACKENDS.probes.reset()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A COCOLM_HOME of the test's own (tracking store, checkpoints, caches), holding nothing but an empty
    tracking store at the start (`helpers.empty_store`)."""
    monkeypatch.setenv("COCOLM_HOME", str(tmp_path / "home"))
    empty_store(tmp_path / "home")
    return tmp_path / "home"


def start_the_suites_ray() -> None:
    """A local Ray with RAY_TEST_CPUS logical CPUs, started as a job starts its own
    (jobs.ray_session.start_own_ray): address="local", never a Ray that `ray start` on this machine recorded
    (another user's, or a test's own; docs/design.md section 8); a private temporary folder; workers told
    which Ray is theirs, so Ray's state API in them (Ray Train's placement-group cleaner) works beside
    another Ray on the machine: a study's, another suite's, a `ray start` test's.

    With its dashboard on 127.0.0.1, as the pretraining job starts its Ray (jobs/pretraining/job.py): the
    state API is served by the dashboard, and a Ray without one still records the dashboard's default
    address (127.0.0.1:8265) for its workers to ask. Whichever other Ray on the machine listens there
    (under `-n 2`, the other pytest worker's study or job) would answer that it knows no such Train
    controller, and the cleaner would remove a live run's placement group: its workers die, the run restarts."""
    import ray

    from jobs.ray_session import TEMP_PREFIX, no_hang_detector, temp_parent, worker_setup_hook

    ray.init(address="local", num_cpus=RAY_TEST_CPUS, include_dashboard=True, dashboard_host="127.0.0.1",
             log_to_driver=False, _temp_dir=tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=temp_parent()),
             runtime_env={"worker_process_setup_hook": worker_setup_hook()})
    no_hang_detector()


@pytest.fixture(scope="session")
def ray_local():
    """The suite's local Ray (start_the_suites_ray), shared by every test that needs Ray."""
    import ray

    started = not ray.is_initialized()
    if started:
        start_the_suites_ray()
    yield ray
    if started:
        ray.shutdown()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """A test that starts a whole Ray cluster of its own (marked ray_cluster) shuts the suite's Ray down
    first; the suite's Ray starts again once that test's fixtures are torn down (its RAY_ADDRESS with
    them), before the next test, so such a test may run anywhere in the order. Such tests end only the
    processes they started (helpers.stop_processes_under), never with `ray stop`, which ends every Ray of
    this user on the machine. The suite's Ray was running if the test used ray_local (tokenizer_dir does)."""
    result = yield
    if nextitem is not None and item.get_closest_marker("ray_cluster") and "ray_local" in item.fixturenames:
        import ray

        if not ray.is_initialized():
            start_the_suites_ray()
    return result


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """A folder `make` fills once for the whole test run. Under `pytest -n 2` the first worker to ask makes
    it in the run's temporary folder that both workers share (the parent of each worker's own), while
    the other waits on a lock; then both read it."""
    run_folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_folder = run_folder.parent
    folder = run_folder / name
    made = folder.with_name(name + ".made")  # beside the folder: tests list what the folder holds
    with open(folder.with_name(name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            made.touch()
    return folder


@pytest.fixture(scope="session")
def tokenizer_dir(ray_local, tmp_path_factory) -> Path:
    """A 1000-piece uncased SentencePiece BPE tokenizer trained once on the shipped corpus (once for both
    workers under `-n 2`: about 10 s each time)."""
    from jobs.data.corpus import shipped_corpus
    from jobs.data.tokenizer import train_tokenizer

    return made_once(tmp_path_factory, "tokenizer",
                     lambda folder: train_tokenizer(shipped_corpus(), vocab_size=1000, out_dir=folder))


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """A folder holding the first 200,000 characters' worth of records of each shipped corpus file (a
    file each, as shipped: about 1,200 blocks at tiny's T = 128, 4% of the whole), for the pretraining
    runs whose assertions need no more text (`--corpus` / data.paths). A run's first batch waits until
    its stream has read and tokenized the whole epoch (the shuffle buffer, data.shuffle_buffer, holds
    every block of the shipped corpus), and a restarted run waits again: on the busy 2-core machine the
    whole corpus's stream took 10 s, this slice's 3.4 s, and a 10-step run 42-48 s against 34-43 s."""
    import gzip
    import json

    from jobs.data.corpus import shipped_corpus

    folder = tmp_path_factory.mktemp("small_corpus")
    for path in map(Path, shipped_corpus()):
        records, chars = [], 0
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                records.append(line)
                chars += len(json.loads(line)["text"])
                if chars >= 200_000:
                    break
        (folder / path.name.removesuffix(".gz")).write_text("".join(records), encoding="utf-8")
    return folder


# ----------------------------------------------------------------------------- the tiny encoder, exported

@pytest.fixture(scope="session")
def exported(tokenizer_dir, tmp_path_factory) -> Path:
    """That encoder, randomly initialised with seed 0, exported with the test tokenizer."""
    torch.manual_seed(0)
    return export_encoder(Encoder(tiny_encoder_config(tokenizer_dir)), tmp_path_factory.mktemp("export") / "encoder",
                          tokenizer_dir=tokenizer_dir)


# ----------------------------------------------------------------------------- fake runs, as the jobs log them
