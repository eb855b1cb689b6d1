"""`model.convert` against the authors' own outputs (tests/fixtures/official-cocolm, see its README): the
converted encoder's hidden states, SCL head and classifier logits, the relative-position bucket ids, the
round trip authors -> platform -> authors, and one `error:` line for each input it cannot convert.

Every exactness check is also run on a deliberately mis-mapped checkpoint (`MUTATIONS`) and must fail
there: a check that cannot see one tensor mapped wrongly proves nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model.attention import RelativePositionBias
from model.classifier import ClassificationHead, load_encoder
from model.convert import OFFICIAL_HEADS, from_official, main, to_official
from model.export import load_export
from model.heads import SCLHead

FIXTURE = Path(__file__).parent / "fixtures" / "official-cocolm"
TOLERANCE = 1e-5  # the authors' own rows, padded or not, differ by up to 7.2e-7
MAPPED_WRONG = 1e-2  # the smallest named mis-mapping moves an output by 0.58 (fixture README)


def outputs() -> dict[str, torch.Tensor]:
    return torch.load(FIXTURE / "outputs.pt", map_location="cpu", weights_only=True)


def authors_dir(tmp: Path, layout: str = "classifier", mutate=None) -> Path:
    """An authors' directory in one of their layouts: 'classifier' (cocolm.* + classifier.*), 'bare'
    (no prefix, no classifier) or 'safetensors' (the classifier's keys as model.safetensors)."""
    folder = tmp / f"authors-{layout}"
    folder.mkdir()
    for name in ("config.json", "sp.model", "dict.txt"):
        shutil.copy(FIXTURE / name, folder / name)
    source = "pytorch_model_base.bin" if layout == "bare" else "pytorch_model.bin"
    state = torch.load(FIXTURE / source, map_location="cpu", weights_only=True)
    if mutate is not None:
        mutate(state, "" if layout == "bare" else "cocolm.")
    if layout == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(state, folder / "pytorch_model.bin")
    return folder


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("convert")
    return from_official(authors_dir(tmp), tmp / "platform")


def hidden_error(platform_dir: Path) -> float:
    """max |ours - theirs| of the last hidden state over the real positions of the fixture's batch."""
    o = outputs()
    encoder = load_encoder(platform_dir).eval()
    with torch.no_grad():
        hidden = encoder(o["input_ids"], o["attention_mask"].bool())
    real = o["attention_mask"].bool()
    return (hidden - o["last_hidden_state"])[real].abs().max().item()


def scl_error(platform_dir: Path) -> float:
    """The authors' SCL head (dense, GELU, LayerNorm on [CLS]) in our `SCLHead`, against their pooled output."""
    o, heads = outputs(), load_file(str(platform_dir / OFFICIAL_HEADS))
    encoder = load_encoder(platform_dir).eval()
    head = SCLHead(encoder.cfg.hidden_size, encoder.cfg.layer_norm_eps)
    head.load_state_dict({"dense.weight": heads["scl_head.dense.weight"], "dense.bias": heads["scl_head.dense.bias"],
                          "norm.weight": heads["scl_head.LayerNorm.weight"], "norm.bias": heads["scl_head.LayerNorm.bias"]})
    with torch.no_grad():
        pooled = head(encoder(o["input_ids"], o["attention_mask"].bool())[:, 0])
    return (pooled - o["pooled_output"]).abs().max().item()


def logits_error(platform_dir: Path) -> float:
    """The authors' classifier in our `ClassificationHead` with GELU, against their logits."""
    o, heads = outputs(), load_file(str(platform_dir / OFFICIAL_HEADS))
    encoder = load_encoder(platform_dir).eval()
    head = ClassificationHead(encoder.cfg.hidden_size, heads["classifier.out_proj.bias"].numel(), 0.1, "gelu").eval()
    head.load_state_dict({"dense.weight": heads["classifier.dense.weight"], "dense.bias": heads["classifier.dense.bias"],
                          "out.weight": heads["classifier.out_proj.weight"], "out.bias": heads["classifier.out_proj.bias"]})
    with torch.no_grad():
        logits = head(encoder(o["input_ids"], o["attention_mask"].bool())[:, 0])
    return (logits - o["logits"]).abs().max().item()


def bucket_ids(platform_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Our bucket id of every (query, key) pair at max_positions, read through the converted encoder's own
    `RelativePositionBias` (a table whose every head holds the row number): (T, T) from its (T, T) lookup
    and from its per-distance one (what the Triton kernel reads)."""
    cfg = load_encoder(platform_dir).cfg
    bias = RelativePositionBias(cfg)
    with torch.no_grad():
        bias.table.weight.copy_(torch.arange(cfg.rel_pos_buckets, dtype=torch.float)[:, None].expand(-1, cfg.num_heads))
        lookup = bias(cfg.max_positions)[0, 0].long()  # (T, T)
        by_distance = bias.by_distance(cfg.max_positions)[0].long()  # (2S + 1,): distance -S .. S
    positions = torch.arange(cfg.max_positions)
    distance = (positions[None, :] - positions[:, None]).clamp(-bias.saturation, bias.saturation)
    return lookup, by_distance[distance + min(bias.saturation, cfg.max_positions - 1)]


# ---------------------------------------------------------------- exact on the fixture


@pytest.mark.parametrize("layout", ["classifier", "bare", "safetensors"])
def test_the_converted_encoder_gives_the_authors_last_hidden_state_at_every_real_position(tmp_path, layout):
    platform = from_official(authors_dir(tmp_path, layout), tmp_path / "platform")
    assert hidden_error(platform) < TOLERANCE


def test_the_authors_scl_head_and_classifier_give_their_outputs_on_the_converted_encoder(converted):
    assert scl_error(converted) < TOLERANCE
    assert logits_error(converted) < TOLERANCE


def test_the_converted_encoder_keeps_the_authors_token_row_and_padding(converted):
    cfg = load_encoder(converted).cfg
    assert (cfg.pad_token_id, cfg.token_padding_idx, cfg.rel_pos_shift_by_min) == (1, 0, True)
    assert load_encoder(converted).embeddings.tokens.padding_idx == 0  # no gradient to [CLS], as theirs


def test_the_relative_position_buckets_are_the_authors_id_for_id(converted):
    lookup, by_distance = bucket_ids(converted)
    assert torch.equal(lookup, outputs()["rp_bucket"])
    assert torch.equal(by_distance, outputs()["rp_bucket"])


def test_transformers_loads_the_converted_directory_as_an_export_with_the_same_output(converted):
    o = outputs()
    model = load_export(converted).eval()
    with torch.no_grad():
        hidden = model(input_ids=o["input_ids"], attention_mask=o["attention_mask"]).last_hidden_state
    real = o["attention_mask"].bool()
    assert (hidden - o["last_hidden_state"])[real].abs().max().item() < TOLERANCE


@pytest.mark.parametrize("layout", ["classifier", "bare", "safetensors"])
def test_authors_to_platform_to_authors_gives_their_tensors_bit_for_bit(tmp_path, layout):
    source = authors_dir(tmp_path, layout)
    back = to_official(from_official(source, tmp_path / "platform"), tmp_path / "back")
    if layout == "safetensors":
        theirs, again = load_file(str(source / "model.safetensors")), load_file(str(back / "model.safetensors"))
    else:
        theirs = torch.load(source / "pytorch_model.bin", map_location="cpu", weights_only=True)
        again = torch.load(back / "pytorch_model.bin", map_location="cpu", weights_only=True)
    assert sorted(again) == sorted(theirs)
    for key, tensor in theirs.items():
        assert again[key].dtype == tensor.dtype and torch.equal(again[key], tensor), key
    assert json.loads((back / "config.json").read_text()) == json.loads((source / "config.json").read_text())
    for name in ("sp.model", "dict.txt"):
        assert (back / name).read_bytes() == (source / name).read_bytes()


def test_our_own_encoder_written_in_the_authors_layout_reloads_equal(tmp_path):
    """A platform encoder of ours (shift by half - 1, 16 positions: ids differ from the authors' by 3) goes
    out with its bias table rolled, and comes back in as the same function."""
    from model import Encoder, EncoderConfig
    from model.export import export_encoder

    cfg = EncoderConfig(vocab_size=417, hidden_size=32, embedding_size=32, num_layers=1, num_heads=4, ffn_size=64,
                        max_positions=16)
    torch.manual_seed(0)
    ours = Encoder(cfg).eval()
    export_encoder(ours, tmp_path / "ours")
    back = to_official(tmp_path / "ours", tmp_path / "authors")
    for name in ("sp.model", "dict.txt"):  # the model alone is written; a dictionary lets it come back in
        shutil.copy(FIXTURE / name, back / name)
    again = load_encoder(from_official(back, tmp_path / "again")).eval()
    ids = torch.randint(4, 417, (2, 16))
    with torch.no_grad():
        assert (again(ids) - ours(ids)).abs().max().item() < TOLERANCE


# ---------------------------------------------------------------- the checks see one tensor mapped wrongly


def swap_qk(state, prefix, layer=0, part="weight"):
    key = f"{prefix}encoder.layer.{layer}.attention.self_attn.in_proj.{part}"
    q, k, v = state[key].chunk(3)
    state[key] = torch.cat([k, q, v])


def swap_layer_norm(state, prefix, name="encoder.layer.0.attention.LayerNorm"):
    state[f"{prefix}{name}.weight"], state[f"{prefix}{name}.bias"] = (state[f"{prefix}{name}.bias"].clone(),
                                                                      state[f"{prefix}{name}.weight"].clone())


def transpose(state, prefix, name="encoder.layer.1.attention.self_attn.out_proj.weight"):
    state[prefix + name] = state[prefix + name].t().contiguous()


def roll_bias_heads(state, prefix):
    state[prefix + "relative_attention_bias.weight"] = state[prefix + "relative_attention_bias.weight"].roll(1, 1)


def positions_from_two(state, prefix):
    state[prefix + "embeddings.position_embeddings.weight"] = state[prefix + "embeddings.position_embeddings.weight"].roll(-2, 0)


MUTATIONS = {
    "layer0 in_proj.weight q<->k": swap_qk,
    "layer1 in_proj.bias q<->k": lambda s, p: swap_qk(s, p, 1, "bias"),
    "layer0 attention LayerNorm weight<->bias": swap_layer_norm,
    "layer1 out_proj.weight transposed": transpose,
    "relative_attention_bias heads rolled": roll_bias_heads,
    "positions from 2": positions_from_two,
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_hidden_state_check_fails_when_one_tensor_is_mapped_wrong(tmp_path, mutation):
    platform = from_official(authors_dir(tmp_path, mutate=MUTATIONS[mutation]), tmp_path / "platform")
    assert hidden_error(platform) > MAPPED_WRONG


def test_the_head_checks_fail_when_a_head_tensor_is_mapped_wrong(tmp_path):
    scl = from_official(authors_dir(tmp_path, mutate=lambda s, p: swap_layer_norm(s, p, "scl_head.LayerNorm")),
                        tmp_path / "scl")
    assert hidden_error(scl) < TOLERANCE and scl_error(scl) > MAPPED_WRONG
    (tmp_path / "c").mkdir()
    classifier = from_official(authors_dir(tmp_path / "c", mutate=lambda s, p: transpose(s, "", "classifier.dense.weight")),
                               tmp_path / "classifier")
    assert logits_error(classifier) > MAPPED_WRONG


def test_the_bucket_check_fails_with_our_own_shift(converted, tmp_path):
    """Our default shift (half - 1 = 15 instead of their 14 at 64 positions) is one id off everywhere."""
    shutil.copytree(converted, tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    (tmp_path / "ours" / "config.json").write_text(json.dumps({**config, "rel_pos_shift_by_min": False}))
    lookup, _ = bucket_ids(tmp_path / "ours")
    assert torch.equal(lookup, outputs()["rp_bucket"] + 1)
    assert hidden_error(tmp_path / "ours") > MAPPED_WRONG


def test_the_round_trip_check_sees_a_changed_tensor(tmp_path):
    """The platform directory's weights changed by one row: the written-back tensor differs."""
    source = authors_dir(tmp_path)
    platform = from_official(source, tmp_path / "platform")
    weights = load_file(str(platform / "model.safetensors"))
    key = "encoder.layers.1.ffn.down.bias"
    save_file({**weights, key: weights[key].roll(1, 0).contiguous()}, str(platform / "model.safetensors"),
              metadata={"format": "pt"})
    back = torch.load(to_official(platform, tmp_path / "back") / "pytorch_model.bin", weights_only=True)
    theirs = torch.load(source / "pytorch_model.bin", weights_only=True)
    changed = [k for k in theirs if not torch.equal(theirs[k], back[k])]
    assert changed == ["cocolm.encoder.layer.1.output.dense.bias"]


# ---------------------------------------------------------------- one error line, nothing written


def edit_config(**fields):
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return edit


def edit_weights(change):
    def edit(folder: Path) -> None:
        state = torch.load(folder / "pytorch_model.bin", weights_only=True)
        change(state)
        torch.save(state, folder / "pytorch_model.bin")
    return edit


def add_dictionary_line(folder: Path) -> None:
    with open(folder / "dict.txt", "a", encoding="utf-8") as f:
        f.write("extra 1\n")


BAD_INPUTS = {
    "unknown key": (edit_weights(lambda s: s.update({"cocolm.pooler.dense.weight": torch.zeros(32, 32)})),
                    "unknown key 'pooler.dense.weight'"),
    "missing key": (edit_weights(lambda s: s.pop("cocolm.encoder.layer.1.output.LayerNorm.bias")),
                    "missing key 'encoder.layer.1.output.LayerNorm.bias'"),
    "mis-shaped key": (edit_weights(lambda s: s.update({"cocolm.relative_attention_bias.weight": torch.zeros(32, 8)})),
                       "relative_attention_bias.weight has shape [32, 8], the config needs [32, 4]"),
    "pre-LN": (edit_config(layer_norm_type="pre"), "layer_norm_type = 'pre' cannot be honoured"),
    "token types": (edit_config(type_vocab_size=2), "type_vocab_size = 2 cannot be honoured"),
    "vocabulary": (add_dictionary_line, "vocab_size = 417 cannot be honoured: dict.txt gives 418 ids"),
    "unknown field": (edit_config(pre_norm=True), "unknown field 'pre_norm'"),
    "no dictionary": (lambda folder: (folder / "dict.txt").unlink(), "dict.txt not found"),
    "pickled object": (lambda folder: torch.save({"w": object()}, folder / "pytorch_model.bin"),
                       "cannot be read as weights"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_an_input_that_cannot_be_converted_is_one_error_line_before_anything_is_written(tmp_path, capsys, case):
    edit, message = BAD_INPUTS[case]
    source = authors_dir(tmp_path)
    edit(source)
    assert main(["--from-official", str(source), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["authors-classifier"]  # no temporary folder left


def test_writing_the_authors_layout_refuses_what_it_cannot_express(tmp_path, capsys):
    from model import Encoder, EncoderConfig
    from model.export import export_encoder

    cfg = EncoderConfig(vocab_size=50, hidden_size=16, embedding_size=16, num_layers=1, num_heads=2, ffn_size=32,
                        max_positions=16, pre_layer_norm=True)
    export_encoder(Encoder(cfg), tmp_path / "pre")
    assert main(["--to-official", str(tmp_path / "pre"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: config.json: pre_layer_norm"), err
    assert not (tmp_path / "out").exists()
