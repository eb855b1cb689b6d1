"""jobs.pretraining.encoders: the encoder a sweep fine-tunes, from an export, a checkpoint or the newest run."""

from __future__ import annotations

import time

import pytest
import torch
from mlflow.tracking import MlflowClient

from jobs.pretraining.encoders import encoder_from_checkpoint, resolve_encoder
from model import Encoder
from model.classifier import SequenceClassifier, load_encoder
from helpers import empty_store, tiny_encoder_config


def test_load_encoder_reads_the_export_with_our_encoder(exported, tokenizer_dir):
    from safetensors.torch import load_file

    encoder = load_encoder(exported).eval()
    original = Encoder(tiny_encoder_config(tokenizer_dir))
    original.load_state_dict({k.removeprefix("encoder."): v for k, v in load_file(str(exported / "model.safetensors")).items()})
    ids = torch.randint(5, 100, (2, 12))
    torch.testing.assert_close(encoder(ids), original.eval()(ids))
    classifier = SequenceClassifier(encoder, 3)
    assert classifier(ids).shape == (2, 3)
    assert [type(m).__name__ for m in classifier.head.children()] == ["Dropout", "Linear", "Linear"]  # dropout reused


def test_a_checkpoint_dir_gives_its_main_encoder(tmp_path, tokenizer_dir):
    from jobs.pretraining import checkpoint
    from jobs.pretraining.checkpoint import TrainState
    from jobs.pretraining.config import resolve, to_yaml, with_vocab_size
    from jobs.pretraining.loop import build_training

    cfg = resolve("tiny", "cocolm", ["model.hidden_size=32", "model.ffn_size=64", "model.max_positions=64"])
    cfg = with_vocab_size(cfg, tiny_encoder_config(tokenizer_dir).vocab_size)
    model, optimizer, scheduler = build_training(cfg)
    checkpoint.save(tmp_path / "ckpt", model, optimizer, scheduler, TrainState(step=3), to_yaml(cfg), tokenizer_dir)
    source = resolve_encoder(str(tmp_path / "ckpt"), None, tmp_path)
    assert source.preset == "tiny" and source.tokenizer_dir == tmp_path / "ckpt" / "tokenizer"
    for key, value in model.main.state_dict().items():
        torch.testing.assert_close(source.state[key], value)
    assert encoder_from_checkpoint(tmp_path / "ckpt").cfg == model.main.cfg


def test_from_last_picks_the_newest_finished_pretraining_run_of_any_experiment(tmp_path, capsys):
    """After an ablation study the newest pretraining run is in `ablation-<preset>`, not `pretraining`;
    sweeps and unfinished runs are never taken."""
    from jobs.pretraining.encoders import latest_pretraining_run

    client = MlflowClient(empty_store(tmp_path))
    with pytest.raises(ValueError, match="no finished pretraining run"):
        latest_pretraining_run(client)
    runs = []
    for experiment, kind in (("pretraining", "pretraining"), ("ablation-tiny", "pretraining"),
                             ("ablation-tiny", "finetuning-sweep"), ("ablation-tiny", "pretraining")):
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(
            experiment, artifact_location=(tmp_path / experiment).as_uri())
        runs.append(client.create_run(experiment_id, tags={"kind": kind, "variant": "cocolm", "preset": "tiny"}).info.run_id)
    older, newer, sweep, running = runs
    for run_id in (older, newer, sweep):
        time.sleep(0.01)
        client.set_terminated(run_id, "FINISHED")
    assert latest_pretraining_run(client) == newer
    assert f"pretraining run {newer} (tiny / cocolm, experiment 'ablation-tiny')" in capsys.readouterr().out


def test_a_hub_id_is_read_from_the_hugging_face_cache_and_offline_is_one_line(tmp_path, monkeypatch):
    """`--from microsoft/cocolm-base`: the authors' checkpoint from the Hugging Face cache (here a cache laid
    out as the hub client writes it, holding the golden fixture: no network in tests), converted like a
    folder; not cached while offline (the platform's default) is one line saying how to download it."""
    import shutil
    from pathlib import Path

    from huggingface_hub import constants

    from jobs.cli import UserError

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=r"--from microsoft/cocolm-base: no such directory, and not in the Hugging "
                                        r"Face cache \(HF_HUB_OFFLINE=1, the platform's default: set HF_HUB_OFFLINE=0"):
        resolve_encoder("microsoft/cocolm-base", None, tmp_path / "work")
    revision = "0" * 40
    repo = tmp_path / "hub" / "models--microsoft--cocolm-base"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    fixture = Path(__file__).resolve().parent / "fixtures" / "official-cocolm"
    for name in ("config.json", "pytorch_model.bin", "sp.model", "dict.txt"):
        shutil.copy(fixture / name, snapshot / name)
    encoder = resolve_encoder("microsoft/cocolm-base", None, tmp_path / "work")
    assert encoder.cfg.vocab_size == 417 and (encoder.tokenizer_dir / "dict.txt").is_file()
