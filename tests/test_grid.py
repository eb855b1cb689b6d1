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


# The authors' settings, copied from microsoft/COCO-LM huggingface/README.md ("Optimal Hyperparameters"):
# task -> (learning rates, batch size, epochs, warm-up); MNLI holds base++'s MNLI-m and MNLI-mm rates.
AUTHORS = {
    "cocolm-base++": {"mnli": ((1e-5, 2e-5), 32, 2, 0.0625), "qqp": ((2e-5,), 32, 5, 0.0625),
                      "qnli": ((1e-5,), 32, 5, 0.0625), "sst-2": ((1e-5,), 32, 5, 0.0625), "cola": ((2e-5,), 16, 10, 0.1),
                      "rte": ((3e-5,), 16, 10, 0.1), "mrpc": ((2e-5,), 16, 10, 0.1), "sts-b": ((4e-5,), 16, 10, 0.1),
                      "squad_v2": ((3e-5,), 32, 3, 0.0625)},
    "cocolm-large++": {"mnli": ((5e-6,), 32, 2, 0.0625), "qqp": ((2e-5,), 32, 5, 0.0625),
                       "qnli": ((5e-6,), 32, 2, 0.0625), "sst-2": ((1e-5,), 32, 5, 0.0625),
                       "cola": ((2e-5,), 32, 10, 0.0625), "rte": ((3e-5,), 32, 10, 0.1), "mrpc": ((2e-5,), 16, 10, 0.1),
                       "sts-b": ((2e-5,), 16, 10, 0.1), "squad_v2": ((1e-5,), 16, 2, 0.0625)},
}
PUBLISHED = {  # their dev results, percent
    "cocolm-base++": {"MNLI-m": 90.1, "MNLI-mm": 90.0, "QQP": 92.3, "QNLI": 94.2, "SST-2": 95.1, "CoLA": 69.9,
                      "RTE": 87.4, "MRPC": 90.9, "STS-B": 91.8, "SQuAD 2.0": 87.7, "SQuAD 2.0 EM": 84.9},
    "cocolm-large++": {"MNLI-m": 91.3, "MNLI-mm": 91.6, "QQP": 92.8, "QNLI": 95.8, "SST-2": 96.8, "CoLA": 73.1,
                       "RTE": 91.3, "MRPC": 91.9, "STS-B": 92.8, "SQuAD 2.0": 91.0, "SQuAD 2.0 EM": 88.3},
}


@pytest.mark.parametrize("name", sorted(AUTHORS))
def test_the_authors_grids_give_each_task_exactly_their_point_and_their_results(name):
    grid = load_grid(name)
    for task, (lrs, batch_size, epochs, warmup) in AUTHORS[name].items():
        assert grid.points(task) == [{"task": task, "lr": lr, "batch_size": batch_size, "epochs": epochs,
                                      "warmup": warmup} for lr in lrs], task
        assert grid.max_length_of(task) == (384 if task == "squad_v2" else 512)
    with pytest.raises(UserError, match="no space for task 'snli'"):  # no setting of theirs: refused, not guessed
        grid.points("snli")
    metric = {"CoLA": "matthews_corr", "STS-B": "spearman", "SQuAD 2.0": "f1", "SQuAD 2.0 EM": "exact"}
    expected: dict[str, dict[str, float]] = {}
    for target, value in PUBLISHED[name].items():
        expected.setdefault(target.removesuffix(" EM"), {})[metric.get(target, "accuracy")] = value
    assert grid.published == expected


def test_the_authors_fixed_settings_are_the_platforms_fine_tuning_defaults():
    """What the grids' header says: weight decay 0.01, betas (0.9, 0.98), eps 1e-6, dropout 0.1 need no setting."""
    from jobs.finetuning.trial import TrialConfig
    from model.step import AdamW

    trial = TrialConfig(task="rte", lr=3e-5, batch_size=16, epochs=10, warmup=0.1, seed=0)
    assert trial.adamw == AdamW(weight_decay=0.01, beta1=0.9, beta2=0.98, eps=1e-6) and trial.dropout == 0.1


def test_published_targets_are_spelled_as_the_task_table_spells_them(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("spaces: {s: {epochs: [1], lr: [1e-3], batch_size: [8], warmup: [0]}}\ntasks: {default: s}\n"
                    "published: {mnli-m: {accuracy: 90.1}, my_task: {f1: 50}}\n")
    assert load_grid(str(path)).published == {"MNLI-m": {"accuracy": 90.1}, "my_task": {"f1": 50.0}}


@pytest.mark.parametrize("published, message", [
    ("published: {RTE: {accuracy: 120}}",
     "published.RTE.accuracy=120.0 is out of range: it must be 0 <= published.RTE.accuracy <= 100"),
    ("published: {RTE: {accuracy: -0.5}}", "published.RTE.accuracy=-0.5 is out of range"),
    ("published: {RTE: 87.4}", "published.RTE must be a mapping of keys to values, not 87.4"),
    ("published: {RTE: {acuracy: 87.4}}", "published.RTE names metric(s) ['acuracy'] that RTE does not compute"),
    ("published: {SQuAD 2.0: {em: 84.9}}", "published.SQuAD 2.0 names metric(s) ['em'] that SQuAD 2.0 does not"),
    ("publshed: {RTE: {accuracy: 87.4}}", "unknown config key(s) ['publshed']"),
])
def test_a_bad_published_result_is_one_user_error_naming_file_and_key(tmp_path, published, message):
    path = tmp_path / "g.yaml"
    path.write_text("spaces: {s: {epochs: [1], lr: [1e-3], batch_size: [8], warmup: [0]}}\ntasks: {default: s}\n"
                    f"{published}\n")
    with pytest.raises(UserError) as refused:
        load_grid(str(path))
    assert str(refused.value).startswith(f"{path}: {message}") and "\n" not in str(refused.value)
