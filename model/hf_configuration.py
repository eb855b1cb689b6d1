"""transformers config for the exported main encoder; copied into every export directory.

Only `model.export` imports this module, because it needs transformers.
"""

from transformers import PretrainedConfig


class COCOLMConfig(PretrainedConfig):
    model_type = "cocolm"

    def __init__(
        self,
        vocab_size: int = 32768,
        hidden_size: int = 768,
        num_layers: int = 12,
        num_heads: int = 12,
        ffn_size: int = 3072,
        embedding_size: int = 768,
        max_positions: int = 512,
        relative_position: bool = True,
        rel_pos_buckets: int = 32,
        rel_pos_max_distance: int = 128,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        layer_norm_eps: float = 1e-5,
        pad_token_id: int = 0,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.ffn_size = ffn_size
        self.embedding_size = embedding_size
        self.max_positions = max_positions
        self.relative_position = relative_position
        self.rel_pos_buckets = rel_pos_buckets
        self.rel_pos_max_distance = rel_pos_max_distance
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_eps = layer_norm_eps
        super().__init__(pad_token_id=pad_token_id, **kwargs)
