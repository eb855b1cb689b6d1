"""Fine-tuning grids (`platform/grids/*.yaml`): the search spaces per task and the grid points they give."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from jobs.cli import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, PROBABILITY, Range, UserError, short_repr
from jobs.config_reader import read_yaml, typed
from jobs.finetuning.tasks.metrics import METRICS
from jobs.finetuning.tasks.specs import GLUE, SNLI, SQUAD_V2
from jobs.names import fraction_target

GRIDS = Path(__file__).resolve().parents[2] / "platform" / "grids"


@dataclass(frozen=True)
class Space:
    """One search space: every combination of its lists is a grid point. `lr` is the peak learning rate of
    the linear warm-up and decay, the quantity a pretraining preset calls `train.peak_lr`: a grid names it
    as the fine-tuning papers' tables do (and the trials' names, `-lr5e-05-`, and MLflow params follow)."""

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
    # Results published for the grid's settings, in percent: task-table target (MNLI-m, SQuAD 2.0) -> {metric
    # as the task's spec names it (accuracy, f1, exact): value}; the task table sets them beside the medians.
    published: dict[str, dict[str, float]] = field(default_factory=dict)

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
    for name, space in (raw.get("spaces") or {}).items():
        missing = [k for k in LISTS if isinstance(space, dict) and k not in space]
        if missing:
            raise UserError(f"{path}: spaces.{name} lacks {missing}")
    values = typed(Grid, raw, ranges=RANGES, where=str(path), settable=SETTABLE)
    for name, space in values.get("spaces", {}).items():
        for key in LISTS:
            if not getattr(space, key):
                raise UserError(f"{path}: spaces.{name}.{key} must be a list of one or more values, not []")
    spaces = values.get("spaces", {})
    tasks = {str(k).lower(): str(v) for k, v in (values.get("tasks") or {}).items()}
    unknown = sorted(set(tasks.values()) - set(spaces))
    if not spaces or unknown:
        raise UserError(f"{path}: tasks name space(s) {unknown} that `spaces` does not define ({sorted(spaces)})")
    published = _published(values.get("published", {}), path)
    return Grid(**{**values, "name": path.stem, "spaces": spaces, "tasks": tasks, "published": published})


def _known_targets() -> dict[str, tuple[str, ...]]:
    """Every built-in task-table target (MNLI-m, MNLI-mm, SQuAD 2.0, ...) -> its task's metrics."""
    specs = [*(spec for spec, _ in GLUE.values()), SNLI, SQUAD_V2]
    return {spec.target(split): spec.metrics for spec in specs for split in spec.dev_splits}


def _published(published: dict[str, dict[str, float]], path: Path) -> dict[str, dict[str, float]]:
    """`published` with each built-in target spelled as the task table spells it (mnli-m -> MNLI-m); a metric
    the target's task does not compute (a user task's: a classification or regression metric) is an error,
    so a number is never set beside nothing."""
    known = _known_targets()
    spelled = {name.lower(): name for name in known}
    out = {}
    for target, metrics in published.items():
        name = spelled.get(target.lower(), target)
        computed = known.get(name, tuple(METRICS))
        wrong = sorted(set(metrics) - set(computed))
        if wrong:
            raise UserError(f"{path}: published.{target} names metric(s) {wrong} that {name} does not compute; "
                            f"its metrics: {list(computed)}")
        out[name] = metrics
    return out


# What a grid file sets (its name is its file's), and the range of every number it gives, by the rules of
# the presets and options (jobs.config_reader), checked when the grid is read, before Ray starts.
SETTABLE = ("max_length", "max_train", "max_dev", "spaces", "tasks", "published")
LISTS = ("epochs", "lr", "batch_size", "warmup")  # the lists every space gives
MAX_LENGTH = Range(8)  # tokens per example: room for the special tokens and some text (--max-length too)
PERCENT = Range(0, 100)  # a published result: percentages, as the papers' tables give them
RANGES = {"max_length": MAX_LENGTH, "max_train": NON_NEGATIVE, "max_dev": NON_NEGATIVE, "published": PERCENT,
          **{f"spaces.{key}": bounds for key, bounds in {
              "epochs": AT_LEAST_ONE, "lr": POSITIVE, "lr_by_preset": POSITIVE, "batch_size": AT_LEAST_ONE,
              "warmup": PROBABILITY,  # a fraction of the steps: 1 would leave none to train
              "max_length": MAX_LENGTH, "doc_stride": AT_LEAST_ONE, "max_question_length": AT_LEAST_ONE}.items()}}


def data_key(point: dict[str, Any]) -> str:
    """Which encoded data a grid point trains on: its task, on a fraction of the labels when it has one."""
    return fraction_target(point["task"], point.get("label_fraction", 1.0))


def trial_name(config: dict[str, Any]) -> str:
    p = config["point"]
    labels = f"-labels{p['label_fraction']:g}" if p.get("label_fraction", 1.0) < 1 else ""
    return (f"{p['task']}{labels}-lr{p['lr']:g}-bs{p['batch_size']}-ep{p['epochs']}-wu{p['warmup']:g}"
            f"-seed{config['seed']}")
