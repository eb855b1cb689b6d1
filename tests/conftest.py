"""Shared fixtures: one local Ray session and one small tokenizer for the whole test run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The number of logical CPUs Ray gets in tests: 2, the size of the smallest machine we support, so
# the suite proves that the stream (fractional-CPU tasks) cannot starve or deadlock there.
RAY_TEST_CPUS = 2


def pytest_configure(config: pytest.Config) -> None:
    # Before any test module imports transformers / huggingface_hub, which read HF_HUB_OFFLINE at import.
    from jobs.env import set_hermetic_env

    set_hermetic_env()
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")


# The modules holding `gpu` tests. They import only torch, transformers and the model package, so
# `python -m pytest -m gpu` runs on a GPU machine without Ray or MLflow: such a run collects these alone.
GPU_TEST_MODULES = ("test_attention.py", "test_flex_attention.py", "test_compile.py", "test_step.py")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    marker_expression = config.getoption("markexpr") or ""
    if marker_expression.strip() == "gpu" and collection_path.suffix == ".py":
        return collection_path.name.startswith("test_") and collection_path.name not in GPU_TEST_MODULES
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests that start and `ray stop` a whole Ray cluster run last: `ray stop` ends every Ray
    # process on the machine, the suite's in-process session included.
    items.sort(key=lambda item: item.get_closest_marker("ray_cluster") is not None)
    # The one place GPU tests are selected: `-m gpu` runs them on a CUDA machine; elsewhere they skip.
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="gpu test: needs a CUDA device (run `python -m pytest -m gpu` on one)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with RAY_TEST_CPUS logical CPUs, shared by every test that needs Ray."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=RAY_TEST_CPUS, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def tokenizer_dir(ray_local, tmp_path_factory) -> Path:
    """A 1000-piece uncased SentencePiece BPE tokenizer trained once on the shipped corpus."""
    from jobs.corpus import shipped_corpus
    from jobs.tokenizer import train_tokenizer

    return train_tokenizer(shipped_corpus(), vocab_size=1000, out_dir=tmp_path_factory.mktemp("tokenizer"))
