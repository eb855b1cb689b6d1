"""Model FLOPs of one COCO-LM training step, counted from the matrix multiplications.

A matmul of (m, k) @ (k, n) costs 2*m*k*n FLOPs. Training a pass costs 3x its forward (backward
is two matmuls per forward matmul). Per encoder layer and sequence of length T, hidden H, FFN F:

    projections  2*T*(3*H*H + H*H + 2*H*F)      fused QKV, attention output, FFN in and out
    attention    2*2*T*T*H                      Q K^T and (softmax) V, all heads together

Softmax, LayerNorm, GELU and the bias are elementwise and left out, as MFU conventions do. The
auxiliary's sampling pass is forward only; vocabulary projections are counted only at the
positions where the objective computes them (the masked positions, or all of them for
all_token_lm). This is the count MFU is reported against: "model FLOPs", no recomputation.
"""

from __future__ import annotations

from .config import EncoderConfig, ModelConfig, ObjectiveConfig


def encoder_forward_flops(cfg: EncoderConfig, seq_len: int) -> float:
    h, f, t = cfg.hidden_size, cfg.ffn_size, seq_len
    per_layer = 2 * t * (4 * h * h + 2 * h * f) + 4 * t * t * h
    projection = 2 * t * cfg.embedding_size * h if cfg.embedding_size != h else 0  # electra_aux's input projection
    return cfg.num_layers * per_layer + projection


def mlm_head_flops(cfg: EncoderConfig, positions: float) -> float:
    """Dense H -> E then the tied vocabulary projection E -> V."""
    return 2 * positions * cfg.hidden_size * cfg.embedding_size + 2 * positions * cfg.embedding_size * cfg.vocab_size


def step_flops(
    model: ModelConfig,
    objective: ObjectiveConfig,
    seq_len: int,
    batch_size: int,
    mask_rate: float = 0.15,
    crop_fraction: float = 0.9,
) -> float:
    """Model FLOPs of one forward + backward over `batch_size` sequences of `seq_len` tokens."""
    main, aux = model.main, model.aux
    masked = mask_rate * seq_len
    if objective.replacement == "none":  # roberta_mlm: main encoder + MLM head, trained
        return batch_size * 3 * (encoder_forward_flops(main, seq_len) + mlm_head_flops(main, masked))
    total = 0.0
    if objective.replacement == "auxiliary":
        aux_pass = encoder_forward_flops(aux, seq_len) + mlm_head_flops(aux, masked)
        trained = 0 if objective.freeze_aux else 3 * aux_pass
        dropout = model.dropout > 0 or model.attention_dropout > 0  # without it, sampling reuses the train pass
        sampling = aux_pass if ((objective.sample_in_eval and dropout) or objective.freeze_aux) else 0
        total += trained + sampling
    lm_positions = seq_len if objective.lm_all_tokens else masked
    copy_head = 2 * main.hidden_size * (main.hidden_size + 1) if objective.electra_head else 2 * main.hidden_size
    main_pass = encoder_forward_flops(main, seq_len) + seq_len * copy_head
    if objective.use_lm:
        main_pass += 2 * lm_positions * main.hidden_size * main.vocab_size
    total += 3 * main_pass
    if objective.use_scl:
        crop_len = max(1, int(crop_fraction * seq_len))
        total += 3 * (encoder_forward_flops(main, crop_len) + 2 * 2 * main.hidden_size * main.hidden_size)
    return batch_size * total


def flops_per_token(model: ModelConfig, objective: ObjectiveConfig, seq_len: int, **kwargs) -> float:
    """Training FLOPs per input token (of the masked view), the unit the stream's throughput is compared in."""
    return step_flops(model, objective, seq_len, batch_size=1, **kwargs) / seq_len


# Dense bf16 peak of accelerators we benchmark on, in FLOP/s (vendor datasheets, no sparsity).
BF16_PEAK_FLOPS = {
    "H100 PCIe": 756e12,  # listed before "H100": the first key found in the name wins
    "H100": 989e12,
    "H200": 989e12,
    "A100": 312e12,
    "L4": 121e12,
    "A10G": 70e12,
    "V100": 125e12,  # fp16 tensor cores: V100 has no bf16
}


def device_peak_flops(device_name: str) -> float | None:
    """Peak for a CUDA device name such as 'NVIDIA H100 80GB HBM3'; None when unknown."""
    for key, peak in BF16_PEAK_FLOPS.items():
        if key in device_name:
            return peak
    return None


# Peers (bench.peers). Counted by the same rules as `step_flops`, for the computation each peer
# step actually performs, which is also the equivalent useful work in ours: the bench runs transformers'
# vocabulary projections only at the masked positions (as ELECTRA's and fairseq's RoBERTa's own training
# code do), so "computed" and "useful" FLOPs coincide and MFU means the same thing on both sides.


def electra_peer_step_flops(model: ModelConfig, seq_len: int, batch_size: int, mask_rate: float = 0.15) -> float:
    """ELECTRA's step: generator (our auxiliary's dimensions) with its MLM head at the masked positions
    and discriminator (the main encoder's) with ELECTRA's RTD head, dense H -> H then H -> 1, on every
    position; both trained. No separate sampling pass: ELECTRA samples from the generator's train-mode
    logits. Equals `step_flops` of our `electra` baseline, which is built the same way."""
    generator, discriminator = model.aux, model.main
    h = discriminator.hidden_size
    generator_pass = encoder_forward_flops(generator, seq_len) + mlm_head_flops(generator, mask_rate * seq_len)
    discriminator_pass = encoder_forward_flops(discriminator, seq_len) + 2 * seq_len * (h * h + h)
    return batch_size * 3 * (generator_pass + discriminator_pass)


def roberta_peer_step_flops(model: ModelConfig, seq_len: int, batch_size: int, mask_rate: float = 0.15) -> float:
    """RoBERTa's MLM step on the main encoder's dimensions, LM head (dense H -> H, then H -> V) at the
    masked positions: the count `step_flops` gives our roberta_mlm baseline."""
    main = model.main
    return batch_size * 3 * (encoder_forward_flops(main, seq_len) + mlm_head_flops(main, mask_rate * seq_len))
