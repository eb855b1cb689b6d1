"""The random-init control: the preset's main encoder at initialisation, logged as a pretraining run.

    random_init_run(client, experiment, cfg, seed, tokenizer_dir=None) -> (run id, made now)

A variant that does not beat an encoder that never trained has shown nothing downstream (issue 33).
The control is read out like every variant, so it looks like one to every reader: a FINISHED run
tagged kind=pretraining, the preset, variant `random_init` and its `pretraining_seed`, with the
resolved config's params as `jobs.pretraining` logs them (the same budget params, so the analysis
compares it with the runs of that budget), and the exported encoder (`encoder/`, with the tokenizer)
and the tokenizer (`tokenizer/`) where `jobs.pretraining.job` puts them. So `jobs.studies.represent`,
`jobs.studies.probe` and `python -m jobs.finetuning --from RUN_ID` load it as they load any run.

The encoder is `Encoder(cfg.model.main)` right after `torch.manual_seed(seed)`, in a fresh process so
that no other thread's draw falls between the two: the weights a pretraining run with `train.seed=seed`
starts from (its main encoder is the first module built after that seed). It has no language-model
head and no checkpoint (no `cocolm.checkpoint` tag): there is nothing to resume and nothing for
prompt-based fine-tuning to read. The same (preset, seed, encoder shape) in the same experiment is
found again, never made twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import tempfile
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient

from model import Encoder
from model.encoder import seeded_state
from model.export import export_encoder

from jobs import tracking
from jobs.data.tokenizer import resolve_tokenizer
from jobs.data.tokens import load_tokenizer
from jobs.names import KIND_PRETRAINING, KIND_TAG, PRETRAINING_SEED_TAG, RANDOM_INIT_VARIANT
from jobs.pretraining.config import PretrainConfig, to_yaml, with_vocab_size


def control_config(cfg: PretrainConfig, seed: int, vocab_size: int) -> PretrainConfig:
    """`cfg` as the control's run records it: variant random_init, train.seed the control's seed, the
    tokenizer's vocabulary size."""
    cfg = dataclasses.replace(cfg, variant=RANDOM_INIT_VARIANT, train=dataclasses.replace(cfg.train, seed=seed))
    return with_vocab_size(cfg, vocab_size)


def run_key(cfg: PretrainConfig, seed: int) -> str:
    """What names a control: preset, seed and the main encoder's shape (a --set that changes the encoder
    makes another control; one that changes only training does not)."""
    shape = hashlib.sha256(json.dumps(dataclasses.asdict(cfg.model.main), sort_keys=True).encode()).hexdigest()[:10]
    return f"{cfg.preset}-{RANDOM_INIT_VARIANT}-seed{seed}-{shape}"


def initial_encoder(cfg: PretrainConfig, seed: int) -> Encoder:
    """The main encoder at initialisation, seeded as a pretraining run with train.seed=seed seeds it.

    Built in a fresh process: torch has one generator per process, and `ablate --concurrent-runs`
    builds a control in one thread while another reads out a run with torch. Draws between the seed
    and the build gave one seed's control different weights in two studies (and the build's own draws
    would shift that readout's). Here the caller's generator is never touched."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        state = pool.apply(seeded_state, (cfg.model.main, seed))
    with torch.device("meta"):  # the shapes only: no draw from this process's generator
        encoder = Encoder(cfg.model.main)
    encoder.load_state_dict(state, assign=True)
    return encoder


def random_init_run(client: MlflowClient, experiment: str, cfg: PretrainConfig, seed: int,
                    tokenizer_dir: str | Path | None = None) -> tuple[str, bool]:
    """The id of the FINISHED control run of (cfg.preset, seed, encoder shape) in `experiment` and whether
    this call made it: found, or made with the tokenizer the study's pretraining runs use (`tokenizer_dir`,
    default the job's own: data.tokenizer_dir or the cached one for the corpus)."""
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else resolve_tokenizer(cfg.data)
    cfg = control_config(cfg, seed, load_tokenizer(tokenizer_dir).get_vocab_size())
    experiment_id = tracking.experiment_id(client, experiment, client.tracking_uri)
    key = run_key(cfg, seed)
    tags = {KIND_TAG: KIND_PRETRAINING, "preset": cfg.preset, "variant": RANDOM_INIT_VARIANT,
            PRETRAINING_SEED_TAG: str(seed), "git_commit": tracking.git_commit()}
    run_id, status = tracking.find_or_start_run(client, experiment_id, key, key, tags)
    if status == "FINISHED":
        print(f"random-init control {key} already logged: MLflow run {run_id}", flush=True)
        return run_id, False
    with tracking.ending_run(client, run_id):
        tracking.log_params(client, run_id, cfg.flat())
        client.log_text(run_id, to_yaml(cfg), "config.yaml")
        with tempfile.TemporaryDirectory(prefix="cocolm-control-") as tmp:
            out = export_encoder(initial_encoder(cfg, seed), Path(tmp) / "encoder", tokenizer_dir=tokenizer_dir)
            client.log_artifacts(run_id, str(out), "encoder")
        client.log_artifacts(run_id, str(tokenizer_dir), "tokenizer")
    print(f"random-init control {key}: MLflow run {run_id} (the {cfg.preset} main encoder at initialisation, "
          f"seed {seed}, never trained)", flush=True)
    return run_id, True
