"""Export the main encoder so `transformers.AutoModel.from_pretrained(dir, trust_remote_code=True)` loads it.

The directory holds config.json (with `auto_map`), model.safetensors, and the source of
`hf_modeling.py` and the modules it imports: loading needs no network and no copy of this repository.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

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
            if item.is_file() and not (out / item.name).exists():
                shutil.copy2(item, out / item.name)
    return out
