"""`PretrainedEncoder`: a pretrained main encoder as the driver hands it to what starts from it, a fine-tuning
trial or continued pretraining; `jobs/pretraining/encoders.py` resolves one from what the user names.

Its own module, light on purpose: every Ray Tune trial actor unpickles one, which imports this module, so it
imports torch and the model alone. Resolving an encoder needs MLflow, the hub and the checkpoint converter
(transformers), 3 to 4 s of imports that a trial never uses (tests/test_layout.py keeps them out).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model import Encoder, EncoderConfig
from model.classifier import lm_head

from jobs.cli import UserError


@dataclass(frozen=True)
class PretrainedEncoder:
    """What every trial starts from. Weights travel as a state dict (Ray's object store), so trials
    on other nodes need no shared file system; the tokenizer is used by the driver only."""

    cfg: EncoderConfig
    state: dict[str, torch.Tensor]
    tokenizer_dir: Path
    source: str  # what the user passed: a run id or a directory
    pretraining_run: str = ""  # MLflow run id when known
    preset: str = ""  # the pretraining preset when known (large++ selects the large++ learning rates)
    variant: str = ""  # the pretraining variant when known
    lm_head_kind: str = ""  # "clm" | "mlm" when the export kept its language-model head, else ""
    lm_head_state: dict[str, torch.Tensor] | None = None
    # A pretraining checkpoint's auxiliary, which continued pretraining starts from (`--init-from`), and the rule
    # it was built by ({"aux_layers": ..., "aux_width_divisor": ...}); None where the source has none, or a frozen
    # one (converged_aux: it has token embeddings of its own, not the main encoder's).
    aux_state: dict[str, torch.Tensor] | None = None
    aux_shape: dict[str, Any] | None = None

    def build(self) -> Encoder:
        encoder = Encoder(self.cfg)
        encoder.load_state_dict(self.state, strict=True)
        return encoder

    def build_with_lm_head(self) -> tuple[Encoder, torch.nn.Module]:
        """The encoder and its language-model head, tied to its token embeddings (prompt-based fine-tuning)."""
        if self.lm_head_state is None:
            raise UserError(f"{self.source}: no language-model head (variant {self.variant or 'unknown'} trains none)")
        encoder = self.build()
        return encoder, lm_head(self.lm_head_kind, encoder, self.lm_head_state)
