"""--init-from: continued pretraining from the authors' released checkpoint, an exported encoder, a
pretraining checkpoint or a run; the model takes the source's shape and tokenizer, a resume its own checkpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from jobs.cli import UserError
from jobs.data.tokens import load_tokenizer
from jobs.pretraining import checkpoint, job
from jobs.pretraining.checkpoint import TrainState
from jobs.pretraining.config import resolve, to_yaml
from jobs.pretraining.job import init_config, resolve_init
from jobs.pretraining.loop import InitWeights, build_training, initialise, start_from
from model import Encoder, build_pretraining_model, model_size
from model.classifier import load_encoder
from model.convert import from_official
from model.export import export_encoder

FIXTURE = Path(__file__).parent / "fixtures" / "official-cocolm"


def recipe_free(cfg):
    """An encoder config without the recipe's dropout, which a run sets for itself."""
    return dataclasses.replace(cfg, dropout=0.0, attention_dropout=0.0)


def test_the_main_encoder_starts_from_every_tensor_and_the_shape_of_the_converted_authors_checkpoint(home, tmp_path):
    converted = load_encoder(from_official(FIXTURE, tmp_path / "converted"))
    init = resolve_init(str(FIXTURE), None)
    cfg = init_config("tiny", "cocolm", ["data.seq_len=64"], init)  # the fixture's 64 positions
    model = build_pretraining_model(cfg.model, cfg.objective)
    initialise(model, init.weights())
    assert recipe_free(model.main.cfg) == recipe_free(converted.cfg)  # 32 wide, 64 positions, the authors' buckets
    expected, got = converted.state_dict(), model.main.state_dict()
    assert got.keys() == expected.keys()
    assert [k for k in expected if not torch.equal(got[k], expected[k])] == []
    # The auxiliary: the tiny preset's rule (one layer) at the main's width, on the shared embeddings.
    assert (model.aux.encoder.cfg.num_layers, model.aux.encoder.cfg.hidden_size) == (1, 32)
    assert model.aux.encoder.embeddings is model.main.embeddings
    assert cfg.init_from == str(FIXTURE) and cfg.flat()["init_from"] == str(FIXTURE)


def refused(argv: list[str], monkeypatch) -> str:
    """The one line `python -m jobs.pretraining argv` refuses with, before Ray starts."""
    monkeypatch.setattr(job, "init_ray", lambda **_: pytest.fail("Ray started"))
    with pytest.raises(UserError) as error:
        job.main(argv)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_model_setting_that_conflicts_with_the_checkpoints_shape_is_one_line_naming_both_values(home, monkeypatch):
    line = refused(["--init-from", str(FIXTURE), "--set", "model.hidden_size=48"], monkeypatch)
    assert "model.hidden_size=48" in line and "hidden_size=32" in line


def test_the_authors_checkpoint_passes_every_check_and_reaches_ray_with_their_ids(home, monkeypatch, tmp_path):
    """Continued pretraining takes the authors' tokenizer: the run's config carries their [PAD] (1) and their
    vocabulary, and nothing refuses it before Ray starts."""
    class RayStarts(Exception):
        pass

    monkeypatch.setattr(job, "init_ray", lambda **_: (_ for _ in ()).throw(RayStarts()))
    init = resolve_init(str(FIXTURE), None)
    cfg = init_config("tiny", "cocolm", ["data.seq_len=64"], init)
    assert (cfg.model.pad_token_id, cfg.model.token_padding_idx, cfg.data.vocab_size) == (1, 0, 417)
    with pytest.raises(RayStarts):
        job.run(cfg, storage=str(tmp_path / "storage"), init=init)


def test_the_options_take_the_source_main_resolved_and_resolve_none_themselves(home):
    with pytest.raises(ValueError, match="resolved once, by main"):
        job.PretrainOptions(init_from=str(FIXTURE)).config()


def test_a_pad_id_other_than_the_tokenizers_is_one_line(home, tokenizer_dir, monkeypatch):
    converted = resolve_init(str(FIXTURE), None).encoder.tokenizer_dir
    line = refused(["--tokenizer", str(converted), "--set", "data.seq_len=64"], monkeypatch)
    assert "model.pad_token_id=0" in line and "[PAD] 1" in line


def test_blocks_longer_than_the_checkpoints_positions_are_one_line(home, monkeypatch):
    line = refused(["--init-from", str(FIXTURE)], monkeypatch)  # tiny's blocks of 128, the fixture's 64 positions
    assert "data.seq_len=128" in line and "model.max_positions=64" in line


def test_a_pretraining_checkpoint_gives_its_auxiliary_too(home, tokenizer_dir, tmp_path, monkeypatch):
    pieces = load_tokenizer(tokenizer_dir).get_vocab_size()
    source_cfg = resolve("tiny", "cocolm", [f"data.vocab_size={pieces}", "model.aux_layers=2"])
    trained, optimizer, scheduler = build_training(source_cfg)
    checkpoint.save(tmp_path / "ckpt", trained, optimizer, scheduler, TrainState(step=3), to_yaml(source_cfg),
                    tokenizer_dir)
    loads = []
    monkeypatch.setattr(checkpoint, "load_pretrained",
                        lambda *a, load=checkpoint.load_pretrained: loads.append(a) or load(*a))
    init = resolve_init(str(tmp_path / "ckpt"), None)
    assert len(loads) == 1  # model.pt read once, for the encoder and the auxiliary
    model = build_pretraining_model(init_config("tiny", "cocolm", [], init).model, source_cfg.objective)
    initialise(model, init.weights())
    assert model.aux.encoder.cfg.num_layers == 2  # the source's rule, not tiny's one layer
    for part in ("main", "aux"):
        expected, got = getattr(trained, part).state_dict(), getattr(model, part).state_dict()
        assert got.keys() == expected.keys() and all(torch.equal(got[k], v) for k, v in expected.items()), part


def test_a_resumed_run_goes_on_from_its_checkpoint_never_back_to_the_source(ray_local, tmp_path):
    import ray
    import ray.train

    cfg = resolve("tiny", "cocolm", ["data.vocab_size=50"])
    trained, optimizer, scheduler = build_training(cfg)
    checkpoint.save(tmp_path, trained, optimizer, scheduler, TrainState(step=3), to_yaml(cfg), None)
    source = build_pretraining_model(cfg.model, cfg.objective).main.state_dict()
    weights = ray.put(InitWeights(source))
    model, optimizer, scheduler = build_training(cfg)
    state = start_from(model, optimizer, scheduler, ray.train.Checkpoint.from_directory(tmp_path), weights, 0)
    assert state.step == 3
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
    fresh, optimizer, scheduler = build_training(cfg)  # a new run starts from the source
    assert start_from(fresh, optimizer, scheduler, None, weights, 0).step == 0
    assert all(torch.equal(fresh.main.state_dict()[k], v) for k, v in source.items())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_continued_pretraining_from_an_export_trains_from_its_weights_and_records_its_source(
        ray_local, tokenizer_dir, small_corpus, home, tmp_path):
    torch.manual_seed(7)
    shape = model_size("tiny", vocab_size=1000, hidden_size=32, num_layers=1, num_heads=2, ffn_size=64,
                       max_positions=128).main
    source = export_encoder(Encoder(shape), tmp_path / "export", tokenizer_dir=tokenizer_dir)
    # A learning rate too small to move a weight by 1e-5 in two steps: the export is the source, still.
    overrides = [f"data.paths=[{str(small_corpus)!r}]", "train.max_steps=2", "train.peak_lr=1e-7",
                 "train.warmup_steps=1"]
    result = job.run(init_config("tiny", "cocolm", overrides, resolve_init(str(source), None)))
    client = MlflowClient(result.tracking_uri)
    params = client.get_run(result.run_id).data.params
    assert params["init_from"] == str(source) and params["model.hidden_size"] == "32"
    exported = load_encoder(client.download_artifacts(result.run_id, "encoder", str(tmp_path / "download")))
    expected = load_encoder(source).state_dict()
    assert all(torch.allclose(v, expected[k], atol=1e-5) for k, v in exported.state_dict().items())
