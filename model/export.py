"""Export the main encoder so `transformers.AutoModel.from_pretrained(dir, trust_remote_code=True)` loads it.

The directory holds config.json (with `auto_map`), model.safetensors, the source of `hf_modeling.py` and
the modules it imports, and `code_manifest.json`, the sha256 of each of those code files: loading needs
no network and no copy of this repository.

`trust_remote_code=True` runs the directory's .py files as the user who loads it, and an export often
comes from storage others can write (a shared MLflow server, a bucket). `load_export(dir)` is the loading
path that checks first (`verify_export`): every code file must be listed in the manifest with its hash,
and that hash must be the one of this checkout's own file of that name, the code `export_encoder` copies;
anything else is refused, unrun. `model.classifier.load_encoder(dir)` runs no code from the directory at all.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import transformers
from safetensors.torch import save_file
from torch import nn

from .classifier import LM_HEAD_FILES, lm_head_parts
from .encoder import Encoder
from .hf_configuration import COCOLMConfig
from .hf_modeling import COCOLMModel


def export_encoder(encoder: Encoder, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
                   lm_head: nn.Module | None = None) -> Path:
    """Write the encoder (and, if given, the tokenizer files and its language-model head) as a transformers
    model directory. The head goes next to it (`model.classifier.LM_HEAD_FILES`) without the token
    embeddings it shares with the encoder; transformers ignores it, `load_lm_head` reads it."""
    out = Path(out_dir)
    COCOLMConfig.register_for_auto_class()
    COCOLMModel.register_for_auto_class("AutoModel")
    hf_model = COCOLMModel(COCOLMConfig(**asdict(encoder.cfg)))
    hf_model.encoder.load_state_dict(encoder.state_dict())
    hf_model.save_pretrained(out)
    if lm_head is not None:
        kind, state = lm_head_parts(lm_head)
        save_file({k: v.contiguous() for k, v in state.items()}, str(out / LM_HEAD_FILES[0]))
        (out / LM_HEAD_FILES[1]).write_text(json.dumps({"kind": kind}) + "\n")
    if tokenizer_dir is not None:
        for item in Path(tokenizer_dir).iterdir():
            if item.is_file() and item.name not in NOT_TOKENIZER and not (out / item.name).exists():
                shutil.copy2(item, out / item.name)
    (out / CODE_MANIFEST).write_text(json.dumps({"sha256": code_hashes(out)}, indent=1, sort_keys=True) + "\n")
    return out


CODE_MANIFEST = "code_manifest.json"
# The files of an encoder directory that are not its tokenizer's. A run started from an export or from the authors'
# converted checkpoint (`--init-from`) has that directory as its tokenizer directory; its export takes the tokenizer
# files from it, never an earlier language-model head or the conversion's record of the authors' own heads
# (`model.convert`'s official.json, official_heads.safetensors), which are not this encoder's.
NOT_TOKENIZER = {*LM_HEAD_FILES, "official.json", "official_heads.safetensors"}
OWN_CODE = Path(__file__).resolve().parent  # the model package: what export_encoder copies


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_hashes(directory: Path) -> dict[str, str]:
    """The sha256 of every .py file at the top of `directory`, the files transformers imports from it."""
    return {p.name: sha256(p) for p in sorted(Path(directory).glob("*.py"))}


def verify_export(directory: str | Path) -> None:
    """Refuse (ValueError naming the file) an export whose code is not exactly what this checkout exports:
    a code file missing from its manifest, changed since the export, or different from this package's
    own file of that name; or a config.json whose `auto_map` names code from elsewhere (`repo--module`)."""
    folder = Path(directory)
    refuse = f"refusing to load {folder} with trust_remote_code"
    try:
        listed = json.loads((folder / CODE_MANIFEST).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{refuse}: no readable {CODE_MANIFEST} ({error}); model.classifier.load_encoder "
                         "loads an export without running its code") from None
    for name, digest in code_hashes(folder).items():
        if name not in listed:
            raise ValueError(f"{refuse}: {name} is not listed in its {CODE_MANIFEST}: added after the export")
        if listed[name] != digest:
            raise ValueError(f"{refuse}: {name} is not the file the export recorded in {CODE_MANIFEST} "
                             f"(sha256 {digest[:12]}..., recorded {str(listed[name])[:12]}...)")
        own = OWN_CODE / name
        if not own.is_file() or sha256(own) != digest:
            raise ValueError(f"{refuse}: {name} differs from this checkout's model/{name} (another version of "
                             "the code, or changed): check out the commit that exported it, or load it with "
                             "model.classifier.load_encoder, which runs no code from the directory")
    auto_map = json.loads((folder / "config.json").read_text()).get("auto_map", {})
    for target in auto_map.values():
        if "--" in str(target) or f"{str(target).split('.')[0]}.py" not in listed:
            raise ValueError(f"{refuse}: config.json's auto_map names {target}, not code the export recorded")


def load_export(directory: str | Path) -> transformers.PreTrainedModel:
    """`transformers.AutoModel.from_pretrained(directory, trust_remote_code=True)`, after `verify_export`."""
    verify_export(directory)
    return transformers.AutoModel.from_pretrained(directory, trust_remote_code=True, local_files_only=True)
