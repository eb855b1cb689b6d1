"""transformers config for the exported main encoder; copied into every export directory.

Only `model.export` imports this module, because it needs transformers. Its fields are
`EncoderConfig`'s (model/config.py, copied next to it), so the two cannot drift apart.
"""

from dataclasses import fields

from transformers import PretrainedConfig

from .config import EncoderConfig


class COCOLMConfig(PretrainedConfig):
    model_type = "cocolm"

    def __init__(self, **kwargs):
        defaults = EncoderConfig()  # the base size
        for f in fields(EncoderConfig):
            if f.name != "pad_token_id":  # PretrainedConfig keeps that one
                setattr(self, f.name, kwargs.pop(f.name, getattr(defaults, f.name)))
        super().__init__(pad_token_id=kwargs.pop("pad_token_id", defaults.pad_token_id), **kwargs)
