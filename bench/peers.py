"""The transformers peers the benchmark times beside our step: ELECTRA's pretraining step (generator
and discriminator) and RoBERTa's MLM step, with our preset's dimensions, built from configs (no download)."""

from __future__ import annotations

import torch
import transformers
from torch import nn

from model.config import EncoderConfig, ModelConfig
from model.corruption import sample_replacements
from model.flops import electra_peer_step_flops, roberta_peer_step_flops
from model.losses import mlm_loss
from model.objective import step_inputs, take

PEERS = ("hf-electra", "hf-roberta")
RTD_WEIGHT = 50.0  # ELECTRA's discriminator loss weight (lambda in the ELECTRA paper)


class ElectraPeer(nn.Module):
    """transformers' ELECTRA pretraining step. The generator's MLM head runs at the masked positions
    only, as ELECTRA's own code does (ElectraForMaskedLM.forward would project all T positions);
    replacements are sampled from its train-mode logits (detached), as ELECTRA does. Positions are
    selected the way ours are (the host-side index, then gathers), so the comparison is of the models,
    not of how often the glue code makes the host wait."""

    def __init__(self, generator: nn.Module, discriminator: nn.Module):
        super().__init__()
        self.generator = generator  # ElectraForMaskedLM
        self.discriminator = discriminator  # ElectraForPreTraining
        # ELECTRA shares the whole embedding block (tokens, positions, token types, LayerNorm), and the
        # generator's output projection is tied to the token embeddings.
        generator.electra.embeddings = discriminator.electra.embeddings
        generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight

    def layers(self) -> list[nn.Module]:
        return [*self.generator.electra.encoder.layer, *self.discriminator.electra.encoder.layer]

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x_orig, real = batch["input_ids"], batch["attention_mask"].long()
        index, _ = step_inputs(batch)
        targets = take(x_orig, index)  # (N,)
        h = self.generator.electra(batch["masked_ids"], attention_mask=real).last_hidden_state  # (B, T, H_gen)
        logits = self.generator.generator_lm_head(self.generator.generator_predictions(take(h, index)))  # (N, V)
        with torch.no_grad():
            corrupted = x_orig.flatten().index_copy(0, index, sample_replacements(logits)).view_as(x_orig)
        replaced = (corrupted != x_orig).long()  # ELECTRA's label: 1 = replaced
        rtd = self.discriminator(corrupted, attention_mask=real, labels=replaced).loss
        return mlm_loss(logits, targets) + RTD_WEIGHT * rtd


class RobertaPeer(nn.Module):
    """transformers' RoBERTa MLM step, LM head at the masked positions only (as fairseq's RoBERTa does;
    RobertaForMaskedLM.forward would project all T positions), selected as ours are."""

    def __init__(self, mlm: nn.Module):
        super().__init__()
        self.mlm = mlm  # RobertaForMaskedLM

    def layers(self) -> list[nn.Module]:
        return list(self.mlm.roberta.encoder.layer)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        index, _ = step_inputs(batch)
        h = self.mlm.roberta(batch["masked_ids"], attention_mask=batch["attention_mask"].long()).last_hidden_state
        logits = self.mlm.lm_head(take(h, index))  # (N, V)
        return mlm_loss(logits, take(batch["input_ids"], index))


def _hf_dims(cfg: EncoderConfig) -> dict:
    """transformers config fields shared by ELECTRA and RoBERTa, from one of our encoders."""
    return dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_size, hidden_act="gelu",
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
        layer_norm_eps=cfg.layer_norm_eps, pad_token_id=cfg.pad_token_id, attn_implementation="sdpa",
    )


def build_peer(name: str, model_cfg: ModelConfig) -> ElectraPeer | RobertaPeer:
    """A peer with our preset's dimensions, random weights, built from configs (no download)."""
    if name == "hf-electra":
        def electra(cfg: EncoderConfig) -> transformers.ElectraConfig:
            return transformers.ElectraConfig(
                embedding_size=cfg.embedding_size, max_position_embeddings=cfg.max_positions, **_hf_dims(cfg)
            )
        return ElectraPeer(
            transformers.ElectraForMaskedLM(electra(model_cfg.aux)),
            transformers.ElectraForPreTraining(electra(model_cfg.main)),
        )
    if name == "hf-roberta":
        main = model_cfg.main
        # RoBERTa numbers positions from pad_token_id + 1, so its table needs pad_token_id + 1 more rows.
        config = transformers.RobertaConfig(
            max_position_embeddings=main.max_positions + main.pad_token_id + 1, type_vocab_size=1, **_hf_dims(main)
        )
        return RobertaPeer(transformers.RobertaForMaskedLM(config))
    raise ValueError(f"unknown peer {name!r}; choose one of {PEERS}")


def peer_step_flops(name: str, model_cfg: ModelConfig, seq_len: int, batch: int, mask_rate: float = 0.15) -> float:
    count = electra_peer_step_flops if name == "hf-electra" else roberta_peer_step_flops
    return count(model_cfg, seq_len, batch, mask_rate)
