"""Fine-tuning grids (`platform/grids/*.yaml`): the search spaces per task and the grid points they give."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


from jobs.cli import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, PROBABILITY, Range, UserError, read_yaml, short_repr
from jobs.names import fraction_target

GRIDS = Path(__file__).resolve().parents[2] / "platform" / "grids"


@dataclass(frozen=True)
class Space:
    epochs: tuple[int, ...]
    lr: tuple[float, ...]
    batch_size: tuple[int, ...]
    warmup: tuple[float, ...]
    lr_by_preset: dict[str, tuple[float, ...]] = field(default_factory=dict)  # e.g. large++'s own learning rates
    max_length: int = 0  # tokens per example for this space's tasks; 0: the grid's
    doc_stride: int = 128  # span tasks (SQuAD 2.0): tokens between the starts of a context's windows
    max_question_length: int = 64  # span tasks: a question's tokens at most

    def learning_rates(self, lr_set: str) -> tuple[float, ...]:
        return self.lr_by_preset.get(lr_set, self.lr)


@dataclass(frozen=True)
class Grid:
    name: str
    spaces: dict[str, Space]
    tasks: dict[str, str]  # task name -> space name; "default" for tasks not named
    max_length: int = 512
    max_train: int = 0  # 0 = all
    max_dev: int = 0

    def space(self, task: str) -> Space:
        name = self.tasks.get(task, self.tasks.get("default"))
        if name is None:
            raise UserError(f"grid {self.name}: no space for task {task!r} and no `default` in its tasks")
        return self.spaces[name]

    def max_length_of(self, task: str) -> int:
        return self.space(task).max_length or self.max_length

    def points(self, task: str, lr_set: str = "") -> list[dict[str, Any]]:
        """Every grid point of a task, in grid order (epochs, lr, batch size, warm-up)."""
        s = self.space(task)
        return [{"task": task, "lr": lr, "batch_size": bs, "epochs": ep, "warmup": wu}
                for ep in s.epochs for lr in s.learning_rates(lr_set) for bs in s.batch_size for wu in s.warmup]

    def lr_set(self, chosen: str | None, preset: str) -> str:
        """The learning-rate list: `chosen` (--lr-set) if given (it must exist), else the pretraining
        preset's if the grid has one for it (large++), else the grid's default ("base")."""
        known = {name for space in self.spaces.values() for name in space.lr_by_preset}
        if chosen is not None and chosen != "base" and chosen not in known:
            raise UserError(f"--lr-set {chosen!r}: grid {self.name} has learning-rate lists for "
                             f"{sorted(known) or 'none'} besides 'base'")
        return chosen or (preset if preset in known else "base")


def available_grids() -> list[str]:
    return sorted(p.stem for p in GRIDS.glob("*.yaml"))


def load_grid(name_or_path: str) -> Grid:
    """A grid by name (platform/grids/NAME.yaml) or a YAML file; unknown keys are errors that name them."""
    path = Path(name_or_path)
    if not path.is_file():
        path = GRIDS / f"{name_or_path}.yaml"
        if not path.is_file():
            raise UserError(f"unknown grid {name_or_path!r}: neither a file nor one of {available_grids()}")
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a grid is a mapping (max_length:, spaces:, tasks:), not {short_repr(raw)}")
    _check_keys(raw, {"max_length", "max_train", "max_dev", "spaces", "tasks"}, str(path))
    spaces = {}
    for name, values in (raw.get("spaces") or {}).items():
        _check_keys(values, {f.name for f in fields(Space)}, f"{path}: spaces.{name}")
        missing = [k for k in ("epochs", "lr", "batch_size", "warmup") if k not in values]
        if missing:
            raise UserError(f"{path}: spaces.{name} lacks {missing}")
        lists = {k: _numbers(path, f"spaces.{name}.{k}", values[k], *rule) for k, rule in SPACE_LISTS.items()}
        by_preset = {k: _numbers(path, f"spaces.{name}.lr_by_preset.{k}", lrs, *SPACE_LISTS["lr"])
                     for k, lrs in (values.get("lr_by_preset") or {}).items()}
        scalars = {k: _number(path, f"spaces.{name}.{k}", values[k], int, SCALARS[k]) for k in SCALARS if k in values}
        spaces[name] = Space(**lists, lr_by_preset=by_preset, **scalars)
    tasks = {str(k).lower(): str(v) for k, v in (raw.get("tasks") or {}).items()}
    unknown = sorted(set(tasks.values()) - set(spaces))
    if not spaces or unknown:
        raise UserError(f"{path}: tasks name space(s) {unknown} that `spaces` does not define ({sorted(spaces)})")
    top = {k: _number(path, k, raw[k], int, SCALARS[k]) for k in ("max_length", "max_train", "max_dev") if k in raw}
    return Grid(path.stem, spaces, tasks, **top)


# Every number a grid gives, checked when the grid is read (before Ray starts) by the range rules of the
# presets and options (jobs.cli): (type, range) per list of a space; the range of each single number.
SPACE_LISTS = {"epochs": (int, AT_LEAST_ONE), "lr": (float, POSITIVE), "batch_size": (int, AT_LEAST_ONE),
               "warmup": (float, PROBABILITY)}  # warm-up: a fraction of the steps, 1 would leave none to train
MAX_LENGTH = Range(8)  # tokens per example: room for the special tokens and some text (--max-length too)
SCALARS = {"max_length": MAX_LENGTH, "doc_stride": AT_LEAST_ONE, "max_question_length": AT_LEAST_ONE,
           "max_train": NON_NEGATIVE, "max_dev": NON_NEGATIVE}


def _numbers(path: Path, key: str, values: Any, kind: type, bounds: Range) -> tuple:
    """A grid's list of values at `key`, each of `kind` and in `bounds`; else one line naming file, key and value."""
    if not isinstance(values, list) or not values:
        raise UserError(f"{path}: {key} must be a list of one or more values, not {short_repr(values)}")
    return tuple(_number(path, key, value, kind, bounds) for value in values)


def _number(path: Path, key: str, value: Any, kind: type, bounds: Range) -> int | float:
    """One value of a grid as `kind` (YAML reads 1e-3 as a string, so strings are converted), finite and in
    `bounds`; 2.5 epochs is not an int, not 2."""
    try:
        number = None if isinstance(value, bool) else kind(float(value) if kind is int else value)
        if number is not None and (not math.isfinite(number) or kind is int and number != float(value)):
            number = None
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None:
        raise UserError(f"{path}: {key}={short_repr(value)} is not {'a whole' if kind is int else 'a finite'} number")
    try:
        bounds.check(key, number)
    except UserError as error:
        raise UserError(f"{path}: {error}") from None
    return number


def _check_keys(values: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")


def data_key(point: dict[str, Any]) -> str:
    """Which encoded data a grid point trains on: its task, on a fraction of the labels when it has one."""
    return fraction_target(point["task"], point.get("label_fraction", 1.0))


def trial_name(config: dict[str, Any]) -> str:
    p = config["point"]
    labels = f"-labels{p['label_fraction']:g}" if p.get("label_fraction", 1.0) < 1 else ""
    return (f"{p['task']}{labels}-lr{p['lr']:g}-bs{p['batch_size']}-ep{p['epochs']}-wu{p['warmup']:g}"
            f"-seed{config['seed']}")
