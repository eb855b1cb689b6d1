"""Where the LayerNorms sit: the paper's post-LN block, and the pre-LN option a short study may record
(model.config.EncoderShape.pre_layer_norm), each against a written-out computation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model import Encoder, EncoderConfig
from model.classifier import load_encoder
from model.export import export_encoder


def _config(pre: bool) -> EncoderConfig:
    return EncoderConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, ffn_size=32, embedding_size=16,
                         max_positions=16, relative_position=False, dropout=0.0, attention_dropout=0.0,
                         pre_layer_norm=pre)


def _attention(layer, x: torch.Tensor) -> torch.Tensor:
    """Multi-head self-attention written out (no padding, no relative bias)."""
    att = layer.attention
    b, t, h = x.shape
    heads = att.num_heads
    q, k, v = att.qkv(x).view(b, t, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
    weights = torch.softmax(q @ k.transpose(-1, -2) / (h // heads) ** 0.5, dim=-1)
    return att.out((weights @ v).transpose(1, 2).reshape(b, t, h))


def _ffn(layer, x: torch.Tensor) -> torch.Tensor:
    return layer.ffn.down(F.gelu(layer.ffn.up(x)))


def _by_hand(encoder: Encoder, ids: torch.Tensor, pre: bool) -> torch.Tensor:
    emb = encoder.embeddings
    x = emb.norm(emb.tokens(ids) + emb.positions(torch.arange(ids.shape[1]))[None])
    for layer in encoder.layers:
        if pre:
            x = x + _attention(layer, layer.attention_norm(x))
            x = x + _ffn(layer, layer.ffn_norm(x))
        else:
            x = layer.attention_norm(x + _attention(layer, x))
            x = layer.ffn_norm(x + _ffn(layer, x))
    return encoder.final_norm(x) if pre else x


def test_post_ln_is_the_default_and_has_no_final_norm():
    assert EncoderConfig().pre_layer_norm is False
    assert Encoder(_config(False)).final_norm is None


def test_each_placement_equals_its_written_out_block():
    ids = torch.randint(5, 50, (3, 9))
    for pre in (False, True):
        torch.manual_seed(0)
        encoder = Encoder(_config(pre)).eval()
        for p in encoder.parameters():  # move LayerNorms off their identity init so placement matters
            p.data.add_(0.1 * torch.randn_like(p))
        encoder.set_attention("reference")
        torch.testing.assert_close(encoder(ids), _by_hand(encoder, ids, pre), rtol=1e-5, atol=1e-5)


def test_the_two_placements_differ_and_the_export_keeps_the_choice(tmp_path):
    torch.manual_seed(0)
    pre = Encoder(_config(True)).eval()
    post = Encoder(_config(False)).eval()
    post.load_state_dict({k: v for k, v in pre.state_dict().items() if not k.startswith("final_norm")})
    ids = torch.randint(5, 50, (2, 7))
    assert not torch.allclose(pre(ids), post(ids))
    loaded = load_encoder(export_encoder(pre, tmp_path / "pre")).eval()
    assert loaded.cfg.pre_layer_norm and loaded.final_norm is not None
    torch.testing.assert_close(loaded(ids), pre(ids))
