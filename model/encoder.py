"""The Transformer encoder used for both the main encoder and the auxiliary model (docs/method.md section 2.1).

BERT-style: post-LayerNorm residual blocks, exact GELU, learned absolute positions plus the
relative position bias, no token types. The auxiliary model receives the main encoder's
`Embeddings` module, so token embeddings, absolute positions and the embedding LayerNorm are
shared as in the authors' code; ELECTRA's narrower auxiliary reaches them through a projection.
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .attention import (
    AttentionPass, DenseAttention, RelativePositionBias, SelfAttention, check_attention_choice, compute_dtype,
    sdpa_attention,
)
from .config import EncoderConfig


def _attention_backends() -> DenseAttention:
    """`model.backends.BACKENDS`, every attention implementation with its probes and fallbacks; or, where
    this file runs without the subpackage, the dense implementations alone: an exported encoder
    (model.export) carries this file but not model.backends, as transformers copies remote code as flat
    modules and follows flat relative imports only. Imported by name for that reason."""
    try:
        return importlib.import_module(".backends", __package__).BACKENDS
    except ModuleNotFoundError as error:
        if error.name != f"{__package__}.backends":
            raise
        return DenseAttention()


ATTENTION = _attention_backends()  # the interface every encoder pass calls


# The kinds of pass an encoder records the attention of (`Encoder.attention_ran`): with gradients
# (training), and without (the auxiliary's sampling pass in a pretraining step, and evaluation).
PASS_KINDS = ("training", "no-grad")


def init_weights(module: nn.Module) -> None:
    """N(0, 0.02) weights, zero biases, unit LayerNorms: BERT's initialisation."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class Embeddings(nn.Module):
    """Token plus absolute position embeddings, then LayerNorm and dropout."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.embedding_size, padding_idx=cfg.token_padding_idx)
        self.positions = nn.Embedding(cfg.max_positions, cfg.embedding_size)
        self.norm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.positions.num_embeddings:
            raise ValueError(f"sequence length {seq_len} exceeds max_positions {self.positions.num_embeddings}")
        positions = torch.arange(seq_len, device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)[None]  # (B, T, E)
        return self.dropout(self.norm(x))


class FeedForward(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_size)
        self.down = nn.Linear(cfg.ffn_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))  # exact (erf) GELU


class TransformerLayer(nn.Module):
    """Post-LN block, the paper's: x = LN(x + drop(attn(x))); x = LN(x + drop(ffn(x))).
    With cfg.pre_layer_norm: x = x + drop(attn(LN(x))); x = x + drop(ffn(LN(x))), and the encoder adds
    a final LN."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre_layer_norm = cfg.pre_layer_norm

    def forward(self, x: torch.Tensor, bias: object, attend: Callable[..., torch.Tensor] = sdpa_attention) -> torch.Tensor:
        """`bias` and `attend`: the pass's attention (`model.attention.SelfAttention`)."""
        if self.pre_layer_norm:
            x = x + self.dropout(self.attention(self.attention_norm(x), bias, attend))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.attention_norm(x + self.dropout(self.attention(x, bias, attend)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class Encoder(nn.Module):
    """Embeddings -> layers, returning the last hidden states (B, T, H).

    Pass `embeddings` to share another encoder's (the auxiliary model does); otherwise the encoder
    owns a fresh set.
    """

    def __init__(self, cfg: EncoderConfig, embeddings: Embeddings | None = None):
        super().__init__()
        self.cfg = cfg
        self.embeddings = embeddings if embeddings is not None else Embeddings(cfg)
        self.embedding_projection = (
            nn.Linear(cfg.embedding_size, cfg.hidden_size) if cfg.embedding_size != cfg.hidden_size else None
        )
        self.relative_bias = RelativePositionBias(cfg) if cfg.relative_position else None
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_layers))
        # Pre-LN leaves the residual stream unnormalised: the heads expect normalised states.
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.pre_layer_norm else None
        self.attention_implementation = "auto"  # a choice, resolved per pass by `ATTENTION.choose`
        # What ran, after any fallback: the last implementation of passes with gradients ("training")
        # and without ("no-grad"); `python -m bench` reports it.
        self.attention_ran: dict[str, str] = {}
        for name, child in self.named_children():
            if not (name == "embeddings" and embeddings is not None):  # never re-initialise shared weights
                child.apply(init_weights)

    def set_attention(self, implementation: str) -> None:
        """'auto' (default: flex on CUDA without active attention dropout, else SDPA), 'sdpa', 'flex', 'triton', or
        'reference' (the written-out softmax the tests compare against)."""
        check_attention_choice(implementation)
        self.attention_implementation = implementation

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, all_real: bool = False
    ) -> torch.Tensor:
        """`attention_mask` (B, T), True on real tokens, defaults to the non-[PAD] ids. `all_real` is the
        caller's word that no row has padding (packed pretraining blocks: `model.objective.unpadded`):
        attention then gets no padding term, only the relative bias, shared by the batch."""
        if attention_mask is None:
            attention_mask = input_ids != self.cfg.pad_token_id
        x = self.embeddings(input_ids)  # (B, T, E)
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)  # (B, T, H)
        batch, seq_len = input_ids.shape
        dropout_p = self.cfg.attention_dropout if self.training and self.cfg.attention_dropout > 0 else 0.0
        padding = None if all_real else attention_mask.bool()
        relative = self.relative_bias
        reach = min(relative.saturation, seq_len - 1) if relative is not None else 0
        request = AttentionPass(x.device, self.cfg.num_heads, self.cfg.head_dim, compute_dtype(x), relative is not None,
                                seq_len, padding is not None, dropout_p, torch.is_grad_enabled(), batch, reach)
        implementation = ATTENTION.choose(self.attention_implementation, request)
        self.attention_ran[PASS_KINDS[0] if torch.is_grad_enabled() else PASS_KINDS[1]] = implementation
        bias = ATTENTION.bias(implementation, request, relative, padding)  # built once, for all the layers
        attend = ATTENTION.function(implementation)
        for layer in self.layers:
            x = layer(x, bias, attend)
        return x if self.final_norm is None else self.final_norm(x)


def seeded_state(cfg: EncoderConfig, seed: int) -> dict[str, torch.Tensor]:
    """The weights `Encoder(cfg)` gets right after `torch.manual_seed(seed)`. Beside the class, so that the
    process `jobs.studies.control` spawns to draw them imports the model alone (1.3 s), not the study's
    tracking and Ray (5.3 s)."""
    torch.manual_seed(seed)
    return Encoder(cfg).state_dict()


def attention_ran(model: nn.Module) -> str:
    """What attention the encoders inside `model` ran in their last passes, after any fallback
    (`Encoder.attention_ran`), e.g. 'triton in training passes, triton in no-grad passes': what
    `python -m bench` prints and the pretraining job logs."""
    ran: dict[str, set[str]] = {}
    for encoder in (m for m in model.modules() if isinstance(m, Encoder)):
        for kind, implementation in encoder.attention_ran.items():
            if implementation:  # "": no pass of this kind ran (`model.step.compile_step` sets the keys)
                ran.setdefault(kind, set()).add(implementation)
    return ", ".join(f"{'/'.join(sorted(ran[kind]))} in {kind} passes" for kind in PASS_KINDS if kind in ran)


def attention_fallbacks() -> str:
    """Every fallback of this process with its cause, or '' where there was none: the Triton kernel's per
    shape (flex or SDPA ran there instead) and flex's (SDPA ran instead)."""
    return ATTENTION.fallbacks()


def compile_encoders(module: nn.Module, backend: str = "inductor") -> list[TransformerLayer]:
    """`torch.compile` every Transformer layer of every `Encoder` inside `module`, in place; returns them.

    Per layer, as large-model trainers do, rather than per encoder: all layers of both encoders share
    one code object and, at equal shapes, one graph, so compilation is one layer's worth, not the
    whole stack unrolled (the `small` model on CPU, cold cache: 45 s against 128 s for whole
    encoders), while the fusions that matter (attention, GELU, residual + LayerNorm) stay inside a
    layer. The step around the layers stays eager: it gathers data-dependent numbers of positions.
    `Module.compile` leaves `state_dict` keys as they are (no `_orig_mod.` prefix), so checkpoints
    do not change. Static shapes: a COCO-LM step uses three graphs (training pass on the block and
    on the crop, no-grad sampling pass), well inside dynamo's recompile limit (8) past which torch
    would silently run eagerly. `backend` is torch.compile's ("aot_eager" in the CPU tests: no C++
    toolchain needed).
    """
    layers = [layer for m in module.modules() if isinstance(m, Encoder) for layer in m.layers]
    for layer in layers:
        layer.compile(backend=backend, dynamic=False)
    return layers
