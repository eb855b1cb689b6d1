"""Fine-tuning: the sentence(-pair) head on [CLS] (docs/method.md section 7.1), the start/end head of
extractive question answering (section 7.6), and loading an exported encoder.

The head: dropout, dense H->H, tanh (BERT's; the authors' released fine-tuning code has GELU there: the
`activation` argument), dropout, output (num_classes logits, or one value for regression such as STS-B).
`load_encoder` reads a directory written by `model.export.export_encoder` (config.json + model.safetensors)
into our own `Encoder`, without transformers: the exported model and the fine-tuned one are one implementation.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from .config import EncoderConfig
from .encoder import Encoder, init_weights
from .heads import CLMHead, MLMHead

EXPORT_PREFIX = "encoder."  # model.hf_modeling.COCOLMModel keeps our Encoder as `.encoder`


HEAD_ACTIVATIONS = {"tanh": torch.tanh, "gelu": F.gelu}  # gelu: exact (erf), the authors' head


class ClassificationHead(nn.Module):
    def __init__(self, hidden_size: int, num_outputs: int, dropout: float, activation: str = "tanh"):
        super().__init__()
        if activation not in HEAD_ACTIVATIONS:
            raise ValueError(f"unknown head activation {activation!r}; expected one of {sorted(HEAD_ACTIVATIONS)}")
        self.activation = HEAD_ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, num_outputs)
        self.apply(init_weights)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        x = self.activation(self.dense(self.dropout(cls)))  # (B, H)
        return self.out(self.dropout(x))  # (B, num_outputs)


class SequenceClassifier(nn.Module):
    """Encoder + head on the [CLS] position. `num_outputs` = 1 makes it a regressor."""

    def __init__(self, encoder: Encoder, num_outputs: int, dropout: float | None = None):
        super().__init__()
        self.encoder = encoder
        self.head = ClassificationHead(encoder.cfg.hidden_size, num_outputs,
                                       encoder.cfg.dropout if dropout is None else dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.encoder(input_ids, attention_mask)  # (B, T, H)
        return self.head(hidden[:, 0])  # (B, num_outputs)


class SpanExtractor(nn.Module):
    """Encoder + start/end linear heads on every position (SQuAD 2.0, as BERT's). Padding positions get
    the lowest logit, so neither the loss nor the answer search can pick them."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder
        self.span = nn.Linear(encoder.cfg.hidden_size, 2)
        init_weights(self.span)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.span(self.encoder(input_ids, attention_mask))  # (B, T, 2): start, end
        if attention_mask is not None:
            logits = logits.masked_fill(~attention_mask.bool()[..., None], torch.finfo(logits.dtype).min)
        return logits


LM_HEAD_FILES = ("lm_head.safetensors", "lm_head.json")  # an export's language-model head, when it has one


def load_lm_head(directory: str | Path, encoder: Encoder) -> nn.Module | None:
    """The language-model head exported with `encoder` (CLM or MLM head, tied to its token embeddings), or
    None when the export has none (its variant trains no LM head: rtd_only, scl_rtd, electra)."""
    directory = Path(directory)
    if not (directory / LM_HEAD_FILES[0]).is_file():
        return None
    kind = json.loads((directory / LM_HEAD_FILES[1]).read_text())["kind"]
    return lm_head(kind, encoder, load_file(str(directory / LM_HEAD_FILES[0])))


def lm_head(kind: str, encoder: Encoder, state: dict[str, torch.Tensor]) -> nn.Module:
    """A `kind` ("clm" | "mlm") head on `encoder`'s token embeddings with the weights in `state`."""
    tokens = encoder.embeddings.tokens
    if kind not in LM_HEAD_KINDS.values():
        raise ValueError(f"unknown language-model head kind {kind!r}; expected one of {sorted(LM_HEAD_KINDS.values())}")
    head = CLMHead(tokens) if kind == "clm" else MLMHead(encoder.cfg.hidden_size, tokens, encoder.cfg.layer_norm_eps)
    head.load_state_dict({**state, "embeddings.weight": tokens.weight}, strict=True)
    return head


def lm_head_parts(head: nn.Module) -> tuple[str, dict[str, torch.Tensor]]:
    """A head's kind and its own weights, without the token embeddings it shares with the encoder."""
    return LM_HEAD_KINDS[type(head)], {k: v for k, v in head.state_dict().items() if not k.startswith("embeddings.")}


LM_HEAD_KINDS = {CLMHead: "clm", MLMHead: "mlm"}


# The sizes an export must state; the other fields have their defaults in EncoderConfig.
_SIZES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_size", "embedding_size")


def encoder_config(config_json: dict) -> EncoderConfig:
    """The EncoderConfig fields of an exported config.json (it also holds transformers' own keys)."""
    names = {f.name for f in fields(EncoderConfig)}
    missing = [n for n in _SIZES if n not in config_json]
    if missing:
        raise ValueError(f"config.json lacks encoder field(s) {missing}: not a COCO-LM export?")
    return EncoderConfig(**{k: v for k, v in config_json.items() if k in names})


def load_encoder(directory: str | Path) -> Encoder:
    """Our `Encoder` with the weights of an exported directory (config.json + model.safetensors)."""
    directory = Path(directory)
    cfg = encoder_config(json.loads((directory / "config.json").read_text()))
    weights = load_file(str(directory / "model.safetensors"))
    state = {k.removeprefix(EXPORT_PREFIX): v for k, v in weights.items() if k.startswith(EXPORT_PREFIX)}
    encoder = Encoder(cfg)
    encoder.load_state_dict(state, strict=True)
    return encoder
