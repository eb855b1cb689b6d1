"""A pretrained encoder by name, what a sweep or a few-shot study fine-tunes (`--from`) and what continued
pretraining starts from (`--init-from`): a pretraining run in MLflow, a checkpoint, an exported encoder, or
the authors' released checkpoint directory or hub id (converted by `model.convert`, once per content).

Resolved on the driver (`resolve_encoder`); trials receive the resulting `PretrainedEncoder` (weights as a
state dict, `jobs/pretraining/pretrained.py`).
"""

from __future__ import annotations

import re
from pathlib import Path

from huggingface_hub import constants as hub_constants
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from model.classifier import lm_head_parts, load_encoder, load_lm_head
from model.convert import ConversionError, content_key, from_official, is_official

from jobs.cli import UserError
from jobs.data.schemes import scheme_of
from jobs.names import KIND_PRETRAINING, KIND_TAG
from jobs.pretraining import checkpoint
from jobs.pretraining.pretrained import PretrainedEncoder

LATEST = "last"  # --from last: the newest finished pretraining run in the store


def latest_pretraining_run(client: MlflowClient) -> str:
    """The id of the most recently finished pretraining run in any experiment of the store (the
    `pretraining` experiment of `jobs.pretraining`, or an ablation study's): what was just printed."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = [] if not experiments else client.search_runs(
        experiments, filter_string=f"tags.{KIND_TAG} = '{KIND_PRETRAINING}' and attributes.status = 'FINISHED'",
        order_by=["attributes.end_time DESC"], max_results=1)
    if not runs:
        raise UserError(f"--from {LATEST}: no finished pretraining run in this MLflow store; run "
                         f"`python -m jobs.pretraining` first or pass a run id or directory")
    run = runs[0]
    experiment = client.get_experiment(run.info.experiment_id).name
    print(f"--from {LATEST}: pretraining run {run.info.run_id} ({run.data.tags.get('preset', '?')} / "
          f"{run.data.tags.get('variant', '?')}, experiment {experiment!r})", flush=True)
    return run.info.run_id


def resolve_encoder(source: str, tracking_uri: str | None, workdir: str | Path) -> PretrainedEncoder:
    """A checkpoint directory, an exported encoder directory, the authors' checkpoint directory or its
    Hugging Face hub id (`microsoft/cocolm-base`), a pretraining run id in `tracking_uri`, or `last` for the
    newest finished pretraining run there."""
    path = Path(source)
    if not path.exists() and HUB_ID.fullmatch(source):
        path = hub_checkpoint(source)
    if path.is_dir():
        if is_official(path):
            return _exported(converted_official(path, workdir), source)
        if (path / "model.pt").is_file():
            return encoder_from_checkpoint(path)
        if (path / "model.safetensors").is_file():
            return _exported(path, source)
        raise UserError(f"{path} is neither a pretraining checkpoint (model.pt, config.yaml, tokenizer/), "
                        f"an exported encoder (config.json, model.safetensors) nor the authors' checkpoint "
                        f"(config.json, pytorch_model.bin or model.safetensors, sp.model, dict.txt)")
    client = MlflowClient(tracking_uri)
    if source == LATEST:
        source = latest_pretraining_run(client)
    try:
        run = client.get_run(source)
    except MlflowException:
        raise UserError(f"--from {source!r} is neither a directory nor a run in the MLflow store {tracking_uri}") from None
    encoder_dir = Path(client.download_artifacts(source, "encoder", str(workdir)))
    if not (encoder_dir / "model.safetensors").is_file():
        raise UserError(f"run {source} has no exported 'encoder' artifact: did its pretraining finish?")
    preset = run.data.params.get("preset") or run.data.tags.get("preset", "")
    return _exported(encoder_dir, source, pretraining_run=source, preset=preset,
                     variant=run.data.tags.get("variant", ""))


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # owner/name, as the hub spells a repository
OFFICIAL_FILES = ["config.json", "pytorch_model.bin", "model.safetensors", "sp.model", "dict.txt"]


def hub_checkpoint(repo_id: str) -> Path:
    """The authors' checkpoint named by its hub id: its files from the Hugging Face cache, downloaded into it
    first when the hub may be reached (HF_HUB_OFFLINE is not 1; the platform sets 1 unless the user set it)."""
    try:
        return Path(snapshot_download(repo_id, allow_patterns=OFFICIAL_FILES))
    except LocalEntryNotFoundError:
        how = ("HF_HUB_OFFLINE=1, the platform's default: set HF_HUB_OFFLINE=0 to download it"
               if hub_constants.HF_HUB_OFFLINE else "and the hub could not be reached")
        raise UserError(f"--from {repo_id}: no such directory, and not in the Hugging Face cache ({how})") from None
    except HfHubHTTPError as error:
        raise UserError(f"--from {repo_id}: the Hugging Face hub refused it ({str(error).splitlines()[0]})") from None


def converted_official(directory: Path, workdir: str | Path) -> Path:
    """The authors' checkpoint `directory` as a platform encoder directory under `workdir`, converted once
    per content (`model.convert.content_key`): a second sweep from the same files reuses it."""
    out = Path(workdir) / "official" / content_key(directory)
    if not out.is_dir():
        try:
            from_official(directory, out)
        except ConversionError as error:
            raise UserError(str(error)) from None
        print(f"--from {directory}: the authors' checkpoint, converted into {out}", flush=True)
    return out


def _exported(directory: Path, source: str, pretraining_run: str = "", preset: str = "",
              variant: str = "") -> PretrainedEncoder:
    encoder = load_encoder(directory)
    scheme_of(directory)  # a UserError when the export came without its tokenizer
    head = load_lm_head(directory, encoder)
    return PretrainedEncoder(encoder.cfg, encoder.state_dict(), directory, source, pretraining_run, preset, variant,
                             **_lm_head_fields(head))


def _lm_head_fields(head) -> dict:
    """A language-model head as PretrainedEncoder keeps it: its kind and its weights without the token
    embeddings it shares with the encoder; nothing for no head."""
    if head is None:
        return {}
    kind, state = lm_head_parts(head)
    return {"lm_head_kind": kind, "lm_head_state": state}


def encoder_from_checkpoint(directory: str | Path) -> PretrainedEncoder:
    """The main encoder of a pretraining checkpoint, and its trained auxiliary: the model rebuilt from its
    config.yaml, model.pt loaded once."""
    directory = Path(directory)
    model, cfg = checkpoint.load_pretrained(directory)
    try:
        scheme_of(directory / "tokenizer")
    except UserError:
        raise UserError(f"{directory}/tokenizer holds no tokenizer: the checkpoint lacks its tokenizer") from None
    aux = {}
    if model.aux is not None and not cfg.objective.freeze_aux:
        aux = {"aux_state": model.aux.state_dict(),
               "aux_shape": {"aux_layers": cfg.model.aux_layers, "aux_width_divisor": cfg.model.aux_width_divisor}}
    return PretrainedEncoder(model.main.cfg, model.main.state_dict(), directory / "tokenizer", str(directory),
                             preset=cfg.preset, variant=cfg.variant, **_lm_head_fields(model.lm_head), **aux)
