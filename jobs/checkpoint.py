"""The pretraining checkpoint (DESIGN contract), one directory:

    model.pt        state dict of the *unwrapped* PretrainingObjective (never DDP's `.module.` or
                    compile's `_orig_mod.` prefixes): main encoder, auxiliary, heads
    optimizer.pt    AdamW state          scheduler.pt   LR schedule state
    rng.pt          torch / python RNG of rank 0 (dropout; the data corruption is seeded per block)
    state.json      step, data position (epoch, batches consumed in it), tokens seen, hours spent
    config.yaml     the resolved run config       tokenizer/   the tokenizer files
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches this worker consumed in `epoch`: skipped on resume
    tokens_seen: int = 0
    device_hours: float = 0.0  # accelerator-hours (GPU-hours on GPU, worker-hours on CPU)


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
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, directory / "rng.pt")
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
    model.load_state_dict(torch.load(directory / "model.pt", map_location="cpu", weights_only=True))
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=True))
    if restore_rng:
        rng = torch.load(directory / "rng.pt", weights_only=False)  # python's RNG state is a tuple, not tensors
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
    return TrainState(**json.loads((directory / "state.json").read_text()))


def load_pretrained(directory: Path) -> tuple[torch.nn.Module, dict]:
    """The PretrainingObjective of a checkpoint, rebuilt from its config.yaml, weights loaded (eval needs no RNG),
    and that resolved config as a dict."""
    import yaml

    from model import ModelConfig, ObjectiveConfig, build_pretraining_model

    resolved = yaml.safe_load((Path(directory) / "config.yaml").read_text())
    model = build_pretraining_model(ModelConfig(**resolved["model"]), ObjectiveConfig(**resolved["objective"]))
    load(Path(directory), model, restore_rng=False)
    return model, resolved


def load_auxiliary(directory: Path, aux: torch.nn.Module) -> None:
    """converged_aux: the auxiliary of a finished run, with the embeddings it was trained with.

    Shared modules appear under every owner in a state dict, so the `aux.` keys hold them too.
    """
    full = torch.load(Path(directory) / "model.pt", map_location="cpu", weights_only=True)
    aux.load_state_dict({k.removeprefix("aux."): v for k, v in full.items() if k.startswith("aux.")}, strict=True)
