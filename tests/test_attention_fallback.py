"""The Triton kernel's probe and fallback per shape, the eager warm-up before a compiled step, the count of
kernel variants compiled before step 1, and what ran, as the pretraining job logs it (docs/design.md 7.2).

The kernel tests run the real kernels under Triton's interpreter, which only TRITON_INTERPRET=1 set before
triton is first imported switches on: the `interpreted` tests run, all together, in one child pytest
started so (as tests/test_triton_attention.py explains), the probe made to run on the CPU
(`AttentionBackends.probed_device_types`), and a failure injected into the kernel's entry (`model.kernels.attention._forward`
or `_backward`) at one sequence length: the crop's, while the block's length keeps the kernel.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import os
import time
import warnings
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from helpers import empty_store

from model import ObjectiveConfig, build_pretraining_model, model_size
from model.backends import BACKENDS
from model.backends.fused import PROBE_BLOCKS, TritonShape, kernel_variants
from bench.attention import kernel_compiles
from model.corruption import random_batch
from model.encoder import Encoder, attention_fallbacks, attention_ran
from model.kernels import attention as kernels
from model.objective import to_device
from model.step import Interval, OptimizerConfig, TrainingStep, build_optimizer, compile_step

from jobs.names import ATTENTION_FALLBACKS_TAG, ATTENTION_TAG
from jobs.pretraining.checkpoint import TrainState
from jobs.pretraining.config import resolve, with_vocab_size
from jobs.pretraining.context import LoopContext
from jobs.pretraining.loop import Logger

from interpreter import run_in_interpreter_child

ROOT = Path(__file__).resolve().parents[1]
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
SEQ_LEN, CROP = 32, 28  # the block and its crop (crop fraction 0.9); the failure is injected at the crop


INTERPRETED_TESTS: list[str] = []  # names of the tests that run the kernels, for the child's command line


@functools.cache
def interpreter_child(names: tuple[str, ...]) -> tuple[dict[str, tuple[str, str]], str]:
    """Runs the interpreted tests `names` (as this session selected them) once, together, in a child pytest
    with TRITON_INTERPRET=1 (one start of torch and Triton for all, not one per test): (name -> (outcome,
    details)) from its JUnit report, and the tail of its output."""
    return run_in_interpreter_child(__file__, names)


def interpreted(test):
    """A test of the real kernels: run here under the interpreter, else in the child pytest that has it
    (every interpreted test this session selected, at once; each reports its own outcome there)."""
    INTERPRETED_TESTS.append(test.__name__)
    if INTERPRETED:
        return test
    if importlib.util.find_spec("triton") is None:
        return pytest.mark.skip(reason="triton is not installed (`pip install -e '.[test]'` installs it)")(test)

    def in_the_child(request, **params):
        node = request.node
        selected = tuple(item.name for item in node.session.items
                         if item.module is node.module and getattr(item, "originalname", None) in INTERPRETED_TESTS)
        outcomes, log = interpreter_child(selected)
        status, details = outcomes.get(node.name, ("missing", log))
        if status == "skipped":
            pytest.skip(f"in the interpreter child: {details.strip()}")
        assert status == "passed", f"{node.name} {status} in the interpreter child (TRITON_INTERPRET=1):\n{details}"

    in_the_child.__name__, in_the_child.__doc__ = test.__name__, test.__doc__
    request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    in_the_child.__signature__ = inspect.Signature([request, *inspect.signature(test).parameters.values()])
    return pytest.mark.slow(in_the_child)  # the child pytest under the interpreter


class InjectedFailure(RuntimeError):
    pass


@pytest.fixture
def fresh_state():
    """An empty memory of the shapes probed and given up (`model.backends.BACKENDS.probes`), emptied again
    after the test. Here, not in conftest.py: the interpreter child runs without conftest.py."""
    BACKENDS.probes.reset()
    yield
    BACKENDS.probes.reset()


@pytest.fixture
def probed_on_cpu(fresh_state, monkeypatch):
    """The probe runs on the CPU too (as on a GPU), from an empty memory."""
    monkeypatch.setattr(BACKENDS, "probed_device_types", ("cpu", "cuda"))


def kernel_calls(monkeypatch, fail_at: int | None = None, stage: str = "forward") -> list[tuple[str, int, tuple]]:
    """(stage, T, tiles) of every call of the kernel's entry points from now on, the tiles (0, 0) where
    they are tuned; `stage` raises at T = `fail_at`."""
    calls = []
    # q is _forward's first argument and _backward's second (after dout); the tiles follow dropout_p
    for name, position, tiles in (("forward", 0, 7), ("backward", 1, 11)):
        original = getattr(kernels, f"_{name}")

        def entry(*args, _original=original, _name=name, _position=position, _tiles=tiles, **kwargs):
            seq_len = args[_position].shape[2]
            calls.append((_name, seq_len, tuple(args[_tiles:_tiles + 2])))
            if _name == stage and seq_len == fail_at:
                raise InjectedFailure(f"injected in the {_name} at T {seq_len}")
            return _original(*args, **kwargs)

        monkeypatch.setattr(kernels, f"_{name}", entry)
    return calls


def tiny_training(attention: str = "triton"):
    """A tiny COCO-LM model (2 heads of 32) with the paper's attention dropout, its step and one batch of
    fixed shapes: blocks of SEQ_LEN, crops of CROP."""
    torch.manual_seed(0)
    model = build_pretraining_model(model_size("tiny", vocab_size=50), ObjectiveConfig()).train()
    for encoder in (m for m in model.modules() if isinstance(m, Encoder)):
        encoder.set_attention(attention)
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(), torch.device("cpu"))
    step = TrainingStep(model, model.parameters(), optimizer, scheduler, torch.device("cpu"), clip_norm=2.0)
    batch = to_device(random_batch(2, SEQ_LEN, 50, 0.9), torch.device("cpu"), fixed_rate=0.15)
    assert batch["crop_ids"].shape[1] == CROP
    return model, step, batch


def shapes_checked() -> dict[tuple[int, bool], bool]:
    return {(shape.seq_len, shape.grad): works for shape, works in BACKENDS.probes.triton_checked().items()}


@pytest.mark.parametrize("stage", ["forward", "backward"])
@interpreted
def test_a_kernel_failure_at_one_length_falls_back_there_alone_and_the_step_goes_on(stage, probed_on_cpu,
                                                                                   monkeypatch):
    """The warm-up probes every shape the step meets, eagerly: the crop's length, whose kernel fails in
    the forward or only in the backward, falls back (SDPA: attention dropout is on) with one warning
    naming the shape and the cause; the step then runs, the block's length on the kernel, silently."""
    calls = kernel_calls(monkeypatch, fail_at=CROP, stage=stage)
    model, step, batch = tiny_training()
    with pytest.warns(RuntimeWarning) as caught:
        assert step.warm_up(batch, model)
    fallbacks = [w for w in caught if "Triton attention kernel" in str(w.message)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    assert f"T {CROP}, packed, dropout 0.1, training" in str(fallbacks[0].message)
    assert f"InjectedFailure: injected in the {stage} at T {CROP}" in str(fallbacks[0].message)
    assert shapes_checked() == {(SEQ_LEN, True): True, (CROP, True): False, (SEQ_LEN, False): True}
    for tuned in (kernels._forward_tuned, kernels._dkdv_tuned, kernels._dq_tuned):  # tuned in the warm-up
        assert any(key[0] == SEQ_LEN for key in tuned.cache), tuned.cache
    calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second probe
        result = step([batch])
    assert math.isfinite(result.values[0]["loss"].item()) and math.isfinite(result.grad_norm.item())
    tuned = (0, 0)
    assert {("forward", SEQ_LEN, tuned), ("backward", SEQ_LEN, tuned)} <= set(calls)
    assert ("forward", SEQ_LEN, PROBE_BLOCKS) in calls  # the sampling pass, at the probe's tiles
    assert not [call for call in calls if call[1] == CROP]
    assert attention_ran(model) == "sdpa/triton in training passes, triton in no-grad passes"  # the crop: SDPA
    assert f"the Triton kernel at T {CROP}, packed, dropout 0.1, training" in attention_fallbacks()


@interpreted
def test_a_compiled_step_is_probed_by_its_eager_warm_up_and_a_shape_it_never_met_falls_back(probed_on_cpu,
                                                                                          monkeypatch):
    """`train.compile_step`: traced before any eager call, the step could never probe. The warm-up probes
    first, eagerly, and the compiled step then runs the kernel at the block and the crop; a shape the
    warm-up never met (a batch with padding: a new trace) falls back there, recorded, and runs on."""
    calls = kernel_calls(monkeypatch)
    model, step, batch = tiny_training()
    compile_step(model, "default", backend="aot_eager")
    assert step.warm_up(batch, model)
    probed = shapes_checked()
    assert probed == {(SEQ_LEN, True): True, (CROP, True): True, (SEQ_LEN, False): True}
    calls.clear()
    assert math.isfinite(step([batch]).values[0]["loss"].item())
    assert {(stage, seq_len) for stage in ("forward", "backward") for seq_len in (SEQ_LEN, CROP)} <= {
        call[:2] for call in calls}
    assert attention_fallbacks() == ""
    padded = dict(batch, all_real=False)
    assert math.isfinite(step([padded]).values[0]["loss"].item())
    failures = BACKENDS.probes.triton_failures()
    assert failures and all(shape.padded for shape in failures), failures
    assert all("not probed before the step was compiled" in cause for cause in failures.values())


@interpreted
def test_passes_without_gradients_run_at_the_probe_tiles_and_tune_nothing(probed_on_cpu):
    """The sampling pass (no gradients) runs the forward at `PROBE_BLOCKS`: the probe's binary, no tuning."""
    model, step, batch = tiny_training()
    encoder = model.aux.encoder
    tuned_before = dict(kernels._forward_tuned.cache)
    with torch.no_grad():
        encoder.eval()(batch["masked_ids"][:, :24], None, True)  # a T no other test tunes
    assert encoder.attention_ran == {"no-grad": "triton"}
    assert kernels._forward_tuned.cache == tuned_before  # nothing was tuned for it
    assert PROBE_BLOCKS == (64, 64)


# ----------------------------------------------------------------------------- the count before step 1


def test_the_kernel_variants_compiled_before_step_1_are_at_most_40():
    """At `tiny`'s shapes as base's (T 64: a multiple of 16 as base's 512; its crop 57 is not, as 460 is
    not): a training shape compiles its tuning's tiles, which include the probe's (`PROBE_BLOCKS`, the
    first of every list), for 3 kernels; the no-grad shape one forward at the probe's tiles. Base's
    count is the same (`python -m bench --compiles --preset base --seq-len 512`)."""
    shapes, variants = kernel_compiles("tiny", 64)
    assert sorted((s.seq_len, s.grad, s.dropout_p) for s in shapes) == [(57, True, 0.1), (64, False, 0.0),
                                                                        (64, True, 0.1)]
    assert len(variants) == 2 * sum(len(tiles) for tiles in kernels.TILES.values()) + 1 <= 40
    # T 496 shares 512's binaries (both multiples of 16): a new shape, no new variant
    shape = next(s for s in shapes if s.seq_len == 64 and s.grad)
    assert kernel_variants({shape, shape._replace(seq_len=496)}) == kernel_variants({shape})


# ----------------------------------------------------------------------------- the warm-up's order on DDP


def _warm_up_in_turn(rank: int, world_size: int, init_file: str, log: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world_size)
    BACKENDS.probed_device_types = ("cpu", "cuda")
    model, step, batch = tiny_training(attention="sdpa")

    def record(module, args):
        with open(log, "a") as handle:
            handle.write(f"{rank} {time.time()}\n")
        if rank == 0:
            time.sleep(1.0)  # rank 0's tuning takes a while; no other rank may start before it ends

    model.main.register_forward_pre_hook(record)
    step.warm_up(batch, model)
    torch.distributed.destroy_process_group()


def test_on_ddp_rank_0_warms_up_first_and_the_others_after_it(tmp_path):
    """Rank 0 tunes first, alone; the others wait at a barrier, then read its choice from Triton's
    on-disk autotuning cache. World size 2 on gloo: rank 1's warm-up starts after rank 0's has ended."""
    log = tmp_path / "log"
    torch.multiprocessing.spawn(_warm_up_in_turn, args=(2, str(tmp_path / "init"), str(log)), nprocs=2)
    starts = {int(rank): float(at) for rank, at in (line.split() for line in log.read_text().splitlines())}
    assert set(starts) == {0, 1} and starts[1] >= starts[0] + 1.0, starts


# ----------------------------------------------------------------------------- what ran, in the job


def test_the_first_progress_line_and_the_run_tags_say_which_attention_ran_and_every_fallback(tmp_path, capsys,
                                                                                             fresh_state):
    """The pretraining job's logger (rank 0) on a real MLflow store, after a real step on the CPU (SDPA):
    the first line names what ran per kind of pass, the run's tags hold it; a later line repeats it only
    when it changed: after a fallback, which it names with its cause."""
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("pretraining")).info.run_id
    cfg = with_vocab_size(resolve("tiny", "cocolm", ["data.seq_len=32", "train.max_steps=3"]), 50)
    model, step, batch = tiny_training(attention="auto")  # the CPU runs SDPA, unprobed
    logger = Logger(LoopContext(run_id, uri, ""), cfg, 0, 1, torch.device("cpu"),
                    model)

    def log_step(number: int) -> str:
        interval = Interval()
        result = step([batch])
        interval.add(result.values[0])
        interval.record(number, result.grad_norm)
        logger.log(TrainState(step=number), interval, 1e-4, result.grad_norm.item())
        return capsys.readouterr().out

    first = log_step(1)
    assert first.startswith("step 1/3") and first.rstrip().endswith(
        "| attention: sdpa in training passes, sdpa in no-grad passes"), first
    tags = client.get_run(run_id).data.tags
    assert tags[ATTENTION_TAG] == "sdpa in training passes, sdpa in no-grad passes"
    assert tags[ATTENTION_FALLBACKS_TAG] == "none"
    assert "attention" not in log_step(2)  # unchanged: said once
    shape = TritonShape("cuda:0", 12, 64, torch.bfloat16, True, 460, False, 0.1, True)
    with pytest.warns(RuntimeWarning, match="T 460"):
        assert not BACKENDS.probes.triton_works(shape, lambda: (_ for _ in ()).throw(InjectedFailure("out of resource")))
    third = log_step(3)
    assert "| attention: sdpa in training passes, sdpa in no-grad passes; fallbacks: the Triton kernel at " \
           "T 460, packed, dropout 0.1, training, bfloat16, 12 x 64 fell back to flex/SDPA " \
           "(InjectedFailure: out of resource)" in third, third
    assert "InjectedFailure: out of resource" in client.get_run(run_id).data.tags[ATTENTION_FALLBACKS_TAG]
