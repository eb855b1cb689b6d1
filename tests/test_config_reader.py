"""jobs.config_reader: the one path from YAML to a frozen config, for presets, overrides, checkpoints and grids."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from jobs.cli import AT_LEAST_ONE, POSITIVE, UserError
from jobs.config_reader import typed
from jobs.finetuning.grid import load_grid
from jobs.pretraining.config import resolve


@dataclass(frozen=True)
class Inner:
    eps: float = 1e-6


@dataclass(frozen=True)
class Outer:
    steps: int = 1
    rate: float = 0.1
    on: bool = False
    sizes: tuple[int, ...] = ()
    by_name: dict[str, tuple[float, ...]] = field(default_factory=dict)
    maybe: int | None = None
    inner: Inner = field(default_factory=Inner)


RANGES = {"steps": AT_LEAST_ONE, "rate": POSITIVE, "sizes": AT_LEAST_ONE, "by_name": POSITIVE, "inner.eps": POSITIVE}


def test_values_take_their_fields_types_and_nested_configs_take_dotted_keys():
    values = typed(Outer, {"steps": "1e3", "rate": "3e-4", "on": True, "sizes": [1, 2.0], "by_name": {"a": ["1e-5"]},
                           "maybe": None, "inner.eps": "1e-8"}, "o", RANGES)
    built = Outer(**values)
    assert built == Outer(steps=1000, rate=3e-4, on=True, sizes=(1, 2), by_name={"a": (1e-5,)}, inner=Inner(1e-8))
    assert type(built.steps) is int and type(built.sizes[1]) is int and type(built.rate) is float
    assert typed(Outer, {"maybe": "7"}, "o")["maybe"] == 7


@pytest.mark.parametrize("values, message", [
    ({"step": 1}, r"f.yaml: unknown config key\(s\) \['o.step'\]; known o keys: \['by_name', "),
    ({"steps": 2.5}, "f.yaml: o.steps=2.5 is not a whole number"),
    ({"steps": 0}, "f.yaml: o.steps=0 is out of range: it must be 1 <= o.steps"),
    ({"rate": ".inf"}, "f.yaml: o.rate='.inf' is not a finite number"),
    ({"rate": None}, "f.yaml: o.rate=None is not a finite number"),
    ({"on": "yes please"}, "f.yaml: o.on must be true or false"),
    ({"sizes": 3}, r"f.yaml: o.sizes must be a list, e.g. \[a, b\], not 3"),
    ({"sizes": [1, 0]}, "f.yaml: o.sizes=0 is out of range"),
    ({"by_name": {"a": [-1]}}, "f.yaml: o.by_name.a=-1.0 is out of range"),
    ({"inner": {"eps": 0}}, "f.yaml: o.inner.eps=0.0 is out of range"),
    ({"inner": 5}, r"f.yaml: o.inner takes keys \['eps'\], not 5"),
])
def test_every_rule_is_one_line_naming_the_file_the_key_and_the_value(values, message):
    with pytest.raises(UserError, match=message):
        typed(Outer, values, "o", RANGES, "f.yaml")


def test_a_preset_override_and_a_grid_break_the_same_rule_with_the_same_words(tmp_path):
    """One reader: a fractional count or a learning rate out of range reads alike in both kinds of file."""
    with pytest.raises(UserError, match=r"^train.max_steps=2.5 is not a whole number$"):
        resolve("tiny", "cocolm", ["train.max_steps=2.5"])  # was cut to 2 without a word
    with pytest.raises(UserError, match=r"^train.peak_lr=-0.001 is out of range: it must be 0 < train.peak_lr$"):
        resolve("tiny", "cocolm", ["train.peak_lr=-1e-3"])
    path = tmp_path / "g.yaml"
    path.write_text("spaces: {s: {epochs: [2.5], lr: [-1e-3], batch_size: [8], warmup: [0]}}\ntasks: {default: s}\n")
    with pytest.raises(UserError, match=rf"^{path}: spaces.s.epochs=2.5 is not a whole number$"):
        load_grid(str(path))
    path.write_text("spaces: {s: {epochs: [2], lr: [-1e-3], batch_size: [8], warmup: [0]}}\ntasks: {default: s}\n")
    with pytest.raises(UserError, match=rf"^{path}: spaces.s.lr=-0.001 is out of range: it must be 0 < spaces.s.lr$"):
        load_grid(str(path))
    path.write_text("name: other\nspaces: {s: {epochs: [2], lr: [1e-3], batch_size: [8], warmup: [0]}}\n"
                    "tasks: {default: s}\n")
    with pytest.raises(UserError, match=r"unknown config key\(s\) \['name'\]"):  # a grid's name is its file's
        load_grid(str(path))
