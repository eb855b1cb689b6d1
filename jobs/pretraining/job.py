"""COCO-LM pretraining on Ray Train, tracked in MLflow, resumable.

    python -m jobs.pretraining --preset tiny|study|small|base|base++|large++ --variant NAME [--set key.sub=value ...]
        [--corpus PATH ...] [--tokenizer DIR] [--tracking-uri URI] [--storage URI] [--workers N]
        [--gpus-per-worker G] [--name RUN_NAME] [--experiment NAME] [--init-from DIR|HUB_ID|RUN_ID|last]

With no cluster it starts a local Ray; under `ray job submit` it joins that cluster. Re-running
the same command (same resolved config, or the same --name with the same settings) resumes the run
from its last checkpoint, in the same MLflow run; a finished run is reported and not run again. A
named run given other settings, or a run another command holds, is an error before Ray starts.
`--init-from` continues pretraining an encoder (the authors' released checkpoint, an export, a checkpoint or a
run): the main encoder starts from its weights, with its shape and its tokenizer, whose special ids the stream
packs and corrupts with (the authors': [CLS]=0 [PAD]=1 [SEP]=2 [UNK]=3, [MASK] last).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch
from mlflow.tracking import MlflowClient
from ray.train.torch import TorchTrainer

from model import build_pretraining_model
from model.config import EncoderShape
from model.export import export_encoder

from jobs import faults, tracking

from jobs.data.corpus import SHIPPED
from jobs.data.stream import Stream, build_stream, check_inputs, ingest_config
from jobs.data.tokenizer import resolve_tokenizer
from jobs.data.schemes import load_scheme
from jobs.data.skips import skip_summary
from jobs.data.tokens import tokenizer_files
from jobs.cli import AT_LEAST_ONE, NON_NEGATIVE, UserError, check_name, option, parse_options, redact
from jobs.env import set_hermetic_env
from jobs.pretraining.encoders import LATEST, latest_pretraining_run, resolve_encoder
from jobs.pretraining.pretrained import PretrainedEncoder
from jobs.names import CHECKPOINT_TAG, KIND_PRETRAINING, KIND_TAG, PRETRAINING_EXPERIMENT, STOP_TAG
from jobs.pretraining import checkpoint
from jobs.pretraining.config import (PretrainConfig, available_presets, parse_overrides, resolve, to_yaml,
                                    with_vocab_size)
from jobs.pretraining.context import LoopContext
from jobs.pretraining.loop import (LONG_SHARD, STORAGE_FAILURE, InitWeights, check_aux_checkpoint, check_step_options,
                                  train_loop_per_worker)
from jobs.ray_session import init_ray



@dataclass(frozen=True)
class PretrainResult:
    run_id: str
    run_name: str
    checkpoint: str  # directory (or URI) of the final checkpoint
    tracking_uri: str
    status: str  # FINISHED, or ALREADY_FINISHED when the command found its run done


def run(cfg: PretrainConfig, tracking_uri: str | None = None, storage: str | None = None, name: str | None = None,
        experiment: str = PRETRAINING_EXPERIMENT, init: InitSource | None = None) -> PretrainResult:
    """Check, train, export. Everything a user can get wrong is checked before Ray starts and before
    the run is touched: the name, the tracking store, the source a run starts from (`cfg.init_from`, a
    config from `init_config`; `init` when the caller resolved it already), the inputs, the storage, a named
    run's settings, whether another command holds the run."""
    set_hermetic_env()
    if name is not None:
        check_name("--name", name)  # it names the run's folder and its tracking-store filter
    tracking_uri = tracking_uri or tracking.default_tracking_uri()
    tracking.check_experiment_name(experiment, tracking_uri, "--experiment")
    tracking.check_tracking(tracking_uri)  # before any compute is spent
    check_step_options(cfg)
    check_compile_toolchain(cfg)
    check_aux_checkpoint(cfg)
    check_corpus(cfg)
    if cfg.init_from:
        init = init or resolve_init(cfg.init_from, tracking_uri)
    check_inputs(cfg.data, ("platform", "official"))  # before Ray starts
    cfg = with_tokenizer(cfg)  # the run's name and params hold its vocabulary
    storage = storage or tracking.default_storage()
    tracking.check_storage(storage)
    check_storage_room(storage, cfg)
    run_name = name or f"{cfg.preset}-{cfg.variant}-{cfg.digest()}"
    with tracking.holding_run(storage, run_name):
        client = MlflowClient(tracking_uri)
        experiment_id = tracking.experiment_id(client, experiment, tracking_uri)
        existing = tracking.find_run(client, experiment_id, run_name)
        if existing is not None:
            tracking.check_same_settings(existing, cfg.flat(), run_name)
        checkpoint.check_owner(checkpoint.owners(storage, run_name), existing.info.run_id if existing else None,
                               storage, run_name, tracking_uri)  # before a new MLflow run is created
        if existing is not None and existing.info.status == "FINISHED":
            done = existing.data.tags.get(CHECKPOINT_TAG, "")
            print(f"run {run_name} already finished (MLflow run {existing.info.run_id}); checkpoint: {done}")
            return PretrainResult(existing.info.run_id, run_name, done, tracking_uri, "ALREADY_FINISHED")
        checkpoint.newest_intact(storage, run_name)  # torn ones set aside: Ray resumes from the newest intact one
        return _train(cfg, client, experiment_id, experiment, run_name, tracking_uri, storage,
                      init if cfg.init_from else None)


def _train(cfg: PretrainConfig, client: MlflowClient, experiment_id: str, experiment: str, run_name: str,
           tracking_uri: str, storage: str, init: InitSource | None) -> PretrainResult:
    """Ray, the stream, the MLflow run (new or resumed), training and export, for a run this command holds."""
    init_ray(dashboard=True)  # the dashboard serves the State API that Ray Train's cleanup polls
    tokenizer_dir = resolve_tokenizer(cfg.data)
    scheme = load_scheme(tokenizer_dir)
    stream = build_stream(cfg.data, tokenizer_dir, scheme)
    pieces = scheme.vocab_size
    if pieces != cfg.data.vocab_size:  # SentencePiece trains exactly data.vocab_size, or fails
        raise RuntimeError(f"the tokenizer {stream.tokenizer_dir} has {pieces} pieces, not the "
                           f"{cfg.data.vocab_size} this run was checked with")
    tags = {"preset": cfg.preset, "variant": cfg.variant, "git_commit": tracking.git_commit(),
            KIND_TAG: KIND_PRETRAINING}
    run_id, status = tracking.find_or_start_run(client, experiment_id, run_name, run_name, tags)
    with tracking.ending_run(client, run_id):
        _log_config(client, run_id, cfg)
        print(f"MLflow run {run_id} ({'resuming' if status != 'NEW' else 'new'}) in experiment {experiment!r} "
              f"at {tracking_uri}", flush=True)
        checkpoint_path = _fit(cfg, stream, run_id, run_name, tracking_uri, storage, init)
        _finish(client, run_id, cfg, stream, checkpoint_path)
    print(f"\nMLflow run id: {run_id}\ncheckpoint:    {checkpoint_path}\n"
          + tracking.ui_links(tracking_uri, experiment_id, run_id))
    return PretrainResult(run_id, run_name, checkpoint_path, tracking_uri, "FINISHED")


def with_tokenizer(cfg: PretrainConfig) -> PretrainConfig:
    """The config with the vocabulary the run will have, known before Ray starts: the given tokenizer's
    (loaded once), else data.vocab_size, which the cached platform tokenizer (keyed on it, [PAD]=0) was
    trained to exactly. The model's [PAD] (what an encoder given no attention mask leaves out, and what
    its export records) is the tokenizer's: a run with the authors' tokenizer (their [PAD] is 1) takes
    their checkpoint's shape, or sets model.pad_token_id itself."""
    if not cfg.data.tokenizer_dir:
        return with_vocab_size(cfg, cfg.data.vocab_size)
    scheme = load_scheme(cfg.data.tokenizer_dir)
    if cfg.model.pad_token_id != scheme.pad_id:
        raise UserError(f"model.pad_token_id={cfg.model.pad_token_id} but the tokenizer {cfg.data.tokenizer_dir} "
                        f"numbers [PAD] {scheme.pad_id}: --set model.pad_token_id={scheme.pad_id}")
    return with_vocab_size(cfg, scheme.vocab_size)


def check_compile_toolchain(cfg: PretrainConfig) -> None:
    """torch.compile on CPU workers (inductor) builds C++: without a compiler every worker would fail
    deep inside its first step, so say so before anything starts. Checked on this machine, which is
    the workers' machine on a local Ray; GPU workers (Triton) are not judged from the driver."""
    compiler = os.environ.get("CXX", "g++")  # what inductor looks for on Linux
    if cfg.cluster.gpus_per_worker or shutil.which(compiler) is not None:
        return
    for setting, needs, off in (("train.compile=true", cfg.train.compile, "train.compile=false"),
                                (f"train.compile_step={cfg.train.compile_step}", cfg.train.compile_step != "off",
                                 "train.compile_step=off")):
        if needs:
            raise UserError(f"{setting} on CPU workers needs a C++ compiler for torch.compile, and {compiler!r} "
                            f"is not on PATH: install g++ (or set CXX), or --set {off}")


def checkpoint_bytes(cfg: PretrainConfig) -> int:
    """About what one checkpoint of this run takes: the weights and AdamW's two moments, fp32 each
    (the model counted on the meta device, nothing allocated)."""
    with torch.device("meta"):
        parameters = sum(p.numel() for p in build_pretraining_model(cfg.model, cfg.objective).parameters())
    return 3 * 4 * parameters


def check_storage_room(storage: str, cfg: PretrainConfig) -> None:
    """A local storage without room for one checkpoint is refused before Ray starts: the run would train
    to its first checkpoint and fail there (a cloud URI's room is not known in advance)."""
    if "://" in storage and not storage.startswith("file://"):
        return
    free, needed = shutil.disk_usage(Path(storage.removeprefix("file://")).expanduser()).free, checkpoint_bytes(cfg)
    if free < needed:
        raise UserError(f"storage {storage} has {free / 2**20:,.1f} MiB free, less than one checkpoint of this run "
                        f"(about {needed / 2**20:,.1f} MiB: the weights and AdamW's moments); free space or choose "
                        f"another --storage")


# The presets sized for the shipped corpus (3.4M tokens of demo text): the demo and the CPU study. Every
# other preset is meant for a user's corpus on GPUs; without --corpus it would train on the demo text.
DEMO_CORPUS_PRESETS = ("tiny", "study-cpu")


def check_corpus(cfg: PretrainConfig) -> None:
    """A preset meant for a real corpus with no corpus named is refused before anything runs."""
    if not cfg.data.paths and cfg.preset not in DEMO_CORPUS_PRESETS:
        raise UserError(f"preset {cfg.preset} trains on your corpus: pass --corpus FILE|FOLDER|URI ... (or --set "
                        f"data.paths=...); --corpus {SHIPPED} trains it on the shipped 3.4M-token demo corpus "
                        f"(data/corpus) on purpose")


def _vocab_size(tokenizer_dir: Path) -> int:
    return load_scheme(tokenizer_dir).vocab_size


def _log_config(client: MlflowClient, run_id: str, cfg: PretrainConfig) -> None:

    tracking.log_params(client, run_id, cfg.flat())
    client.log_text(run_id, to_yaml(cfg), "config.yaml")


def loop_config(cfg: PretrainConfig, ctx: LoopContext) -> dict[str, Any]:
    """Ray Train's `train_loop_config` for `train_loop_per_worker`: the config as plain data, and the
    context. Ray Train's controller unpickles it too, so nothing in it may come from a heavy module
    (`jobs.pretraining.context` says why)."""
    return {"cfg": cfg.to_dict(), "ctx": ctx}


def _fit(cfg: PretrainConfig, stream: Stream, run_id: str, run_name: str, tracking_uri: str, storage: str,
         init: InitSource | None = None) -> str:
    """Ray Train's run of the loop; the final checkpoint's path. A stop the loop tagged (a non-finite loss,
    a checkpoint storage could not take) is the error, the run's last good checkpoint named."""
    c = cfg.cluster
    resources = {"CPU": c.cpus_per_worker, **({"GPU": c.gpus_per_worker} if c.gpus_per_worker else {})}
    plan = faults.planned()
    fail_at_step = plan.pretraining_step
    client = MlflowClient(tracking_uri)
    if STOP_TAG in client.get_run(run_id).data.tags:  # an earlier attempt's (the storage fixed since): this one decides
        client.delete_tag(run_id, STOP_TAG)
    marker = str(Path(storage) / run_name / "injected_failure") if fail_at_step else ""
    ctx = LoopContext(run_id, tracking_uri, str(stream.tokenizer_dir), fail_at_step, marker,
                      f"{storage.rstrip('/')}/{run_name}", ray.put(init.weights()) if init else None,
                      special=stream.special, storage_error_step=plan.storage_error_step)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config(cfg, ctx),
        scaling_config=ray.train.ScalingConfig(
            num_workers=(c.min_workers, c.workers) if c.min_workers < c.workers and c.min_workers else c.workers,
            use_gpu=c.gpus_per_worker > 0, resources_per_worker=resources,
            placement_strategy=c.placement_strategy,
        ),
        run_config=ray.train.RunConfig(
            name=run_name,  # the same name and storage resume from the latest checkpoint (Ray Train V2)
            storage_path=storage,
            failure_config=ray.train.FailureConfig(max_failures=cfg.train.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints),
        ),
        datasets={"train": stream.blocks, **({LONG_SHARD: stream.long_blocks} if stream.long_blocks is not None else {})},
        dataset_config=ingest_config(),  # the stream's order: the same seed reads the same batches
    )
    result = trainer.fit()
    stopped = client.get_run(run_id).data.tags.get(STOP_TAG)  # the run ends FAILED with it
    if stopped and stopped.startswith(STORAGE_FAILURE):
        raise UserError(stopped + "; free space or fix the storage, then run the same command to resume")
    if stopped:
        last = result.checkpoint.path if result.checkpoint else "none"
        raise RuntimeError(f"pretraining stopped: {stopped}. Last good checkpoint: {last}")
    if result.checkpoint is None:
        raise RuntimeError(f"pretraining produced no checkpoint (Ray Train result: {result})")
    return result.checkpoint.path


def _finish(client: MlflowClient, run_id: str, cfg: PretrainConfig, stream: Stream, checkpoint_path: str) -> None:
    """Skipped-record counts, the exported encoder and the tokenizer as artifacts, the checkpoint as a tag."""
    summary = skip_summary(stream.skips)
    print(summary.format())
    counts = {"corpus_documents": summary.documents, **{f"skipped_{k}": v for k, v in summary.skipped.items()}}
    for key, value in counts.items():
        client.log_metric(run_id, key, value)
    with ray.train.Checkpoint(checkpoint_path).as_directory() as directory, tempfile.TemporaryDirectory() as tmp:
        model, _ = checkpoint.load_pretrained(Path(directory))
        export_encoder(model.main, Path(tmp) / "encoder", tokenizer_dir=stream.tokenizer_dir, lm_head=model.lm_head)
        client.log_artifacts(run_id, str(Path(tmp) / "encoder"), "encoder")
    for file in tokenizer_files(stream.tokenizer_dir):
        client.log_artifact(run_id, str(file), "tokenizer")
    client.set_tag(run_id, CHECKPOINT_TAG, checkpoint_path)


# ----------------------------------------------------------------------------- --init-from

# The checkpoint's fields a run started from it takes: what its weights are and compute. Dropout is the
# recipe's (the study presets turn it off), and the vocabulary is its tokenizer's (`init_config`).
SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(EncoderShape)
                     if f.name not in ("vocab_size", "dropout", "attention_dropout"))


@dataclass(frozen=True)
class InitSource:
    """What `--init-from` names, resolved on the driver: the encoder, with the auxiliary where the source
    is a pretraining checkpoint that kept one (`PretrainedEncoder.aux_state`, and the rule it was built by)."""

    source: str  # as the run's config records it: as given, a run id for `last`
    encoder: PretrainedEncoder

    def shape(self) -> dict[str, Any]:
        return {**{name: getattr(self.encoder.cfg, name) for name in SHAPE_FIELDS}, **(self.encoder.aux_shape or {})}

    def weights(self) -> InitWeights:
        return InitWeights(self.encoder.state, self.encoder.aux_state)


def resolve_init(source: str, tracking_uri: str | None) -> InitSource:
    """`--init-from SOURCE` resolved as fine-tuning's `--from` is (`resolve_encoder`): the authors' directory
    or hub id (converted once per content), an exported encoder, a checkpoint, a run id or `last`. What it
    converts or downloads goes under $COCOLM_HOME/init_from/, a folder per source, so the same command
    again (a resume) finds the tokenizer at the path its config recorded."""
    set_hermetic_env()  # the hub stays offline unless the user said otherwise
    tracking_uri = tracking_uri or tracking.default_tracking_uri()
    try:
        if source == LATEST:  # recorded as the run it named: `last` names another run tomorrow
            source = latest_pretraining_run(MlflowClient(tracking_uri))
        workdir = tracking.home() / "init_from" / hashlib.sha256(source.encode()).hexdigest()[:16]
        encoder = resolve_encoder(source, tracking_uri, workdir)
    except UserError as error:  # the resolver's lines name fine-tuning's flag
        raise UserError(str(error).replace("--from ", "--init-from ")) from None
    return InitSource(source, encoder)


def init_config(preset: str, variant: str, overrides: list[str], init: InitSource) -> PretrainConfig:
    """The config of a run started from `init`, and the one place it is checked: the preset, variant and
    overrides, with the checkpoint's shape in place of the preset's size (a key set otherwise is one line
    naming both values) and its tokenizer in place of the corpus's (another --tokenizer is refused), which
    has as many pieces as its embeddings have rows; blocks no longer than its positions."""
    tokenizer, source = init.encoder.tokenizer_dir, redact(init.source)
    given = parse_overrides(overrides)["data"].get("tokenizer_dir")
    if given and Path(given).resolve() != tokenizer.resolve():
        raise UserError(f"--tokenizer {given} conflicts with --init-from {source}: the run encodes "
                        f"with the checkpoint's own tokenizer ({tokenizer}); leave --tokenizer out")
    pieces, rows = _vocab_size(tokenizer), init.encoder.cfg.vocab_size
    if pieces != rows:
        raise UserError(f"--init-from {source}: its tokenizer {tokenizer} has {pieces} pieces and its encoder's "
                        f"embeddings {rows} rows: an encoder directory holds the tokenizer it was trained with")
    own = [f"data.tokenizer_dir={json.dumps(str(tokenizer))}", f"data.vocab_size={rows}"]
    cfg = resolve(preset, variant, [*overrides, *own], init.source, init.shape())
    if cfg.data.seq_len > cfg.model.max_positions:  # a preset's blocks against the checkpoint's positions
        raise UserError(f"data.seq_len={cfg.data.seq_len} is longer than --init-from {source}'s "
                        f"model.max_positions={cfg.model.max_positions}: --set data.seq_len={cfg.model.max_positions}")
    return cfg


@dataclass(frozen=True)
class PretrainOptions:
    preset: str = field(default="tiny", metadata=option(" | ".join(available_presets())))
    variant: str = field(default="cocolm", metadata=option("a variant of model.VARIANTS or platform/variants/"))
    overrides: tuple[str, ...] = field(default=(), metadata=option(
        "dotted config override, e.g. train.max_steps=40 (repeatable)", flag="--set", repeat=True, metavar="KEY=VALUE"))
    corpus: tuple[str, ...] | None = field(default=None, metadata=option(
        f"files, folders, globs or URIs; '{SHIPPED}': the shipped demo corpus (the default of the presets tiny "
        "and study-cpu, which are sized for it; the others need a corpus)", many=True))
    tokenizer: str | None = field(default=None, metadata=option(
        "tokenizer directory (default: one trained for the corpus, cached)"))
    tracking_uri: str | None = field(default=None, metadata=option(
        "MLflow tracking URI (default: sqlite store under $COCOLM_HOME)"))
    storage: str | None = field(default=None, metadata=option(
        "checkpoint storage: local dir or s3:// gs:// URI (default: $COCOLM_HOME/ray_results)"))
    workers: int | None = field(default=None, metadata=option("Ray Train workers (sets cluster.workers)", bounds=AT_LEAST_ONE))
    gpus_per_worker: float | None = field(default=None, metadata=option("sets cluster.gpus_per_worker", bounds=NON_NEGATIVE))
    name: str | None = field(default=None, metadata=option(
        "run name (default: preset-variant-<config hash>); the same name resumes"))
    experiment: str = field(default=PRETRAINING_EXPERIMENT, metadata=option("MLflow experiment"))
    init_from: str | None = field(default=None, metadata=option(
        "continue pretraining an encoder: the authors' checkpoint directory or hub id, an exported encoder, a "
        f"checkpoint directory, a pretraining run id or '{LATEST}'; the run takes its shape and tokenizer",
        metavar="SOURCE"))

    def config(self, init: InitSource | None = None) -> PretrainConfig:
        """The resolved config; `init`: `--init-from` as `main` resolved it (`resolve_init`), given with it.
        The convenience flags are `--set` overrides under another name: one way to set each key."""
        if bool(self.init_from) != (init is not None):
            raise ValueError("--init-from is resolved once, by main (resolve_init): pass its InitSource with it")
        flags = {"data.paths": self.corpus, "data.tokenizer_dir": self.tokenizer, "cluster.workers": self.workers,
                 "cluster.gpus_per_worker": self.gpus_per_worker}
        shorthands = [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]
        overrides = shorthands + list(self.overrides)
        if init is not None:
            return init_config(self.preset, self.variant, overrides, init)
        return resolve(self.preset, self.variant, overrides)


def main(argv: list[str] | None = None) -> PretrainResult:
    opts = parse_options("python -m jobs.pretraining", __doc__, PretrainOptions, argv)
    init = resolve_init(opts.init_from, opts.tracking_uri) if opts.init_from else None
    return run(opts.config(init), opts.tracking_uri, opts.storage, opts.name, opts.experiment, init)
