"""jobs.finetuning.grid: the paper grid, grid errors, learning rates per pretraining preset."""

from __future__ import annotations


import pytest

from jobs.cli import UserError
from jobs.finetuning.grid import load_grid
from jobs.finetuning.sweep import parse_seeds


def test_the_paper_grid_is_table_7():
    grid = load_grid("paper")
    assert grid.max_length == 512
    assert len(grid.points("cola")) == 4 * 4 * 2 * 2 and len(grid.points("mnli")) == 3 * 4
    assert {p["lr"] for p in grid.points("rte", "large++")} == {7e-6, 1e-5, 2e-5, 3e-5}
    assert {p["lr"] for p in grid.points("qqp", "large++")} == {5e-6, 7e-6, 1e-5, 2e-5}
    assert {p["lr"] for p in grid.points("sst-2", "base")} == {1e-5, 2e-5, 3e-5, 4e-5}
    assert {p["warmup"] for p in grid.points("sts-b")} == {0.06, 0.1} and {p["batch_size"] for p in grid.points("qnli")} == {32}
    assert load_grid("paper").space("my-own-task") == grid.spaces["small"]
    quick = load_grid("quick")
    assert quick.max_length <= 128 and 0 < quick.max_train <= 10_000 and len(quick.points("snli")) * 5 <= 20


def test_the_study_grid_brackets_electra_smalls_fine_tuning_rate_on_all_of_snli():
    grid = load_grid("study")
    points = grid.points("snli")
    assert {p["lr"] for p in points} == {1e-4, 2e-4, 3e-4}  # ELECTRA-Small: 3e-4, batch 32, 3 epochs
    assert {(p["batch_size"], p["epochs"], p["warmup"]) for p in points} == {(32, 3, 0.1)}
    assert grid.max_train == 0 and grid.max_dev == 0 and grid.max_length == 128


def test_grid_errors_name_the_key(tmp_path):
    (tmp_path / "g.yaml").write_text("spaces: {s: {epochs: [1], lr: [1e-3], batch_size: [8], warmup: [0.1], lrs: [1]}}\n")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['spaces.s.lrs'\]"):
        load_grid(str(tmp_path / "g.yaml"))
    with pytest.raises(ValueError, match="unknown grid 'nope'"):
        load_grid("nope")
    assert parse_seeds("5") == (0, 1, 2, 3, 4) and parse_seeds("1,7") == (1, 7)


def test_learning_rate_list_follows_the_pretraining_preset():
    grid = load_grid("paper")
    assert grid.lr_set(None, "large++") == "large++" and grid.lr_set(None, "tiny") == "base"
    assert grid.lr_set("base", "large++") == "base"
    with pytest.raises(ValueError, match="--lr-set 'huge'"):
        grid.lr_set("huge", "")


@pytest.mark.parametrize("space, message", [
    ("lr: [1e-4, -0.0005]", "spaces.s.lr=-0.0005 is out of range: it must be 0 < spaces.s.lr"),
    ("lr: [.nan]", "spaces.s.lr=nan is not a finite number"),
    ("batch_size: [0]", "spaces.s.batch_size=0 is out of range: it must be 1 <= spaces.s.batch_size"),
    ("epochs: [2.5]", "spaces.s.epochs=2.5 is not a whole number"),
    ("epochs: []", "spaces.s.epochs must be a list of one or more values, not []"),
    ("warmup: [1.0]", "spaces.s.warmup=1.0 is out of range: it must be 0 <= spaces.s.warmup < 1"),
    ("warmup: [-0.1]", "spaces.s.warmup=-0.1 is out of range"),
    ("lr_by_preset: {large++: [0]}", "spaces.s.lr_by_preset.large++=0.0 is out of range"),
    ("max_length: 4", "spaces.s.max_length=4 is out of range: it must be 8 <= spaces.s.max_length"),
    ("doc_stride: 0", "spaces.s.doc_stride=0 is out of range"),
])
def test_every_grid_value_out_of_its_range_is_one_line_naming_file_key_and_value(tmp_path, space, message):
    values = {"epochs": "[1]", "lr": "[1e-3]", "batch_size": "[8]", "warmup": "[0.1]"}
    key = space.split(":")[0]
    values[key] = space.split(": ", 1)[1]
    path = tmp_path / "g.yaml"
    path.write_text("spaces: {s: {" + ", ".join(f"{k}: {v}" for k, v in values.items()) + "}}\ntasks: {default: s}\n")
    with pytest.raises(UserError) as refused:
        load_grid(str(path))
    assert str(refused.value).startswith(f"{path}: {message}")


@pytest.mark.parametrize("top, message", [("max_length: 2", "max_length=2 is out of range"),
                                          ("max_train: -1", "max_train=-1 is out of range")])
def test_a_grid_wide_value_out_of_range_is_named(tmp_path, top, message):
    path = tmp_path / "g.yaml"
    path.write_text(f"{top}\nspaces: {{s: {{epochs: [1], lr: [1e-3], batch_size: [8], warmup: [0]}}}}\n"
                    "tasks: {default: s}\n")
    with pytest.raises(UserError) as refused:
        load_grid(str(path))
    assert str(refused.value).startswith(f"{path}: {message}")
