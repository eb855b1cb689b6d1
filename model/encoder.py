"""The Transformer encoder used for both the main encoder and the auxiliary model (docs/method.md section 2.1).

BERT-style: post-LayerNorm residual blocks, exact GELU, learned absolute positions plus the
relative position bias, no token types. The auxiliary model receives the main encoder's
`Embeddings` module, so token embeddings, absolute positions and the embedding LayerNorm are
shared as in the authors' code; ELECTRA's narrower auxiliary reaches them through a projection.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import (
    PROBE_BLOCKS, FlexBias, RelativePositionBias, SelfAttention, TritonBias, TritonShape, attention_bias,
    check_attention_choice, compute_dtype, device_flex_options, fallback_attention, flex_bias, flex_failure,
    flex_works, planned, probe_flex, probe_triton, resolve_attention, triton_bias, triton_failures, triton_probed,
    triton_works,
)
from .config import EncoderConfig


# Where compiled flex and the Triton kernel can fail to build (tiles, shared memory, a Triton version)
# and are probed before first use.
PROBED_DEVICE_TYPES = ("cuda",)


def probes_attention(device: torch.device) -> bool:
    """Whether attention kernels are probed before they run on `device` (`PROBED_DEVICE_TYPES`)."""
    return device.type in PROBED_DEVICE_TYPES


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

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor | FlexBias | TritonBias | None, implementation: str = "sdpa"
    ) -> torch.Tensor:
        if self.pre_layer_norm:
            x = x + self.dropout(self.attention(self.attention_norm(x), bias, implementation))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.attention_norm(x + self.dropout(self.attention(x, bias, implementation)))
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
        self.attention_implementation = "auto"  # a choice, resolved per forward: see model.attention
        # What ran, after any fallback: the last implementation of passes with gradients ("training")
        # and without ("no-grad"); `python -m model.bench` reports it.
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
        dropout_active = self.training and self.cfg.attention_dropout > 0
        implementation = resolve_attention(self.attention_implementation, x.device, dropout_active)
        dtype = compute_dtype(x)  # q's dtype: bf16 under autocast while x stays fp32
        padding = None if all_real else attention_mask.bool()
        if implementation == "triton" and not self._triton_runs(x.device, dtype, dropout_active, batch, seq_len,
                                                                padding is not None):
            implementation = fallback_attention(x.device, dropout_active)
        if implementation == "flex" and not self._flex_runs(x.device, dtype):
            implementation = "sdpa"
        self.attention_ran[PASS_KINDS[0] if torch.is_grad_enabled() else PASS_KINDS[1]] = implementation
        if implementation == "triton":
            # the bias per distance, (h, 2S + 1): no (h, T, T) lookup at all
            distance_bias = self.relative_bias.by_distance(seq_len) if self.relative_bias is not None else None
            bias = triton_bias(distance_bias, padding, None if torch.is_grad_enabled() else PROBE_BLOCKS, seq_len)
        else:
            position_bias = self.relative_bias(seq_len) if self.relative_bias is not None else None
            if implementation == "flex":
                options = device_flex_options(x.device, self.cfg.head_dim, dtype, _dtype_of(position_bias))
                bias = flex_bias(padding, position_bias, options)  # BlockMask + (h, T, T), for all layers
            else:
                bias = attention_bias(padding, position_bias, dtype)  # (B or 1, h or 1, T, T), or None
        for layer in self.layers:
            x = layer(x, bias, implementation)
        return x if self.final_norm is None else self.final_norm(x)

    def _flex_runs(self, device: torch.device, dtype: torch.dtype) -> bool:
        """False when compiled flex fails on this GPU (checked once per process and configuration,
        then SDPA runs: see `model.attention.flex_works`). CPU flex is torch's unfused reference path,
        and inside a compiled region the check has already run or cannot."""
        if not probes_attention(device) or torch.compiler.is_compiling():
            return True
        cfg, relative = self.cfg, self.relative_bias is not None
        key = (str(device), cfg.num_heads, cfg.head_dim, dtype, relative)
        return flex_works(key, lambda: probe_flex(device, cfg.num_heads, cfg.head_dim, dtype, relative))

    def _triton_runs(self, device: torch.device, dtype: torch.dtype, dropout_active: bool, batch: int,
                     seq_len: int, padded: bool) -> bool:
        """False where the Triton kernel fails at this shape on this GPU (probed once per process and
        `TritonShape`, eagerly, then `fallback_attention` runs for that shape alone: see
        `model.attention.triton_works`). Inside a compiled region no probe can run: a shape the eager
        warm-up did not meet falls back (`model.attention.triton_probed`). Off CUDA it is not probed (on
        CPU it runs under Triton's interpreter or raises, naming why)."""
        cfg, relative = self.cfg, self.relative_bias is not None
        shape = TritonShape(str(device), cfg.num_heads, cfg.head_dim, dtype, relative, seq_len, padded,
                            cfg.attention_dropout if dropout_active else 0.0, torch.is_grad_enabled())
        if planned(shape):  # counting the kernels a step would compile (`model.attention.planning`)
            return False
        if not probes_attention(device):
            return True
        if torch.compiler.is_compiling():
            return triton_probed(shape)
        reach = min(self.relative_bias.saturation, seq_len - 1) if relative else 0
        return triton_works(shape, lambda: probe_triton(shape, batch, reach))


def attention_ran(model: nn.Module) -> str:
    """What attention the encoders inside `model` ran in their last passes, after any fallback
    (`Encoder.attention_ran`), e.g. 'triton in training passes, triton in no-grad passes': what
    `python -m model.bench` prints and the pretraining job logs."""
    ran: dict[str, set[str]] = {}
    for encoder in (m for m in model.modules() if isinstance(m, Encoder)):
        for kind, implementation in encoder.attention_ran.items():
            if implementation:  # "": no pass of this kind ran (`model.step.compile_step` sets the keys)
                ran.setdefault(kind, set()).add(implementation)
    return ", ".join(f"{'/'.join(sorted(ran[kind]))} in {kind} passes" for kind in PASS_KINDS if kind in ran)


def attention_fallbacks() -> str:
    """Every fallback of this process with its cause, or '' where there was none: the Triton kernel's per
    shape (flex or SDPA ran there instead) and flex's (SDPA ran instead)."""
    lines = [f"the Triton kernel at {shape} fell back to flex/SDPA ({cause})"
             for shape, cause in triton_failures().items()]
    if failure := flex_failure():
        lines.append(f"flex fell back to SDPA ({failure})")
    return "; ".join(lines)


def _dtype_of(tensor: torch.Tensor | None) -> torch.dtype | None:
    return None if tensor is None else tensor.dtype


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
