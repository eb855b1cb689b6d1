"""transformers wrapper of the main encoder; copied, with the modules it imports, into every export.

The wrapper runs this repository's own `Encoder`, so the exported model and ours are one
implementation. Only `model.export` imports this module, because it needs transformers.
"""

from dataclasses import fields

import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from .config import EncoderConfig
from .encoder import Encoder, init_weights
from .hf_configuration import COCOLMConfig


class COCOLMModel(PreTrainedModel):
    config_class = COCOLMConfig
    base_model_prefix = "cocolm"

    def __init__(self, config: COCOLMConfig):
        super().__init__(config)
        self.encoder = Encoder(EncoderConfig(**{f.name: getattr(config, f.name) for f in fields(EncoderConfig)}))
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        init_weights(module)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.encoder.embeddings.tokens

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> BaseModelOutput:
        mask = None if attention_mask is None else attention_mask.bool()
        return BaseModelOutput(last_hidden_state=self.encoder(input_ids, mask))
