"""The pretraining checkpoint (docs/design.md section 3.2), one directory:

    model.pt        state dict of the *unwrapped* PretrainingObjective (never DDP's `.module.` or
                    compile's `_orig_mod.` prefixes): main encoder, auxiliary, heads
    optimizer.pt    AdamW state          scheduler.pt   LR schedule state
    rng.pt          torch's RNG state of rank 0, a tensor (dropout; the data corruption is seeded per block)
    rng.json        python's RNG state of rank 0 (a version, 625 ints, the gauss cache)
    state.json      step, data position (epoch, batches consumed in it, their block length), tokens seen, hours spent
    config.yaml     the resolved run config       tokenizer/   the tokenizer files
    manifest.json   written last: every other file's size and sha256 (`why_torn`)

Nothing in a checkpoint is unpickled: every .pt file is read with torch's weights_only loader, which
builds tensors and plain containers and refuses anything else before it runs (a checkpoint is data
that may come from a shared bucket, and a full pickle runs whatever code it names).
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.fs
import torch

from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

from model import PretrainingObjective, build_pretraining_model

from jobs.cli import UserError
from jobs.data.tokens import tokenizer_files
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
    fs, root = filesystem(storage)
    found = {}
    for path in checkpoint_dirs(fs, f"{root}/{run_name}"):
        try:
            with fs.open_input_stream(f"{path}/state.json") as f:
                found[path] = json.loads(f.read()).get("mlflow_run_id", "")
        except (OSError, ValueError):
            continue  # a checkpoint Ray never finished writing: Ray Train ignores it too
    return found


def filesystem(storage: str) -> tuple[pyarrow.fs.FileSystem, str]:
    """The pyarrow file system of a storage (a local path or a URI) and its root path in it."""
    if "://" in storage and not storage.startswith("file://"):
        return pyarrow.fs.FileSystem.from_uri(storage)
    return pyarrow.fs.LocalFileSystem(), str(Path(storage.removeprefix("file://")).expanduser().resolve())


def checkpoint_dirs(fs: pyarrow.fs.FileSystem, run_dir: str) -> list[str]:
    """The checkpoint folders of a run, oldest first (their names hold the step, zero-padded)."""
    infos = fs.get_file_info(pyarrow.fs.FileSelector(run_dir, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pyarrow.fs.FileType.Directory and i.base_name.startswith("checkpoint_"))


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


MANIFEST = "manifest.json"
TORN_PREFIX = "torn_"  # a torn checkpoint's folder is renamed with it: no longer `checkpoint_*`, so nothing resumes from it


def write_manifest(directory: Path) -> None:
    """The checkpoint's last file: the size and sha256 of every other file. Ray uploads a checkpoint's files
    in parallel, so the manifest's presence in storage proves nothing alone; a resume checks every file
    against it (`why_torn`)."""
    files = {p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p.open("rb"))[1]}
             for p in sorted(directory.rglob("*")) if p.is_file() and p != directory / MANIFEST}
    (directory / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def _sha256(stream) -> tuple[int, str]:
    """(bytes, sha256 hex) of a binary stream read in 1 MiB pieces, then closed: a checkpoint's files may be GBs."""
    digest, size = hashlib.sha256(), 0
    with stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def why_torn(fs: pyarrow.fs.FileSystem, path: str, legacy: bool = False) -> str | None:
    """Why the checkpoint folder `path` cannot be resumed from (None: intact). A file that differs from the
    manifest, or a missing manifest, is what a process killed while writing or uploading leaves. A
    `legacy` checkpoint, from a run whose checkpoints all predate manifests, is judged by loading it."""
    if fs.get_file_info(f"{path}/{MANIFEST}").type == pyarrow.fs.FileType.NotFound:
        return _why_unloadable(fs, path) if legacy else f"it has no {MANIFEST} (its writing was cut short)"
    try:
        with fs.open_input_stream(f"{path}/{MANIFEST}") as f:
            files = json.loads(f.read())["files"]
        expected = {name: (int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"its {MANIFEST} is unreadable ({type(error).__name__})"
    for name, (size, sha) in expected.items():
        if fs.get_file_info(f"{path}/{name}").type == pyarrow.fs.FileType.NotFound:
            return f"{name} is missing"
        found_size, found_sha = _sha256(fs.open_input_stream(f"{path}/{name}"))
        if (found_size, found_sha) != (size, sha):
            return f"{name} is not the file written ({found_size} bytes, sha256 {found_sha[:12]}; written: {size} bytes, {sha[:12]})"
    return None


def _why_unloadable(fs: pyarrow.fs.FileSystem, path: str) -> str | None:
    """A checkpoint without a manifest: its state.json must parse and every .pt file must load."""
    for name in ("state.json", "model.pt", "optimizer.pt", "scheduler.pt", "rng.pt"):
        try:
            with fs.open_input_stream(f"{path}/{name}") as f:
                data = f.read()
            if name.endswith(".json"):
                json.loads(data)
            else:
                torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - whatever a torn file raises, the checkpoint cannot be used
            return f"{name} does not load ({type(error).__name__}: {str(error)[:120]})".replace("\n", " ")
    return None


def newest_intact(storage: str, run_name: str) -> str | None:
    """The newest checkpoint of the run that `why_torn` passes (None: none), after setting aside every
    newer one, with one line each: a torn newest checkpoint otherwise stops every resume for good, Ray
    Train resuming from the newest one it recorded. Each is first dropped from Ray's record of the run's
    checkpoints (`forget`), then renamed `torn_checkpoint_...` for inspection; a later checkpoint of the
    same step is then written to a clean folder, which Ray would otherwise delete with the torn entry."""
    fs, root = filesystem(storage)
    run_dir = f"{root}/{run_name}"
    found = checkpoint_dirs(fs, run_dir)
    legacy = not any(fs.get_file_info(f"{p}/{MANIFEST}").type != pyarrow.fs.FileType.NotFound for p in found)
    for path in reversed(found):
        reason = why_torn(fs, path, legacy)
        if reason is None:
            return path
        forget(fs, run_dir, path.rsplit("/", 1)[-1])
        aside = f"{run_dir}/{TORN_PREFIX}{path.rsplit('/', 1)[-1]}"
        fs.delete_dir_contents(aside, missing_dir_ok=True)
        fs.move(path, aside)
        print(f"skipping checkpoint {path}: {reason}; set aside as {aside}", flush=True)
    return None


def forget(fs: pyarrow.fs.FileSystem, run_dir: str, name: str) -> None:
    """Drop the checkpoint folder `name` from Ray Train's snapshot of the run's checkpoints (Ray 2.60's
    CheckpointManager state), so Ray resumes from the newest one left. Replaced through a temporary
    file: a crash here leaves the old snapshot, never half a new one."""
    path = f"{run_dir}/{CHECKPOINT_MANAGER_SNAPSHOT_FILENAME}"
    if fs.get_file_info(path).type == pyarrow.fs.FileType.NotFound:
        return
    with fs.open_input_stream(path) as f:
        snap = json.loads(f.read())
    kept = [(r, i) for r, i in zip(snap["checkpoint_results"], snap["checkpoint_report_indices"])
            if r["checkpoint_dir_name"] != name]
    snap["checkpoint_results"], snap["checkpoint_report_indices"] = [r for r, _ in kept], [i for _, i in kept]
    if (snap.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name") == name:
        snap["latest_checkpoint_result"] = max(kept, key=lambda ri: ri[1])[0] if kept else None
    pending = [(r, v) for r, v in zip(snap["pending_training_results"], snap["pending_validation_specs"])
               if r["checkpoint_dir_name"] != name]
    snap["pending_training_results"], snap["pending_validation_specs"] = [r for r, _ in pending], [v for _, v in pending]
    for key in ("validated_checkpoint_dir_names", "timed_out_validation_checkpoint_dir_names",
                "failed_validation_checkpoint_dir_names"):
        snap[key] = [n for n in snap.get(key, []) if n != name]
    with fs.open_output_stream(path + ".tmp") as f:
        f.write(json.dumps(snap).encode())
    fs.move(path + ".tmp", path)


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
        (directory / "tokenizer").mkdir(exist_ok=True)
        for file in tokenizer_files(tokenizer_dir):
            shutil.copy2(file, directory / "tokenizer" / file.name)
    write_manifest(directory)
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
