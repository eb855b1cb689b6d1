"""The per-worker pretraining loop: plain PyTorch, run by Ray Train's TorchTrainer at any world size.

Ray is touched only through `get_context`, `get_checkpoint`, `get_dataset_shard`, `prepare_model`
and `report` (at checkpoints: `report` is a barrier, so every rank calls it the same number of
times). Rank 0 alone logs to MLflow and prints progress.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import CheckpointUploadMode
from ray.train.collective import broadcast_from_rank_zero
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from model import PretrainingObjective, build_pretraining_model
from model.config import SpecialTokens
from model.encoder import attention_fallbacks, attention_ran, compile_encoders
from model.objective import to_device
from model.flops import device_peak_flops, step_flops
from model.step import (STEP_COMPILE_MODES, Interval, TrainingStep, build_optimizer, compile_step,
                        fp32_fallback_note, step_precision)

from jobs.cli import UserError
from jobs.data.config import DataConfig
from jobs.data.stream import pretraining_batches
from jobs.names import ATTENTION_FALLBACKS_TAG, ATTENTION_TAG, CHECKPOINT_TAG, PRECISION_TAG, STOP_TAG
from jobs.pretraining import checkpoint
from jobs.pretraining.checkpoint import TrainState
from jobs.pretraining.config import PretrainConfig, from_dict, to_yaml
from jobs.pretraining.context import LoopContext


LONG_SHARD = "long"  # Ray Train's name for the stream of data.long_seq_len blocks (the job's datasets)


@dataclass(frozen=True)
class InitWeights:
    """The weights a run started from a checkpoint (`--init-from`) begins with: the main encoder's, and the
    auxiliary's where the source kept one (a pretraining checkpoint)."""

    main: dict[str, torch.Tensor]
    aux: dict[str, torch.Tensor] | None = None


def initialise(model: PretrainingObjective, weights: InitWeights) -> None:
    """The source's weights into `model`, every tensor (strict). The auxiliary shares the main embeddings,
    so one built by the preset's rule starts from the source's embeddings too; a frozen (converged_aux)
    auxiliary keeps the one it loaded from train.aux_checkpoint."""
    model.main.load_state_dict(weights.main, strict=True)
    if weights.aux is not None and model.aux is not None and not model.cfg.freeze_aux:
        model.aux.load_state_dict(weights.aux, strict=True)


def start_from(model: PretrainingObjective, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, resumed: ray.train.Checkpoint | None,
               init_weights: Any, rank: int) -> TrainState:
    """The state a worker starts in: the run's checkpoint where there is one, else the `--init-from`
    weights (a resumed run goes on from its own steps, never back to the source), else the fresh model."""
    if resumed is None:
        if init_weights is not None:
            initialise(model, ray.get(init_weights))
        return TrainState()
    with resumed.as_directory() as directory:
        # The checkpoint holds rank 0's RNG; every other rank takes a stream of its own (`resumed_seed`).
        return checkpoint.load(Path(directory), model, optimizer, scheduler, restore_rng=rank == 0)


def build_training(
    cfg: PretrainConfig, device: torch.device = torch.device("cpu"), special: SpecialTokens = SpecialTokens()
) -> tuple[PretrainingObjective, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    check_step_options(cfg)
    model = build_pretraining_model(cfg.model, cfg.objective, special)
    if cfg.objective.freeze_aux:
        check_aux_checkpoint(cfg)
        checkpoint.load_auxiliary(Path(cfg.train.aux_checkpoint), model.aux)
    optimizer, scheduler = build_optimizer(model, cfg.train, device)
    return model, optimizer, scheduler


def check_aux_checkpoint(cfg: PretrainConfig) -> None:
    """converged_aux loads its auxiliary from a finished run: the driver asks before Ray starts, and
    every Ray-free caller of `build_training` (the curve probe) here."""
    if not cfg.objective.freeze_aux:
        return
    if not cfg.train.aux_checkpoint:
        raise UserError("the converged_aux variant needs --set train.aux_checkpoint=<checkpoint dir of a finished run>")
    if not (Path(cfg.train.aux_checkpoint) / "model.pt").is_file():
        raise UserError(f"train.aux_checkpoint={cfg.train.aux_checkpoint} holds no model.pt: give the checkpoint "
                        f"directory of a finished run (its MLflow tag {CHECKPOINT_TAG})")


def check_step_options(cfg: PretrainConfig) -> None:
    """train.compile_step compiles the whole step once, which needs the same shapes every batch
    (train.fixed_shapes); replayed as CUDA graphs, one micro-batch per optimizer step (`TrainingStep`)."""
    mode = cfg.train.compile_step
    if mode not in STEP_COMPILE_MODES:
        raise UserError(f"train.compile_step must be one of {STEP_COMPILE_MODES}, not {mode!r}")
    if mode != "off" and not cfg.train.fixed_shapes:
        raise UserError(f"train.compile_step={mode} needs train.fixed_shapes=true: the masked-position count "
                        "changes per batch, and each new count would compile the step again")
    if mode == "reduce-overhead" and cfg.cluster.gpus_per_worker:
        accumulations = {accumulation_steps(cfg, workers) for workers in cfg.cluster.worker_counts()}
        if accumulations != {1}:
            raise UserError("train.compile_step=reduce-overhead (CUDA graphs) takes one micro-batch per optimizer "
                            f"step, but this run accumulates {sorted(accumulations)}: set data.batch_size to "
                            "train.global_batch / cluster.workers, or compile_step=default")


def resumed_seed(seed: int, rank: int, step: int) -> int:
    """The torch seed of a rank other than 0 when it resumes at `step`: distinct per rank and per resume."""
    return seed + rank + 1_000_003 * step


def accumulation_steps(cfg: PretrainConfig, world_size: int) -> int:
    per_pass = cfg.data.batch_size * world_size
    if cfg.train.global_batch % per_pass:
        raise ValueError(f"train.global_batch={cfg.train.global_batch} is not a multiple of data.batch_size x workers "
                         f"= {cfg.data.batch_size} x {world_size}")
    return cfg.train.global_batch // per_pass


class Logger:
    """Rank 0's MLflow client and progress line; a no-op elsewhere."""

    def __init__(self, ctx: LoopContext, cfg: PretrainConfig, rank: int, world_size: int, device: torch.device,
                 model: torch.nn.Module | None = None):
        self.enabled = rank == 0
        self.model = model  # whose encoders' attention the first line (and any later change) names
        self.attention = ""  # the attention text last logged
        self.client = MlflowClient(ctx.tracking_uri) if self.enabled else None
        self.run_id, self.cfg, self.world_size, self.device = ctx.run_id, cfg, world_size, device
        peak = device_peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        self.peak = peak * world_size if peak else None

    def log(self, state: TrainState, interval: Interval, lr: float, grad_norm: float) -> None:
        if not self.enabled:
            return
        seconds = time.perf_counter() - interval.started
        step_seconds = seconds / max(1, interval.steps)
        seq_len = self.cfg.seq_len_at(state.step - 1)  # the interval's last step's (a log interval ends at the switch)
        tokens = interval.steps * self.cfg.train.global_batch * seq_len
        hours_key = "gpu_hours" if self.device.type == "cuda" else "cpu_worker_hours"
        metrics = {**interval.means(), "learning_rate": lr, "grad_norm": grad_norm,
                   "tokens_per_second": tokens / seconds, hours_key: state.device_hours}
        if self.peak:
            c = self.cfg
            flops = step_flops(c.model, c.objective, seq_len, c.train.global_batch, c.data.mask_rate, c.data.crop_fraction)
            metrics["mfu"] = flops / step_seconds / self.peak
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, state.step) for k, v in metrics.items()])
        left = self.cfg.tokens_left(state.step) / (tokens / seconds)  # at this rate, the long phase's longer steps included
        say(f"step {state.step}/{self.cfg.train.max_steps} | loss {metrics['loss']:.3f} | "
              + " ".join(f"{k.removesuffix('_loss')} {metrics[k]:.3f}" for k in
                         ("aux_mlm_loss", "copy_loss", "lm_loss", "scl_loss", "mlm_loss") if k in metrics)
              + f" | lr {lr:.2e} | {metrics['tokens_per_second']:,.0f} tok/s | {duration(left)} left"
              + self._attention())

    def _attention(self) -> str:
        """' | attention: ...' where what ran differs from what was last logged (so on the first line, and
        after a fallback met later, at a new shape), also set as the run's tags; else ''."""
        if self.model is None:
            return ""
        ran, fallbacks = attention_ran(self.model) or "none ran", attention_fallbacks() or "none"
        text = ran + ("" if fallbacks == "none" else f"; fallbacks: {fallbacks}")
        if text == self.attention:
            return ""
        self.attention = text
        for tag, value in ((ATTENTION_TAG, ran), (ATTENTION_FALLBACKS_TAG, fallbacks)):
            self.client.set_tag(self.run_id, tag, value[:5000])  # MLflow's limit on a tag's value
        return f" | attention: {text}"

    def precision(self, now: str) -> None:
        """Tag what the steps compute in; a run resumed on a machine that computes otherwise keeps both."""
        if self.enabled:
            before = self.client.get_run(self.run_id).data.tags.get(PRECISION_TAG, "")
            self.client.set_tag(self.run_id, PRECISION_TAG, merged_precision(before, now))

    def stop(self, reason: str) -> None:
        if self.enabled:
            self.client.set_tag(self.run_id, STOP_TAG, reason)
            say(f"STOPPED: {reason}")


def merged_precision(before: str, now: str) -> str:
    """The run's precision tag after a (re)start computing in `now`: "bf16", or "bf16 then fp32" where a
    resume moved it to a CPU without native bf16 (the claims never pool such a run with either)."""
    return before if now in before.split(" then ") else " then ".join(filter(None, (before, now)))


def say(line: str) -> None:
    """One line to the worker's stdout, which Ray forwards to the driver. Not `print`: Ray Train V2
    patches print in workers to tee it *and* log it, so each line would reach the console twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def duration(seconds: float) -> str:
    """19m42s, or 1h05m from an hour on: the time left of a run or a study."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def save_and_report(model, optimizer, scheduler, state: TrainState, cfg: PretrainConfig, ctx: LoopContext,
                    rank: int) -> str:
    """Rank 0 writes the checkpoint and copies it to storage; then every rank reports it (report is a
    barrier). A write that fails (a full disk, no permission, a vanished mount) is one line naming the
    storage, the file and the cause, which rank 0 hands every rank: they all return it, together, before
    reporting. No rank waits in a collective for one that raised, and Ray Train, seeing no worker error,
    retries nothing (its retries would print each worker's traceback and fail again on the same storage).
    What a failed copy left in storage was never reported: a resume skips it (`checkpoint.newest_intact`)."""
    name = checkpoint.directory_name(state.step)
    with tempfile.TemporaryDirectory() as tmp:
        persisted, failure = None, ""
        if rank == 0:
            try:
                checkpoint.save(Path(tmp), model, optimizer, scheduler, state, to_yaml(cfg), ctx.tokenizer_dir)
                persisted = persist(ray.train.Checkpoint.from_directory(tmp), name, state.step, ctx)
            except OSError as error:
                failure = storage_failure(ctx.storage, name, error)
        failure = broadcast_from_rank_zero(failure)
        if not failure:
            ray.train.report({"step": state.step, "tokens_seen": state.tokens_seen}, checkpoint=persisted,
                             checkpoint_dir_name=name, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
    return failure


def persist(written: ray.train.Checkpoint, name: str, step: int, ctx: LoopContext) -> ray.train.Checkpoint:
    """The checkpoint copied into the run's storage folder, as Ray Train's own report would copy it."""
    if step == ctx.storage_error_step:
        raise OSError(errno.ENOSPC, "No space left on device (injected: jobs.faults)")
    return ray.train.get_context().get_storage().persist_current_checkpoint(written, name)


STORAGE_FAILURE = "the checkpoint could not be written"


def storage_failure(storage: str, name: str, error: OSError) -> str:
    """One line: the storage, the file (pyarrow's upload errors name none: then the checkpoint's folder),
    the cause."""
    cause = error.strerror or str(error)
    where = error.filename or f"{storage}/{name}"
    return f"{STORAGE_FAILURE} to storage {storage}: {where}: {cause}".replace("\n", " ")


def _maybe_inject_failure(ctx: LoopContext, cfg: PretrainConfig, state: TrainState, rank: int) -> None:
    """Fault injection for the recovery test: rank 0's process dies once, like a lost node would."""
    if rank == 0 and ctx.fail_at_step and state.step == ctx.fail_at_step:
        marker = Path(ctx.failure_marker)
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"worker killed at step {state.step}\n")
            say(f"injected failure: killing rank 0 at step {state.step}")
            os._exit(1)


def train_loop_per_worker(config: dict) -> None:
    cfg: PretrainConfig = from_dict(config["cfg"])  # plain data: jobs.pretraining.job.loop_config
    ctx: LoopContext = config["ctx"]
    train_ctx = ray.train.get_context()
    rank, world_size = train_ctx.get_world_rank(), train_ctx.get_world_size()
    torch.manual_seed(cfg.train.seed + rank)
    device = ray.train.torch.get_device()

    model, optimizer, scheduler = build_training(cfg, device, ctx.special)
    resumed = ray.train.get_checkpoint()
    state = start_from(model, optimizer, scheduler, resumed, ctx.init_weights, rank)
    if resumed:
        if rank != 0:  # or all ranks would draw the same dropout masks and replacements after a resume
            torch.manual_seed(resumed_seed(cfg.train.seed, rank, state.step))
        if state.mlflow_run_id and state.mlflow_run_id != ctx.run_id:  # the driver checks first; storage may lag
            raise RuntimeError(f"checkpoint {resumed.path} belongs to MLflow run {state.mlflow_run_id}, not {ctx.run_id}")
        if rank == 0:
            say(f"resumed from {resumed.path} at step {state.step}"
                + (f" with {world_size} workers (was {state.world_size})" if state.world_size != world_size else ""))
    state.reshard(world_size)
    state.mlflow_run_id = ctx.run_id  # saved with every checkpoint: only this run may resume from them
    if cfg.train.compile_step != "off":  # in place, before DDP wraps the objective: checkpoints keep their keys
        compile_step(model, cfg.train.compile_step)
        if rank == 0:
            say(f"torch.compile: the whole step as one graph (mode {cfg.train.compile_step}), on its first batch")
    elif cfg.train.compile:
        compiled = compile_encoders(model)  # in place, before DDP wraps the objective: checkpoints keep their keys
        if rank == 0:
            say(f"torch.compile: {len(compiled)} Transformer layers, compiled on their first batches")
    wrapped = ray.train.torch.prepare_model(model)  # to device; DDP when world_size > 1
    optimizer_to(optimizer, device)
    accumulation = accumulation_steps(cfg, world_size)
    # The same step `bench` times: autocast, backward per micro-batch, clipping, fused AdamW.
    cuda_graphs = cfg.train.compile_step == "reduce-overhead" and device.type == "cuda"
    precision = step_precision(device, cfg.train.bf16, cfg.train.bf16_on_cpu)
    step = TrainingStep(wrapped, model.parameters(), optimizer, scheduler, device, clip_norm=cfg.train.clip_norm,
                        accumulation=accumulation, bf16=cfg.train.bf16, bf16_on_cpu=precision == "bf16",
                        cuda_graphs=cuda_graphs)
    if rank == 0 and (note := fp32_fallback_note(device, cfg.train.bf16, cfg.train.bf16_on_cpu)):
        say(note + " (the run's tag cocolm.precision)")
    # Fixed shapes: the masked-position index padded to a count set by the mask rate and the block.
    fixed_rate = cfg.data.mask_rate if cfg.train.fixed_shapes else None
    logger = Logger(ctx, cfg, rank, world_size, device, model)
    logger.precision(precision)
    interval, micro, last_step_time = Interval(), 0, time.perf_counter()
    warmed_up = 0  # the block length warmed up at
    gpus = world_size * (1 if device.type == "cuda" else 0)

    while state.step < cfg.train.max_steps:
        data_cfg, shard = phase(cfg, state)
        # Resuming mid-epoch: the stream reads past what the checkpoint already consumed.
        batches = pretraining_batches(ray.train.get_dataset_shard(shard), data_cfg, state.epoch, drop_last=True,
                                      skip=state.batches_in_epoch, special=ctx.special)
        for batch in batches:
            batch = to_device(batch, device, fixed_rate)  # the step's host-side inputs computed before the copy
            if warmed_up != data_cfg.seq_len:  # attention probed and tuned at the step's shapes, eagerly, rank 0 first
                step.warm_up(batch, model)
                warmed_up = data_cfg.seq_len
            micro += 1
            last = micro % accumulation == 0
            interval.add(step.micro_batch(batch, last))
            state.batches_in_epoch += 1
            if not last:
                continue
            grad_norm = step.update()
            now = time.perf_counter()
            state.step += 1
            state.tokens_seen += cfg.train.global_batch * data_cfg.seq_len
            state.device_hours += (now - last_step_time) * (gpus or world_size) / 3600
            last_step_time = now
            interval.record(state.step, grad_norm)
            final = state.step == cfg.train.max_steps
            switch = state.step == cfg.long_from and not final  # the long phase's stream from the next step
            log_now = state.step % cfg.train.log_every == 0 or final or switch  # no interval spans two lengths
            checkpoint_now = state.step % cfg.train.checkpoint_every == 0 or final
            if log_now or checkpoint_now:
                # The norms are read here, not per step (the host never waits inside a step); the
                # updates they flag were skipped, and no checkpoint is written after them.
                bad = interval.nonfinite()
                if bad:  # identical on every rank after DDP's all-reduce: all stop together
                    first, norm = bad[0]
                    logger.stop(f"non-finite loss or gradient at step {first} (grad norm {norm}; "
                                f"{len(bad)} such step(s) by step {state.step}); the last good checkpoint is kept")
                    return
            if log_now:
                logger.log(state, interval, scheduler.get_last_lr()[0], grad_norm.item())
                interval = Interval()
            if checkpoint_now and (failure := save_and_report(model, optimizer, scheduler, state, cfg, ctx, rank)):
                logger.stop(failure)
                return
            _maybe_inject_failure(ctx, cfg, state, rank)
            if state.step >= cfg.train.max_steps:
                return
            if switch:
                break
        else:
            state.epoch += 1
            state.batches_in_epoch = 0


def phase(cfg: PretrainConfig, state: TrainState) -> tuple[DataConfig, str]:
    """The data config and the dataset shard of the next step: data.seq_len's stream, then for the last
    train.long_steps steps data.long_seq_len's, read from its start (the state's data position is moved
    to it once, so a resume on either side of the switch reads on where it stopped)."""
    seq_len = cfg.seq_len_at(state.step)
    if (state.seq_len or cfg.data.seq_len) != seq_len:
        state.epoch, state.batches_in_epoch = 0, 0
    state.seq_len = seq_len
    if seq_len == cfg.data.seq_len:
        return cfg.data, "train"
    return replace(cfg.data, seq_len=seq_len), LONG_SHARD


def optimizer_to(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """A restored optimizer's state was loaded on CPU; move it to the parameters' device."""
    for param_state in optimizer.state.values():
        for key, value in param_state.items():
            if torch.is_tensor(value) and key != "step":
                param_state[key] = value.to(device)

