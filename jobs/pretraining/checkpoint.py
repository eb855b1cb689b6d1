"""The pretraining checkpoint (docs/design.md section 3.2), one directory:

    model.pt        state dict of the *unwrapped* PretrainingObjective (never DDP's `.module.` or
                    compile's `_orig_mod.` prefixes): main encoder, auxiliary, heads
    optimizer.pt    AdamW state          scheduler.pt   LR schedule state
    rng.pt          torch's RNG state of rank 0, a tensor (dropout; the data corruption is seeded per block)
    rng.json        python's RNG state of rank 0 (a version, 625 ints, the gauss cache)
    state.json      step, data position (epoch, batches consumed in it, their block length), tokens seen, hours spent
    config.yaml     the resolved run config       tokenizer/   the tokenizer files

Nothing in a checkpoint is unpickled: every .pt file is read with torch's weights_only loader, which
builds tensors and plain containers and refuses anything else before it runs (a checkpoint is data
that may come from a shared bucket, and a full pickle runs whatever code it names).
"""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.fs
import torch

from model import PretrainingObjective, build_pretraining_model

from jobs.cli import UserError
from jobs.pretraining.config import PretrainConfig, from_yaml


def directory_name(step: int) -> str:
    """The folder Ray Train stores the checkpoint of `step` in, under the run's storage."""
    return f"checkpoint_step_{step:08d}"


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches each worker consumed in `epoch`: skipped on resume
    seq_len: int = 0  # the block length of the stream `epoch` and `batches_in_epoch` count in (0: data.seq_len,
    #                   as in checkpoints from before data.long_seq_len)
    world_size: int = 1  # workers that consumed them: a resume with another world size rescales the skip
    tokens_seen: int = 0
    device_hours: float = 0.0  # accelerator-hours (GPU-hours on GPU, worker-hours on CPU)
    mlflow_run_id: str = ""  # the run these checkpoints belong to: only that run may resume from them

    def reshard(self, world_size: int) -> None:
        """The data position for `world_size` workers: an elastic run that lost (or gained) workers
        resumes after the same number of micro-batches over all workers, so no data is re-read."""
        self.batches_in_epoch = self.batches_in_epoch * self.world_size // world_size
        self.world_size = world_size


def owners(storage: str, run_name: str) -> dict[str, str]:
    """Checkpoint directory -> the MLflow run id it records ("" for checkpoints older than that field),
    for every checkpoint Ray Train keeps under `storage/run_name` (a local path or a pyarrow URI)."""
    if "://" in storage and not storage.startswith("file://"):
        fs, root = pyarrow.fs.FileSystem.from_uri(storage)
    else:
        fs, root = pyarrow.fs.LocalFileSystem(), str(Path(storage.removeprefix("file://")).expanduser().resolve())
    found = {}
    for info in fs.get_file_info(pyarrow.fs.FileSelector(f"{root}/{run_name}", allow_not_found=True)):
        if info.type == pyarrow.fs.FileType.Directory and info.base_name.startswith("checkpoint_"):
            try:
                with fs.open_input_stream(f"{info.path}/state.json") as f:
                    found[info.path] = json.loads(f.read()).get("mlflow_run_id", "")
            except (OSError, ValueError):
                continue  # a checkpoint Ray never finished writing: Ray Train ignores it too
    return found


def check_owner(found: dict[str, str], run_id: str | None, storage: str, run_name: str, tracking_uri: str) -> None:
    """Refuse checkpoints that cannot prove they belong to the run about to resume (`run_id`, None when
    the tracking store has no run of this name yet): resuming another run's finished checkpoint
    would mark a new run FINISHED with no loss curve and another run's encoder."""
    foreign = {owner for owner in found.values() if owner != run_id and (owner or run_id is None)}
    if not foreign:
        return
    where = f"{storage.rstrip('/')}/{run_name}"
    holder = ", ".join(sorted(owner or "an unknown run (no run id recorded)" for owner in foreign))
    raise UserError(
        f"{where} holds checkpoints of MLflow run {holder}, and the tracking store {tracking_uri} "
        + (f"has run {run_id} under this name instead" if run_id else "has no run of this name")
        + ": resume with the tracking store that holds that run (--tracking-uri), or start fresh with "
          "another --name or --storage (or delete that folder)")


def save(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: TrainState,
    config_yaml: str,
    tokenizer_dir: str | Path | None,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), directory / "model.pt")
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    torch.save(scheduler.state_dict(), directory / "scheduler.pt")
    torch.save({"torch": torch.get_rng_state()}, directory / "rng.pt")
    version, internal, gauss = random.getstate()
    (directory / "rng.json").write_text(json.dumps({"python": [version, list(internal), gauss]}))
    (directory / "state.json").write_text(json.dumps(asdict(state), indent=1))
    (directory / "config.yaml").write_text(config_yaml)
    if tokenizer_dir:
        shutil.copytree(tokenizer_dir, directory / "tokenizer", dirs_exist_ok=True)
    return directory


def load(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    restore_rng: bool = True,
) -> TrainState:
    model.load_state_dict(load_tensors(directory / "model.pt"))
    if optimizer is not None:
        optimizer.load_state_dict(load_tensors(directory / "optimizer.pt"))
    if scheduler is not None:
        scheduler.load_state_dict(load_tensors(directory / "scheduler.pt"))
    if restore_rng:
        rng = load_tensors(directory / "rng.pt")
        torch.set_rng_state(rng["torch"])
        if (directory / "rng.json").exists():
            version, internal, gauss = json.loads((directory / "rng.json").read_text())["python"]
            random.setstate((version, tuple(internal), gauss))
        else:  # a checkpoint from before rng.json: python's state is in rng.pt, as a tuple of ints
            random.setstate(rng["python"])
    return TrainState(**json.loads((directory / "state.json").read_text()))


def load_tensors(path: Path):
    """A .pt file of the checkpoint through torch's weights_only loader (tensors, dicts, lists, tuples,
    numbers, strings, None): a file that holds anything else, such as a pickled object whose loading
    would run code, is refused before any of it runs, with an error that names the file."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"WeightsUnpickler error: (.*?)(?:\. Please|\n|$)", str(error))
        raise UserError(
            f"{path} holds more than tensors and plain data ({found.group(1) if found else error}), so it was "
            f"not loaded and nothing in it ran. This platform never writes such a file: it was altered or "
            f"comes from elsewhere; remove that checkpoint folder (or choose another --storage or --name) "
            f"to go on without it") from None


def load_pretrained(directory: Path) -> tuple[PretrainingObjective, PretrainConfig]:
    """The PretrainingObjective of a checkpoint, rebuilt from its config.yaml, weights loaded (eval needs no RNG),
    and that resolved config."""
    cfg = from_yaml((Path(directory) / "config.yaml").read_text())
    model = build_pretraining_model(cfg.model, cfg.objective)
    load(Path(directory), model, restore_rng=False)
    return model, cfg


def load_auxiliary(directory: Path, aux: torch.nn.Module) -> None:
    """converged_aux: the auxiliary of a finished run, with the embeddings it was trained with.

    Shared modules appear under every owner in a state dict, so the `aux.` keys hold them too.
    """
    full = load_tensors(Path(directory) / "model.pt")
    aux.load_state_dict({k.removeprefix("aux."): v for k, v in full.items() if k.startswith("aux.")}, strict=True)
