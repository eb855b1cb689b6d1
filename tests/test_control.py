"""jobs.studies.control: the random-init control, a pretraining run to every reader, made once."""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient

from helpers import empty_store

from model import build_pretraining_model
from jobs.pretraining.encoders import resolve_encoder
from jobs.names import KIND_PRETRAINING, KIND_TAG, PRETRAINING_SEED_TAG, RANDOM_INIT_VARIANT
from jobs.pretraining.config import resolve, with_vocab_size
from jobs.run_tables import BUDGET_PARAMS, pretraining_runs
from jobs.studies.control import initial_encoder, random_init_run
from jobs.tracking import experiment_id


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_control_is_found_again_and_loads_as_a_pretraining_run(tokenizer_dir, tmp_path):
    uri = empty_store(tmp_path)
    client = MlflowClient(uri)
    cfg = resolve("tiny", "cocolm", ["train.max_steps=40"])
    first, made = random_init_run(client, "ablation-tiny", cfg, 3, tokenizer_dir)
    assert made and random_init_run(client, "ablation-tiny", cfg, 3, tokenizer_dir) == (first, False)  # found again
    other, _ = random_init_run(client, "ablation-tiny", cfg, 4, tokenizer_dir)
    assert other != first

    exp = experiment_id(client, "ablation-tiny", uri)
    runs = pretraining_runs(client, [exp])  # what the analysis reads: two finished runs of one variant
    assert sorted(runs["run_id"]) == sorted([first, other]) and set(runs["status"]) == {"FINISHED"}
    assert set(runs["variant"]) == {RANDOM_INIT_VARIANT} and set(runs["preset"]) == {"tiny"}
    run = client.get_run(first)
    assert run.data.tags[KIND_TAG] == KIND_PRETRAINING and run.data.tags[PRETRAINING_SEED_TAG] == "3"
    vocab = resolve_encoder(first, uri, tmp_path / "a").cfg.vocab_size
    logged = with_vocab_size(cfg, vocab).flat()
    assert {p: run.data.params[p] for p in BUDGET_PARAMS} == {p: str(logged[p]) for p in BUDGET_PARAMS}
    assert run.data.params["variant"] == RANDOM_INIT_VARIANT and run.data.params["train.seed"] == "3"
    assert {a.path for a in client.list_artifacts(first)} >= {"encoder", "tokenizer", "config.yaml"}

    loaded = resolve_encoder(first, uri, tmp_path / "b")  # as `python -m jobs.finetuning --from RUN_ID` loads it
    assert loaded.pretraining_run == first and loaded.variant == RANDOM_INIT_VARIANT and loaded.preset == "tiny"
    assert (loaded.tokenizer_dir / "tokenizer.json").is_file()
    expected = initial_encoder(with_vocab_size(cfg, vocab), 3).state_dict()
    assert all(torch.equal(loaded.state[k], expected[k]) for k in expected)
    seed_4 = resolve_encoder(other, uri, tmp_path / "c").state
    assert not torch.equal(seed_4["embeddings.tokens.weight"], loaded.state["embeddings.tokens.weight"])


def test_the_control_is_the_main_encoder_a_pretraining_run_of_that_seed_starts_from():
    """jobs.pretraining.loop seeds torch with train.seed, then builds the objective, main encoder first."""
    cfg = with_vocab_size(resolve("tiny", "electra"), 1000)
    torch.manual_seed(5)
    started = build_pretraining_model(cfg.model, cfg.objective).main.state_dict()
    control = initial_encoder(cfg, 5).state_dict()
    assert control.keys() == started.keys() and all(torch.equal(control[k], started[k]) for k in started)


def test_the_control_is_the_same_encoder_whatever_another_thread_draws_meanwhile():
    """`ablate --concurrent-runs 2` builds a control in one thread while another reads out a run with torch
    in the same process: drawing from torch's global generator between the seed and the build gave
    controls of one seed that differed between studies (docs/measurements/cpu-study-seq32-long64/)."""
    import threading

    cfg = with_vocab_size(resolve("tiny", "electra"), 1000)
    torch.manual_seed(5)
    expected = build_pretraining_model(cfg.model, cfg.objective).main.state_dict()
    stop = threading.Event()

    def draw():
        while not stop.is_set():
            torch.rand(10_000)

    other = threading.Thread(target=draw)
    other.start()
    try:
        built = [initial_encoder(cfg, 5).state_dict()]  # each build starts a process: one is enough to catch a draw
    finally:
        stop.set()
        other.join()
    for control in built:
        assert all(torch.equal(control[k], expected[k]) for k in expected)
