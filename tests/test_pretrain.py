"""Pretraining on Ray Train with MLflow: the job end to end, resume, failure recovery, config rules."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from helpers import as_a_users_shell, free_ports, stop_processes_under
from jobs import faults
from jobs.cli import UserError
from jobs.names import ATTENTION_FALLBACKS_TAG, ATTENTION_TAG, PRECISION_TAG, STOP_TAG
from jobs.tracking import git_commit

from jobs.pretraining import checkpoint
from jobs.pretraining.checkpoint import TrainState
from jobs.pretraining.config import (available_presets, available_variants, from_dict, from_yaml, resolve, to_yaml,
                                     with_vocab_size)
from jobs.pretraining.job import check_compile_toolchain, run
from jobs.pretraining.loop import LONG_SHARD, build_training, merged_precision, phase, resumed_seed
from model import VARIANTS
from model.corruption import random_batch

ROOT = Path(__file__).resolve().parents[1]
PAPER_SIGNALS = [
    "loss", "aux_mlm_loss", "copy_loss", "lm_loss", "clm_loss", "scl_loss", "aux_mlm_accuracy",
    "copy_accuracy_replaced", "copy_accuracy_original", "lm_accuracy_replaced", "lm_accuracy_original",
    "scl_positive_cosine", "scl_negative_cosine", "learning_rate", "grad_norm", "tokens_per_second",
    "cpu_worker_hours", "corpus_documents",
]


def tiny_overrides(tokenizer_dir: Path, *extra: str, corpus: Path | None = None) -> list[str]:
    paths = [f"data.paths=[{str(corpus)!r}]"] if corpus else []
    return [f"data.tokenizer_dir={tokenizer_dir}", *paths, "train.warmup_steps=5", "train.log_every=5", *extra]


def tiny(tokenizer_dir: Path, *extra: str, corpus: Path | None = None):
    """The tiny cocolm config of the Ray tests: the shared test tokenizer, short warm-up, a log line every 5
    steps; a run that trains reads the `small_corpus` slice (its stream is ready in a third of the time)."""
    return resolve("tiny", "cocolm", tiny_overrides(tokenizer_dir, *extra, corpus=corpus))


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


# ----------------------------------------------------------------------------- config


def test_every_preset_resolves_with_every_variant():
    for preset in available_presets():
        for name in available_variants():
            cfg = resolve(preset, name)
            assert cfg.model.hidden_size % cfg.model.num_heads == 0
    assert resolve("tiny", "crop_0.7").data.crop_fraction == 0.7
    assert resolve("base", "no_rel_pos").model.relative_position is False
    assert set(available_presets()) == {"tiny", "small", "study", "study-cpu", "base", "base++", "large++"}


def test_a_config_comes_back_equal_from_its_plain_data_and_from_its_yaml():
    """The Ray Train workers get the config as plain data (`jobs.pretraining.job.loop_config`), a resumed
    run reads it from its config.yaml: each comes back as the config, the workers' with the credentials
    in the corpus URIs that config.yaml redacts."""
    uri = "s3://key:secret@bucket/corpus.jsonl"
    for preset in available_presets():
        for name in available_variants():
            cfg = resolve(preset, name, [f"data.paths=['{uri}']", "train.seed=7"])
            back = from_dict(cfg.to_dict())
            assert back == cfg and back.data.paths == (uri,)
            assert from_yaml(to_yaml(cfg)) == cfg.redacted() != cfg


def test_yaml_variants_extend_a_built_in_one(tmp_path, monkeypatch):
    assert resolve("tiny", "cocolm_reuse_logits").objective.sample_in_eval is False
    assert resolve("tiny", "cocolm_gathered_negatives").objective.scl_gather is True
    import jobs.pretraining.config

    monkeypatch.setattr(jobs.pretraining.config, "VARIANT_FILES", tmp_path)
    (tmp_path / "electra_long_crop.yaml").write_text("extends: electra\ndata: {crop_fraction: 0.7}\n")
    cfg = resolve("tiny", "electra_long_crop")
    assert cfg.objective.use_lm is False and cfg.model.aux_width_divisor == 3 and cfg.data.crop_fraction == 0.7
    (tmp_path / "typo.yaml").write_text("objective: {scl_wieght: 2}\n")
    with pytest.raises(ValueError, match="objective.scl_wieght"):
        resolve("tiny", "typo")
    (tmp_path / "bad_base.yaml").write_text("extends: bert\n")
    with pytest.raises(ValueError, match="extends 'bert'"):
        resolve("tiny", "bad_base")


def test_a_presets_word_on_one_variant_comes_after_the_variant_and_before_the_user(tmp_path, monkeypatch):
    """A preset's `variants:` section sets keys for one variant only, over that variant's own overlays
    (which come after the preset's sections); the user's --set still has the last word."""
    assert resolve("tiny", "electra").objective.electra_head is True  # the variant's own head
    assert resolve("study-cpu", "electra").objective.electra_head is False  # the recipe's word on electra
    assert resolve("study-cpu", "electra", ["objective.electra_head=true"]).objective.electra_head is True
    import jobs.pretraining.config

    monkeypatch.setattr(jobs.pretraining.config, "PRESETS", tmp_path)
    (tmp_path / "recipe.yaml").write_text("model: {size: tiny}\ntrain: {max_steps: 7}\n"
                                          "variants:\n  roberta_mlm: {train: {max_steps: 9}}\n")
    assert resolve("recipe", "roberta_mlm").train.max_steps == 9 and resolve("recipe", "cocolm").train.max_steps == 7
    assert resolve("recipe", "roberta_mlm", ["train.max_steps=11"]).train.max_steps == 11
    (tmp_path / "bad_name.yaml").write_text("variants: {bert: {train: {max_steps: 9}}}\n")
    with pytest.raises(UserError, match=r"variants: unknown variant\(s\) \['bert'\]"):
        resolve("bad_name", "cocolm")  # named whichever variant runs
    (tmp_path / "bad_section.yaml").write_text("variants: {electra: {trian: {max_steps: 9}}}\n")
    with pytest.raises(UserError, match=r"variants: electra: unknown section\(s\) \['trian'\]"):
        resolve("bad_section", "cocolm")
    (tmp_path / "bad_key.yaml").write_text("variants: {electra: {objective: {electra_haed: false}}}\n")
    with pytest.raises(ValueError, match="objective.electra_haed"):
        resolve("bad_key", "electra")


def test_overrides_are_typed_and_have_the_last_word():
    cfg = resolve("tiny", "crop_0.7", ["train.peak_lr=3e-4", "data.crop_fraction=0.8", "model.num_layers=3"])
    assert cfg.train.peak_lr == 3e-4 and isinstance(cfg.train.peak_lr, float)  # YAML reads 3e-4 as a string
    assert cfg.data.crop_fraction == 0.8 and cfg.model.num_layers == 3


@pytest.mark.parametrize("override,message", [
    ("train.lr=1", "train.lr"),
    ("optim.lr=1", "unknown section 'optim'"),
    ("train.max_steps", "expected section.key=value"),
    ("objective.use_scl=maybe", "must be true or false"),
    ("train.max_steps=many", "train.max_steps=.many. is not a whole number"),
    ("train.max_steps=[5", r"--set train.max_steps: cannot read the value '\[5'"),  # was a 48-line PyYAML traceback
    ("model.vocab_size=500", "set data.vocab_size"),  # one vocabulary size: the tokenizer's
])
def test_bad_config_is_an_error_that_names_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        resolve("tiny", "cocolm", [override])


def test_optimizer_keys_moved_under_adamw_are_named_and_old_checkpoints_still_load():
    cfg = resolve("tiny", "cocolm", ["train.adamw.eps=1e-8", "train.adamw.beta2=0.99"])
    assert (cfg.train.adamw.eps, cfg.train.adamw.beta2, cfg.train.adamw.beta1) == (1e-8, 0.99, 0.9)
    assert cfg.flat()["train.adamw.eps"] == 1e-8  # MLflow params name the nested key in full
    with pytest.raises(ValueError, match="train.adam_eps is now train.adamw.eps"):
        resolve("tiny", "cocolm", ["train.adam_eps=1e-8"])
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['train.adamw.beta3'\]"):
        resolve("tiny", "cocolm", ["train.adamw.beta3=0.5"])
    old = to_yaml(cfg).replace("  adamw:\n", "  adamw_was:\n")  # a checkpoint's config from before the move
    old = old.replace("adamw_was:\n    weight_decay: 0.01\n    beta1: 0.9\n    beta2: 0.99\n    eps: 1.0e-08\n",
                      "weight_decay: 0.01\n  adam_beta1: 0.9\n  adam_beta2: 0.99\n  adam_eps: 1.0e-08\n")
    assert "adam_eps" in old and from_yaml(old) == cfg


def test_every_numeric_config_key_has_a_range_and_every_preset_is_inside_them():
    from jobs.pretraining.config import RANGES

    for preset in available_presets():
        flat = resolve(preset).flat()
        numeric = {k for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        assert numeric <= set(RANGES), sorted(numeric - set(RANGES))  # a new numeric key needs its range
        for key in numeric:
            RANGES[key].check(key, flat[key])


def test_a_run_resumed_on_a_cpu_that_computes_otherwise_keeps_both_precisions_in_its_tag():
    """cocolm.precision after each (re)start: the claims never pool a run that changed precision."""
    assert [merged_precision(before, now) for before, now in (
        ("", "fp32"), ("bf16", "bf16"), ("bf16", "fp32"), ("bf16 then fp32", "fp32"), ("bf16 then fp32", "bf16"))] == [
        "fp32", "bf16", "bf16 then fp32", "bf16 then fp32", "bf16 then fp32"]


def test_unknown_preset_and_variant_are_named():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        resolve("huge")
    with pytest.raises(ValueError, match="unknown variant 'bert'"):
        resolve("tiny", "bert")


def test_unreachable_tracking_server_fails_before_compute(home):
    cfg = resolve("tiny")
    with pytest.raises(UserError, match="127.0.0.1:9 is unreachable"):
        run(cfg, tracking_uri="http://127.0.0.1:9")


def test_compiling_on_cpu_without_a_compiler_fails_before_compute(home, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++")
    with pytest.raises(UserError, match="'no-such-c\\+\\+' is not on PATH.*train.compile=false"):
        run(resolve("tiny", "cocolm", ["train.compile=true"]))
    run_on_gpus = resolve("tiny", "cocolm", ["train.compile=true", "cluster.gpus_per_worker=1"])
    check_compile_toolchain(run_on_gpus)  # not judged here: the driver is not necessarily a GPU worker


# ------------------------------------------------------------- plain PyTorch (no Ray)


def _steps(model, optimizer, scheduler, batch, n: int) -> None:
    for _ in range(n):
        model(batch).loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def test_checkpoint_round_trip_gives_equal_parameters_and_optimizer_state(tmp_path):
    cfg = with_vocab_size(resolve("tiny", "cocolm", ["model.hidden_size=32", "model.ffn_size=64"]), 300)
    model, optimizer, scheduler = build_training(cfg)
    batch = random_batch(4, 32, 300, 0.9)
    _steps(model, optimizer, scheduler, batch, 2)
    state = TrainState(step=2, epoch=1, batches_in_epoch=7, tokens_seen=256, device_hours=0.5)
    checkpoint.save(tmp_path / "ckpt", model, optimizer, scheduler, state, to_yaml(cfg), None)

    model2, optimizer2, scheduler2 = build_training(cfg)
    assert checkpoint.load(tmp_path / "ckpt", model2, optimizer2, scheduler2) == state
    for (name, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), name
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in model2.state_dict())
    for s1, s2 in zip(optimizer.state_dict()["state"].values(), optimizer2.state_dict()["state"].values()):
        assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert scheduler.state_dict() == scheduler2.state_dict()
    # Training on from both gives the same parameters: nothing was left out of the checkpoint.
    for m, o, s in ((model, optimizer, scheduler), (model2, optimizer2, scheduler2)):
        torch.manual_seed(1)  # the same replacement draws for both
        _steps(m.eval(), o, s, batch, 1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))


class WritesAFile:
    """What a hostile rng.pt holds: unpickling it (torch.load with weights_only=False) opens a file for writing."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def _tiny_training():
    cfg = with_vocab_size(resolve("tiny", "cocolm", ["model.hidden_size=32", "model.ffn_size=64"]), 300)
    return (*build_training(cfg), to_yaml(cfg))


def test_a_checkpoint_file_that_would_run_code_is_refused_unrun_and_named(tmp_path):
    model, optimizer, scheduler, config = _tiny_training()
    checkpoint.save(tmp_path / "ckpt", model, optimizer, scheduler, TrainState(step=3), config, None)
    planted = tmp_path / "planted"
    torch.save({"torch": torch.get_rng_state(), "python": WritesAFile(planted)}, tmp_path / "ckpt" / "rng.pt")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'ckpt' / 'rng.pt'} holds more than tensors and plain data "
                                         r"\(Unsupported global: GLOBAL io.open.*nothing in it ran"):
        checkpoint.load(tmp_path / "ckpt", model, optimizer, scheduler)
    assert not planted.exists()  # the pickle's call never ran
    torch.save({"weight": WritesAFile(planted)}, tmp_path / "ckpt" / "model.pt")  # every .pt file is read so
    with pytest.raises(ValueError, match=r"model.pt holds more than tensors"):
        checkpoint.load_pretrained(tmp_path / "ckpt")
    assert not planted.exists()


def test_a_checkpoint_restores_python_and_torch_random_state_without_unpickling(tmp_path):
    """rng.pt holds torch's state (a tensor), rng.json python's; a checkpoint written before rng.json holds
    python's state in rng.pt as a tuple of ints, which torch's weights_only loader reads too (plain data),
    so older checkpoints resume as before."""
    model, optimizer, scheduler, config = _tiny_training()
    for old_format in (False, True):
        directory = tmp_path / f"old-{old_format}"
        random.seed(11)
        torch.manual_seed(11)
        checkpoint.save(directory, model, optimizer, scheduler, TrainState(step=3), config, None)
        assert set(torch.load(directory / "rng.pt", weights_only=True)) == {"torch"}  # a tensor, nothing else
        if old_format:
            (directory / "rng.json").unlink()
            torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, directory / "rng.pt")
        expected = random.random(), torch.rand(3)
        random.seed(0)
        torch.manual_seed(0)
        assert checkpoint.load(directory, model, optimizer, scheduler).step == 3
        assert random.random() == expected[0] and torch.equal(torch.rand(3), expected[1]), old_format


def test_an_elastic_run_keeps_its_global_batch_and_data_position_at_every_world_size():
    cfg = resolve("tiny", "cocolm", ["cluster.workers=4", "cluster.min_workers=2", "data.batch_size=4",
                                     "train.global_batch=48"])
    assert list(cfg.cluster.worker_counts()) == [2, 3, 4] and list(resolve("tiny").cluster.worker_counts()) == [1]
    with pytest.raises(ValueError, match="data.batch_size x workers = 8 x 3"):  # 32 sequences do not split over 3
        resolve("tiny", "cocolm", ["cluster.workers=3", "cluster.min_workers=2", "data.batch_size=8",
                                   "train.global_batch=32"])
    with pytest.raises(ValueError, match="cluster.min_workers=3 must be between 0 and cluster.workers=2"):
        resolve("tiny", "cocolm", ["cluster.workers=2", "cluster.min_workers=3"])
    # 2 workers had read 6 micro-batches each; 1 worker resumes after the same 12, 3 after 4 each.
    state = TrainState(batches_in_epoch=6, world_size=2)
    state.reshard(1)
    assert (state.batches_in_epoch, state.world_size) == (12, 1)
    state.reshard(3)
    assert (state.batches_in_epoch, state.world_size) == (4, 3)


def test_a_long_phase_trains_the_last_steps_on_longer_blocks_and_is_checked_before_ray():
    """BERT's recipe: the last train.long_steps steps on blocks of data.long_seq_len; both or neither."""
    cfg = resolve("tiny", "cocolm", ["train.max_steps=100", "train.long_steps=10", "data.long_seq_len=256"])
    assert [cfg.seq_len_at(done) for done in (0, 89, 90, 99)] == [128, 128, 256, 256]
    assert cfg.tokens_left(0) == 32 * (90 * 128 + 10 * 256) and cfg.tokens_left(95) == 32 * 5 * 256
    plain = resolve("tiny", "cocolm", ["train.max_steps=100"])
    assert {plain.seq_len_at(done) for done in range(100)} == {128} and plain.tokens_left(40) == 32 * 60 * 128
    for overrides, message in ((["data.long_seq_len=256"], "go together"), (["train.long_steps=10"], "go together"),
                               (["train.long_steps=10", "data.long_seq_len=128"], "must be longer than data.seq_len"),
                               (["train.long_steps=10", "data.long_seq_len=1024"], "at most model.max_positions"),
                               (["train.long_steps=100", "data.long_seq_len=256"], "fewer than train.max_steps")):
        with pytest.raises(UserError, match=message):
            resolve("tiny", "cocolm", ["train.max_steps=100", *overrides])


def test_the_long_phase_reads_its_own_stream_from_its_start_once_on_either_side_of_a_resume():
    cfg = resolve("tiny", "cocolm", ["train.max_steps=100", "train.long_steps=10", "data.long_seq_len=256"])
    state = TrainState(step=89, epoch=2, batches_in_epoch=7, seq_len=128)
    data, shard = phase(cfg, state)
    assert (data.seq_len, shard, state.epoch, state.batches_in_epoch) == (128, "train", 2, 7)
    state.step = 90  # the switch: the long stream from its first batch
    data, shard = phase(cfg, state)
    assert (data.seq_len, shard, state.epoch, state.batches_in_epoch, state.seq_len) == (256, LONG_SHARD, 0, 0, 256)
    assert data == replace(cfg.data, seq_len=256)
    state.batches_in_epoch = 6  # a resume inside the long phase reads on where it stopped
    assert phase(cfg, state)[1] == LONG_SHARD and state.batches_in_epoch == 6
    old = TrainState(step=50, epoch=1, batches_in_epoch=3)  # a checkpoint from before the field: data.seq_len's
    assert phase(cfg, old)[1] == "train" and (old.epoch, old.batches_in_epoch, old.seq_len) == (1, 3, 128)


def test_after_a_resume_every_rank_draws_its_own_random_stream():
    seeds = {resumed_seed(0, rank, step) for rank in range(1, 8) for step in (10, 20, 30)}
    assert len(seeds) == 21 and not seeds & {0 + rank for rank in range(8)}  # nor a fresh start's seed + rank


def fake_checkpoint(storage: Path, run_name: str, step: int, owner: str | None) -> Path:
    """A checkpoint directory as Ray Train leaves it, recording `owner` (None: an old one without the field)."""
    directory = storage / run_name / checkpoint.directory_name(step)
    directory.mkdir(parents=True)
    state = {"step": step} if owner is None else {"step": step, "mlflow_run_id": owner}
    (directory / "state.json").write_text(json.dumps(state))
    return directory


def test_checkpoints_must_prove_they_belong_to_the_resuming_run(tmp_path):
    storage = str(tmp_path)
    fake_checkpoint(tmp_path, "mine", 40, "run-a")
    fake_checkpoint(tmp_path, "legacy", 40, None)
    found = checkpoint.owners(storage, "mine")
    assert list(found.values()) == ["run-a"] and checkpoint.owners(storage, "nothing-here") == {}
    checkpoint.check_owner(found, "run-a", storage, "mine", "sqlite:///a.db")  # its own run resumes
    with pytest.raises(ValueError, match=r"mine holds checkpoints of MLflow run run-a, and the tracking store "
                                         r"sqlite:///b.db has no run of this name"):
        checkpoint.check_owner(found, None, storage, "mine", "sqlite:///b.db")  # a new store, an old --storage
    with pytest.raises(ValueError, match="has run run-b under this name instead"):
        checkpoint.check_owner(found, "run-b", storage, "mine", "sqlite:///b.db")
    legacy = checkpoint.owners(storage, "legacy")
    checkpoint.check_owner(legacy, "run-a", storage, "legacy", "sqlite:///a.db")  # an existing run keeps resuming
    with pytest.raises(ValueError, match="an unknown run"):
        checkpoint.check_owner(legacy, None, storage, "legacy", "sqlite:///b.db")  # but cannot start a new one


def test_every_variant_runs_a_few_training_steps(tmp_path):
    """Config resolution, model and optimizer building of every variant through the job's own code."""
    small = ["model.hidden_size=32", "model.ffn_size=64", "data.seq_len=32"]
    base = with_vocab_size(resolve("tiny", "cocolm", small), 300)
    model, optimizer, scheduler = build_training(base)
    checkpoint.save(tmp_path / "finished", model, optimizer, scheduler, TrainState(), to_yaml(base), None)
    for name, chosen in VARIANTS.items():
        extra = [f"train.aux_checkpoint={tmp_path / 'finished'}"] if name == "converged_aux" else []
        cfg = with_vocab_size(resolve("tiny", name, small + extra), 300)
        model, optimizer, scheduler = build_training(cfg)
        batch = random_batch(4, 32, 300, cfg.data.crop_fraction)
        losses = []
        for _ in range(3):
            out = model(batch)
            out.loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(out.loss.item())
        assert all(torch.isfinite(torch.tensor(losses))), name


def test_log_interval_means_skip_empty_signals():
    from model.step import Interval

    interval = Interval()
    interval.add({"loss": torch.tensor(2.0), "copy_accuracy_replaced": torch.tensor(float("nan"))})
    interval.add({"loss": torch.tensor(4.0), "copy_accuracy_replaced": torch.tensor(0.5)})
    interval.add({"loss": torch.tensor(6.0), "lm_accuracy_original": torch.tensor(float("nan"))})
    assert interval.means() == {"loss": 4.0, "copy_accuracy_replaced": 0.5}  # an all-NaN signal is absent


def test_converged_aux_needs_a_checkpoint():
    cfg = with_vocab_size(resolve("tiny", "converged_aux"), 300)
    with pytest.raises(ValueError, match="train.aux_checkpoint"):
        build_training(cfg)


# ------------------------------------------------------------------ Ray Train runs


def test_a_new_tracking_store_refuses_another_runs_checkpoints(ray_local, tokenizer_dir, home, tmp_path):
    """The reported case: a new tracking store with an old --storage used to resume the other run's
    finished checkpoint into an empty FINISHED run. Now it stops with the reason, and no run is made."""
    storage = tmp_path / "storage"
    fake_checkpoint(storage, "owned", 40, "a-run-of-another-store")
    tracking_uri = f"sqlite:///{tmp_path}/new.db"
    with pytest.raises(ValueError, match="holds checkpoints of MLflow run a-run-of-another-store"):
        run(tiny(tokenizer_dir, "train.max_steps=40"), tracking_uri, str(storage), name="owned")
    client = MlflowClient(tracking_uri)
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


def checkpoint_recorded(storage: Path, step: int) -> bool:
    """Ray Train's own record of its checkpoints holds this step's. The checkpoint directory appears
    before Ray records it: a run killed in between resumes from the checkpoint before (CI saw it
    restart from step 0 after the test killed it on the directory alone)."""
    name = checkpoint.directory_name(step)
    return any(name in p.read_text() for p in storage.glob("*/checkpoint_manager_snapshot.json"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(ray_local, tokenizer_dir, small_corpus, home):
    cfg = tiny(tokenizer_dir, "train.max_steps=20", "train.checkpoint_every=1", "train.peak_lr=1e30",
               "train.warmup_steps=1", corpus=small_corpus)
    with pytest.raises(RuntimeError, match="non-finite loss or gradient at step 2.*checkpoint_step_00000001"):
        run(cfg)
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    (failed,) = client.search_runs([client.get_experiment_by_name("pretraining").experiment_id])
    assert failed.info.status == "FAILED"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_checkpoint_the_storage_cannot_take_stops_every_worker_at_once_in_one_line_without_retries(
        ray_local, tokenizer_dir, small_corpus, home, monkeypatch):
    """Two workers; the step-10 checkpoint cannot be written (jobs.faults: as a full disk). Both workers stop
    together (none waits in a collective), Ray Train retries nothing (no step is logged twice), the error
    is one line naming the storage, the folder and the cause, and the run is FAILED with it. (The same
    command resumes: an earlier attempt's stop is dropped, tests/test_faults.py.) Also the hang of docs/design.md
    section 4: two Train workers at 0.5 CPU each beside the stream's Ray Data tasks on the suite's 2-CPU Ray."""
    monkeypatch.setenv(faults.ENV, json.dumps({"storage_error_step": 10}))
    cfg = tiny(tokenizer_dir, "train.max_steps=10", "train.checkpoint_every=5", "cluster.workers=2",
               corpus=small_corpus)
    with pytest.raises(UserError) as stopped:
        run(cfg)
    (run_dir,) = (home / "ray_results").glob("tiny-cocolm-*")
    line = (f"the checkpoint could not be written to storage {run_dir}: {run_dir}/checkpoint_step_00000010: "
            "No space left on device (injected: jobs.faults)")
    assert str(stopped.value) == line + "; free space or fix the storage, then run the same command to resume"
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    (failed,) = client.search_runs([client.get_experiment_by_name("pretraining").experiment_id])
    assert failed.info.status == "FAILED" and failed.data.tags[STOP_TAG] == line
    assert [s for s, _ in history(client, failed.info.run_id, "loss")] == [5, 10]  # no attempt retried


def _submit(command: list, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """`ray job submit`, retried while the fresh head's dashboard agent is still starting."""
    deadline = time.time() + timeout
    while True:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=800)
        if "No available agent" not in result.stdout + result.stderr or time.time() > deadline:
            return result
        time.sleep(3)


def _status_without_token(url: str, timeout: float = 60) -> int:
    """The HTTP status of a GET carrying no token, once the dashboard answers at all."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except urllib.error.URLError:
            if time.time() > deadline:
                raise
            time.sleep(1)


@pytest.mark.slow(seconds=85)
@pytest.mark.ray_cluster
@pytest.mark.timeout(900)
def test_a_killed_run_resubmitted_as_a_ray_job_resumes_in_its_mlflow_run_and_recovers_from_a_worker_failure(
        tokenizer_dir, small_corpus, home):
    """One run meets both faults, each resumed from its last checkpoint: its driver (and the Ray it started)
    is killed after the step-5 checkpoint; the same command, sent to a local cluster as the README's flow
    does (`ray start --head`, `ray job submit --working-dir .` by jobs.submit, `ray job logs`), resumes in
    the same MLflow run, and there rank 0 dies once at step 17 (jobs.faults, in the job's runtime env),
    which Ray Train recovers from the step-15 checkpoint.

    Also the job's fixed-shape path (train.fixed_shapes: every batch padded to one masked count; the
    whole-step compile is left to tests/test_fixed_shapes.py), recorded in the run's params, and a long
    phase (the last 10 steps on blocks of 256), resumed inside it after the failure.

    The README's `ray stop` ends every Ray of this user on the machine (a study beside the suite's too: one
    was lost so), so the test ends only the Rays it started, by their folders. It shuts down the suite's
    in-process Ray first (it starts again after the test: ray_cluster, conftest): the cluster it starts takes
    the machine's CPUs.
    """
    import ray

    ray.shutdown()
    command = ["-m", "jobs.pretraining", "--preset", "tiny", "--tokenizer", str(tokenizer_dir),
               "--corpus", str(small_corpus), *[x for o in (
                   "train.warmup_steps=5", "train.log_every=5", "train.max_steps=20", "train.checkpoint_every=5",
                   "train.fixed_shapes=true", "train.long_steps=10", "data.long_seq_len=256") for x in ("--set", o)]]
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rk", dir="/tmp")}  # its own Ray, killed with it
    driver = subprocess.Popen([sys.executable, *command], cwd=ROOT, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 400
        while not checkpoint_recorded(home / "ray_results", 5):
            assert driver.poll() is None, "the driver ended before its first checkpoint"
            assert time.time() < deadline, "no checkpoint within the time limit"
            time.sleep(0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the Ray it started, mid-run
        driver.wait()

    ray_bin = Path(sys.executable).parent / "ray"
    # As the README's shell: RAY_AUTH_MODE=token exported (the token is the suite's, tests/conftest.py).
    env = as_a_users_shell({**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rj", dir="/tmp"),
                            "RAY_AUTH_MODE": "token"})
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_DATA_DISABLE_PROGRESS_BARS", None)  # as a user's shell has it: the job must quiet Ray Data itself
    # Ports of its own where Ray's are fixed (GCS 6379, dashboard 8265, its agent 52365, Ray Client 10001):
    # another Ray on the machine, a study's or another user's, may hold them, and the job went there (its
    # token refused) or found no agent.
    flags = ("--port", "--dashboard-port", "--dashboard-agent-listen-port", "--ray-client-server-port")
    ports = dict(zip(flags, free_ports(len(flags))))
    address = f"http://127.0.0.1:{ports['--dashboard-port']}"
    subprocess.run([ray_bin, "start", "--head", "--num-cpus", "2", "--disable-usage-stats",
                    *[str(x) for item in ports.items() for x in item]], env=env, check=True, capture_output=True)
    try:
        assert _status_without_token(f"{address}/api/jobs/") == 401  # the job API wants the token
        runtime_env = home.parent / "runtime_env.yaml"  # as platform/runtime_env.yaml, with this test's home
        plan = json.dumps({"pretraining_step": 17})  # rank 0 dies once at step 17
        runtime_env.write_text(f"env_vars:\n  COCOLM_HOME: {home}\n  {faults.ENV}: '{plan}'\nexcludes:\n  - .venv/\n")
        submit = _submit([sys.executable, "-m", "jobs.submit", "--address", address, "--runtime-env", str(runtime_env),
                          "--", sys.executable, *command], env)
        assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
        assert "MLflow run id:" in submit.stdout and "succeeded" in submit.stdout
        job_id = next(line.split("'")[1] for line in submit.stdout.splitlines() if "submitted successfully" in line)
        logs = subprocess.run([ray_bin, "job", "logs", "--address", address, job_id], env=env,
                              capture_output=True, text=True, check=True)
        assert "(resuming) in experiment" in logs.stdout and "step 20/20" in logs.stdout
        # Without a terminal: our progress lines; no progress-bar frames, tips, error-level Ray internals,
        # deprecation warnings, ANSI colour codes, or advice to switch authentication off.
        # (The ANSI check is on the coloured worker prefix: `ray job logs` colours its own header line.)
        for noise in ("row/s]", "Tip:", "PreemptionWatcher", "DeprecationWarning", "\x1b[36m(",
                      "Progress bars disabled", "opt out"):
            assert noise not in logs.stdout, noise
    finally:
        stop_processes_under(env["RAY_TMPDIR"])
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("pretraining").experiment_id])
    assert len(runs) == 1  # the same MLflow run, not a second one
    (finished,) = runs
    assert finished.info.status == "FINISHED"
    assert finished.data.tags["git_commit"] == git_commit(ROOT) != "unknown"  # the copy Ray ran had no .git
    (run_dir,) = (home / "ray_results").glob("tiny-cocolm-*")
    assert (run_dir / "injected_failure").exists()
    last = max(run_dir.glob("checkpoint_step_*"))
    assert last.name == "checkpoint_step_00000020"
    steps = [s for s, _ in history(client, finished.info.run_id, "loss")]
    assert sorted(set(steps)) == [5, 10, 15, 20]
    # Logged before the kill and again after the resume: only the steps after the checkpoint it resumed from
    # (a step killed between its log line and Ray Train's record of its checkpoint is one of them).
    repeated = {s for s in steps if steps.count(s) > 1}
    resumed_from = max(s for s in (0, 5, 10, 15) if s < min(repeated, default=20))
    assert all(resumed_from < s <= resumed_from + 5 for s in repeated), steps
    state = json.loads((last / "state.json").read_text())
    assert (state["seq_len"], state["tokens_seen"]) == (256, 32 * (10 * 128 + 10 * 256))
    assert state["batches_in_epoch"] == 2 * 10  # the long stream read once from its start: 10 steps of 2 micro-batches
    params = finished.data.params
    assert (params["train.fixed_shapes"], params["train.compile_step"]) == ("True", "off")
    tags = finished.data.tags  # what ran, from the first log line on (the CPU: SDPA)
    assert (tags[ATTENTION_TAG], tags[ATTENTION_FALLBACKS_TAG]) == (
        "sdpa in training passes, sdpa in no-grad passes", "none")
    assert tags[PRECISION_TAG] == "fp32"  # the tiny preset leaves train.bf16_on_cpu off
    assert all(math.isfinite(v) for _, v in history(client, finished.info.run_id, "lm_loss"))


@pytest.mark.slow(seconds=122)
@pytest.mark.ray_cluster
@pytest.mark.timeout(900)
def test_two_workers_lose_a_node_resume_on_the_other_lower_the_loss_and_log_every_signal(tokenizer_dir, small_corpus,
                                                                                         home, monkeypatch):
    """A simulated two-node cluster (ray.cluster_utils.Cluster: a 1-CPU head, one 1-CPU worker node; a
    third node would only add a raylet and its agents). An elastic run (cluster.min_workers=1) places its
    2 workers on different nodes (STRICT_SPREAD; 0.75 CPU each, so one per node), its encoders compiled
    (inductor, as on GPU workers) inside DDP; the worker node dies without a goodbye right after Ray Train
    has recorded the step-20 checkpoint (the head keeps the driver and Ray Train's controller, as a real
    cluster's head does). The run goes on with the 1 worker that fits, from that checkpoint, with the same global
    batch, and finishes in the same MLflow run: the loss lower, every signal of the paper logged, the
    encoder exported and loadable by transformers; the same command again does not train."""
    import threading

    import ray
    import transformers
    from ray.cluster_utils import Cluster
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator)

    ray.shutdown()  # the suite's local Ray (started again after the test: ray_cluster); this joins a cluster of its own
    # Ray Train's restart decides its size from Ray Data's AutoscalingCoordinator, whose view of the nodes is
    # refreshed every 20 s (its TICK_INTERVAL_S; Ray knows the node dead after 2 failed health checks half a
    # second apart: a dead raylet refuses the connection). Until then it asks for 2 workers and waits for
    # their placement group until this timeout (it bounds that wait alone, not the workers' start; a
    # controller error, retried without limit), then asks again: 15 s without a worker in a run measured
    # on the 2-core machine. So once Ray knows the node dead, the test has the coordinator refresh its view
    # then, as its next tick would (`recompute`): at most one 5 s wait (the default 60 s only slows the test).
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 2}})
    worker_node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    storage = home / "ray_results"
    cfg = tiny(tokenizer_dir, "train.max_steps=40", "train.checkpoint_every=20", "train.compile=true",
               "cluster.workers=2", "cluster.min_workers=1", "cluster.cpus_per_worker=0.75",
               "cluster.placement_strategy=STRICT_SPREAD", corpus=small_corpus)
    removed = threading.Event()

    def remove_a_node_once_the_checkpoint_is_recorded() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not checkpoint_recorded(storage, 20):
            time.sleep(0.5)
        cluster.remove_node(worker_node, allow_graceful=False)  # as a lost machine: no goodbye
        removed.set()
        while any(node["NodeID"] == worker_node.node_id and node["Alive"] for node in ray.nodes()):
            time.sleep(0.2)
        ray.get(get_or_create_autoscaling_coordinator().get_reserved_resources.remote("node-loss-test", recompute=True))

    killer = threading.Thread(target=remove_a_node_once_the_checkpoint_is_recorded, daemon=True)
    killer.start()
    try:
        result = run(cfg, name="node-loss")
        assert run(cfg, name="node-loss").status == "ALREADY_FINISHED"  # the finished command does not train again
    finally:
        killer.join(timeout=60)
        ray.shutdown()
        cluster.shutdown()
    assert removed.is_set()
    client = MlflowClient(result.tracking_uri)
    mlflow_run = client.get_run(result.run_id)
    assert result.status == "FINISHED" and mlflow_run.info.status == "FINISHED"
    assert result.checkpoint.endswith("checkpoint_step_00000040")
    assert len(client.search_runs([mlflow_run.info.experiment_id])) == 1  # the same MLflow run throughout
    loss = history(client, result.run_id, "loss")
    steps = [s for s, _ in loss]
    assert steps[-1] == 40 and set(steps) == set(range(5, 45, 5))  # only what followed step 20 was redone
    assert all(s > 20 for s in steps if steps.count(s) > 1), steps
    assert loss[-1][1] < 0.8 * loss[0][1], loss
    state = json.loads(Path(result.checkpoint, "state.json").read_text())
    assert state["world_size"] == 1 and state["step"] == 40  # finished on the node that was left
    assert set(PAPER_SIGNALS) <= set(mlflow_run.data.metrics), set(PAPER_SIGNALS) - set(mlflow_run.data.metrics)
    params = mlflow_run.data.params
    assert params["cluster.workers"] == "2" and params["objective.copy_weight"] == "50.0"
    assert params["train.compile"] == "True"
    assert {"preset", "variant", "git_commit"} <= set(mlflow_run.data.tags)
    assert {"config.yaml", "encoder", "tokenizer"} <= {a.path for a in client.list_artifacts(result.run_id)}
    # The exported encoder loads with transformers, offline.
    encoder_dir = client.download_artifacts(result.run_id, "encoder", str(home / "download"))
    loaded = transformers.AutoModel.from_pretrained(encoder_dir, trust_remote_code=True)
    assert loaded.config.vocab_size == 1000  # the tokenizer's vocabulary, not the preset's 4000
