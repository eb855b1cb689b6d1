"""The learning-curve probe: blocks packed by the job's Ray Data stream (jobs.data.pack), then Ray-free
training with the job's step, held-out accuracies, the CSV and the figure, and the verdict on each
head's prior."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jobs.cli import UserError
from jobs.data.corpus import shipped_corpus
from jobs.data.pack import PackOptions, run as pack
from jobs.data.blocks_folder import BLOCKS_FILE, META_FILE, TOKENIZER_FILE, load_blocks, save_blocks
from jobs.studies.curves import CurvesOptions, LEFT_PRIOR, left_prior, run, split_heldout
from model.corruption import SpecialTokens

pytestmark = pytest.mark.timeout(600)  # the first test also pays for the session tokenizer and two packings
SEQ_LEN = 128
TRAIN = ("train.max_steps=4", "train.log_every=2", "data.batch_size=8", "train.global_batch=16", "train.warmup_steps=1")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """300 real documents (the shipped Wikipedia leads) in a corpus folder."""
    folder = tmp_path_factory.mktemp("curves-corpus")
    with gzip.open(shipped_corpus()[-1], "rt", encoding="utf-8") as lines:
        rows = [line for _, line in zip(range(300), lines)]
    (folder / "leads.jsonl").write_text("".join(rows))
    return folder


def _options(blocks: Path, **kwargs) -> CurvesOptions:
    return CurvesOptions(preset="tiny", blocks=str(blocks), overrides=(f"data.seq_len={SEQ_LEN}",) + TRAIN, device="cpu",
                         **kwargs)


def _pack(corpus: Path, tokenizer_dir: Path, out: Path) -> dict:
    return pack(PackOptions(seq_len=SEQ_LEN, out=str(out), corpus=(str(corpus),), tokenizer=str(tokenizer_dir)))


@pytest.fixture(scope="module")
def packed(corpus, tokenizer_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("blocks")
    _pack(corpus, tokenizer_dir, folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([BLOCKS_FILE, META_FILE, TOKENIZER_FILE])
    return folder


def test_packing_is_the_streams_and_does_not_depend_on_rays_order(packed, corpus, tokenizer_dir, tmp_path):
    blocks = np.load(packed / BLOCKS_FILE)
    meta = json.loads((packed / META_FILE).read_text())
    special = SpecialTokens()
    assert blocks.shape == (meta["blocks"], SEQ_LEN) and (blocks[:, 0] == special.cls).all()
    assert meta["tokens"] == int((blocks != special.pad).sum()) and meta["vocab_size"] == 1000
    assert (packed / TOKENIZER_FILE).read_bytes() == (tokenizer_dir / TOKENIZER_FILE).read_bytes()
    _pack(corpus, tokenizer_dir, tmp_path / "again")
    assert np.array_equal(np.load(tmp_path / "again" / BLOCKS_FILE), blocks)


def test_missing_blocks_or_blocks_of_another_length_say_what_to_run(packed, tmp_path):
    with pytest.raises(UserError, match=f"no packed blocks in {tmp_path}: .*python -m jobs.data.pack"):
        load_blocks(tmp_path, SEQ_LEN)
    with pytest.raises(ValueError, match=f"{packed} holds blocks of {SEQ_LEN} tokens .* data.seq_len=64"):
        load_blocks(packed, 64)


def test_repacking_replaces_the_folder_whole_or_leaves_it_as_it_was(tmp_path):
    """A packing that fails midway (here: a description that cannot be written, after the blocks were)
    leaves the old folder as it was: no new blocks.npy beside the old blocks.json."""
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / TOKENIZER_FILE).write_text("{}")
    folder = tmp_path / "blocks"
    old = np.ones((3, 8), dtype=np.int32)
    save_blocks(old, tokenizer, 100, "shipped", folder)
    with pytest.raises(TypeError):
        save_blocks(np.zeros((5, 8), dtype=np.int32), tokenizer, 100, {"not": object()}, folder)
    blocks, meta = load_blocks(folder, 8)
    assert blocks.tolist() == old.tolist() and meta["blocks"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocks", "tokenizer"]  # no staging left behind
    save_blocks(np.zeros((5, 8), dtype=np.int32), tokenizer, 100, "shipped", folder)
    assert load_blocks(folder, 8)[1]["blocks"] == 5 and sorted(p.name for p in tmp_path.iterdir()) == ["blocks", "tokenizer"]
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=f"--out {tmp_path} holds other files \\(blocks, notes.txt, tokenizer\\)"):
        save_blocks(old, tokenizer, 100, "shipped", tmp_path)  # `--out .`: never moved away whole


def test_heldout_blocks_are_a_seeded_disjoint_draw():
    blocks = np.arange(400 * 4, dtype=np.int32).reshape(400, 4)
    training, heldout = split_heldout(blocks, seed=3)
    assert len(heldout) == 20 and len(training) == 380  # 5%
    rows = {tuple(r) for r in training.tolist()} | {tuple(r) for r in heldout.tolist()}
    assert len(rows) == 400
    assert split_heldout(blocks, seed=3)[1].equal(heldout) and not split_heldout(blocks, seed=4)[1].equal(heldout)


def test_training_writes_curves_with_heldout_accuracies_and_a_figure(packed, tmp_path, capsys):
    out = tmp_path / "cocolm.csv"
    rows = run(_options(packed, out=str(out)))
    printed = capsys.readouterr().out
    with out.open() as handle:
        written = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in written] == [r["step"] for r in rows] == [0, 2, 4]  # step 0: the priors
    assert written[0]["loss"] == "" and np.isfinite(float(written[0]["heldout_aux_mlm_accuracy"]))
    training_blocks = json.loads((packed / META_FILE).read_text())["blocks"] - len(split_heldout(np.load(packed / BLOCKS_FILE), 0)[1])
    assert float(written[-1]["epoch"]) == pytest.approx(4 * 16 / training_blocks, rel=1e-6)
    for key in ("loss", "aux_mlm_accuracy", "copy_accuracy_replaced", "heldout_aux_mlm_accuracy",
                "heldout_copy_accuracy_replaced", "heldout_lm_accuracy_replaced", "heldout_scl_positive_cosine"):
        assert np.isfinite(float(written[-1][key])), key
    assert "step 4/4 | epoch" in printed and "held-out aux_mlm" in printed and "tok/s" in printed
    assert "copy_accuracy_replaced: held-out" in printed and "above 0.5" in printed
    assert out.with_suffix(".png").stat().st_size > 10_000
    figure = tmp_path / "both.png"
    run(CurvesOptions(plot=(str(out), str(out)), out=str(figure)))
    assert figure.stat().st_size > 10_000


def test_a_slow_run_shows_progress_between_intervals_and_a_stopped_one_keeps_its_csv(packed, tmp_path, capsys,
                                                                                      monkeypatch):
    """The study preset on a CPU logs every 100 steps of 20 s: the probe must not look frozen, and a run
    stopped before its first interval must not leave an empty CSV."""
    import jobs.studies.curves as curves

    monkeypatch.setattr(curves, "HEARTBEAT_SECONDS", 0)
    out = tmp_path / "slow.csv"
    run(dataclasses.replace(_options(packed, out=str(out)), overrides=(*_options(packed).overrides, "train.log_every=4")))
    printed = capsys.readouterr().out
    assert "step 0/4 | held-out before training: aux_mlm" in printed
    assert "step 1/4 | loss" in printed and "(running)" in printed and "held-out next at step 4" in printed

    calls = []

    def stopped(self, batches):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt  # a user's Ctrl-C, or a kill, during step 2
        return original(self, batches)

    original = curves.TrainingStep.__call__
    monkeypatch.setattr(curves.TrainingStep, "__call__", stopped)
    with pytest.raises(KeyboardInterrupt):
        run(_options(packed, out=str(out)))
    with out.open() as handle:
        assert [row["step"] for row in csv.DictReader(handle)] == ["0"]


def test_the_variant_decides_the_heads_judged(packed, tmp_path):
    rows = run(dataclasses.replace(_options(packed, out=str(tmp_path / "r.csv")), variant="roberta_mlm"))
    assert set(left_prior(rows)) == {"mlm_accuracy"}


def _long_folder(packed: Path, folder: Path, tokenizer_from: Path | None = None) -> Path:
    """Blocks of 2 x SEQ_LEN from the packed ones (two rows side by side), with the packing's tokenizer and
    corpus: what the long phase reads, without a second Ray packing."""
    blocks, meta = load_blocks(packed, SEQ_LEN)
    pairs = blocks[: len(blocks) // 2 * 2].reshape(-1, 2 * SEQ_LEN)
    save_blocks(pairs, tokenizer_from or packed, meta["vocab_size"], meta["corpus"], folder)
    return folder


def test_a_long_phase_trains_its_last_steps_on_the_long_blocks_and_logs_where_it_starts(packed, tmp_path, monkeypatch,
                                                                                         capsys):
    """As the job: the last train.long_steps steps on blocks of data.long_seq_len, a log line at the switch
    (no interval spans two lengths), the tokens counted at each step's length."""
    import jobs.studies.curves as curves

    widths = []
    original = curves.corrupted
    monkeypatch.setattr(curves, "corrupted", lambda ids, *args: widths.append(ids.shape[1]) or original(ids, *args))
    long_folder = _long_folder(packed, tmp_path / "long")
    overrides = (*_options(packed).overrides, "train.max_steps=5", f"data.long_seq_len={2 * SEQ_LEN}", "train.long_steps=2")
    rows = run(dataclasses.replace(_options(packed, out=str(tmp_path / "long.csv")), overrides=overrides,
                                   long_blocks=str(long_folder)))
    assert [(r["step"], r.get("seq_len")) for r in rows] == [(0, None), (2, SEQ_LEN), (3, SEQ_LEN), (4, 2 * SEQ_LEN),
                                                             (5, 2 * SEQ_LEN)]
    assert widths.count(2 * SEQ_LEN) == 2 * 2  # 2 steps of 2 micro-batches (global batch 16 of 8)
    training_blocks = len(np.load(packed / BLOCKS_FILE)) - len(split_heldout(np.load(packed / BLOCKS_FILE), 0)[1])
    assert rows[-1]["epoch"] == pytest.approx(16 * (3 * SEQ_LEN + 2 * 2 * SEQ_LEN) / (training_blocks * SEQ_LEN))
    assert f"the last 2 of 16 x {2 * SEQ_LEN}" in capsys.readouterr().out


def test_a_long_phase_without_its_blocks_or_with_other_blocks_is_an_error_that_says_what_to_run(packed, tmp_path):
    long_phase = (*_options(packed).overrides, "train.max_steps=5", f"data.long_seq_len={2 * SEQ_LEN}", "train.long_steps=2")
    with pytest.raises(UserError, match=f"pack them once with `python -m jobs.data.pack --seq-len {2 * SEQ_LEN}"):
        run(dataclasses.replace(_options(packed), overrides=long_phase))
    with pytest.raises(UserError, match="this recipe has no long phase"):
        run(_options(packed, long_blocks=str(_long_folder(packed, tmp_path / "long"))))
    other = tmp_path / "other-tokenizer"
    other.mkdir()
    (other / TOKENIZER_FILE).write_text((packed / TOKENIZER_FILE).read_text().replace("[MASK]", "[MASK2]", 1))
    with pytest.raises(UserError, match="different corpora or tokenizers"):
        run(dataclasses.replace(_options(packed), overrides=long_phase,
                                long_blocks=str(_long_folder(packed, tmp_path / "long-other", other))))


def test_left_prior_is_the_first_logged_step_above_the_threshold():
    rows = [{"step": s, "heldout_aux_mlm_accuracy": a, "heldout_copy_accuracy_replaced": c}
            for s, a, c in ((100, 0.05, 0.0), (200, 0.09, 0.3), (300, 0.12, 0.4), (400, 0.2, 0.45))]
    assert left_prior(rows) == {"aux_mlm_accuracy": 300, "copy_accuracy_replaced": None}
    assert LEFT_PRIOR["aux_mlm_accuracy"] == 0.10


def test_training_needs_neither_ray_nor_mlflow_nor_pandas():
    """What lets a GPU machine with only torch and transformers run the probe."""
    code = ("import sys, jobs.studies.curves; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'mlflow', 'pandas')); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_missing_csv_to_plot_is_named(tmp_path):
    with pytest.raises(UserError, match="no such CSV: .*nothing.csv"):
        run(CurvesOptions(plot=(str(tmp_path / "nothing.csv"),)))
