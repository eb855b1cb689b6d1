"""Output heads (docs/method.md sections 2.4 and 4). Vocabulary projections are tied to the shared token embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .encoder import init_weights


class MLMHead(nn.Module):
    """Auxiliary MLM head (and roberta_mlm's): dense H -> E, GELU, LayerNorm, then h . E^T + bias."""

    def __init__(self, hidden_size: int, embeddings: nn.Embedding, layer_norm_eps: float = 1e-5):
        super().__init__()
        vocab_size, embedding_size = embeddings.weight.shape
        self.dense = nn.Linear(hidden_size, embedding_size)
        self.norm = nn.LayerNorm(embedding_size, eps=layer_norm_eps)
        self.apply(init_weights)
        self.embeddings = embeddings  # shared, registered under the owning encoder too
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.norm(F.gelu(self.dense(h)))  # (N, E)
        return F.linear(x, self.embeddings.weight, self.bias)  # (N, V)


class CopyHead(nn.Module):
    """Replaced-token ("copy") head: one logit per position, p_copy(1|h) = sigmoid(w . h). No projection."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        self.apply(init_weights)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h).squeeze(-1)  # (..., T)


class ElectraDiscriminatorHead(nn.Module):
    """ELECTRA's discriminator head, for the `electra` baseline: dense H -> H, GELU, dense H -> 1. Its
    logit is read as the copy head's (original vs replaced; ELECTRA's label is the flip, same loss)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.prediction = nn.Linear(hidden_size, 1)
        self.apply(init_weights)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.prediction(F.gelu(self.dense(h))).squeeze(-1)  # (..., T)


class CLMHead(nn.Module):
    """CLM language-model head: logits = h . E^T + b, shared embeddings, no dense or LayerNorm."""

    def __init__(self, embeddings: nn.Embedding):
        super().__init__()
        self.embeddings = embeddings
        self.bias = nn.Parameter(torch.zeros(embeddings.weight.shape[0]))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.embeddings.weight, self.bias)  # (N, V)


class SCLHead(nn.Module):
    """Sequence vector for SCL from h_[CLS]: dense H -> H, GELU, LayerNorm."""

    def __init__(self, hidden_size: int, layer_norm_eps: float = 1e-5):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.apply(init_weights)

    def forward(self, h_cls: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(h_cls)))  # (B, H)
