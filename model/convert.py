"""Convert the authors' released COCO-LM (`microsoft/cocolm-base`, `microsoft/cocolm-large`) into a platform
encoder directory, and back.

    python -m model.convert --from-official DIR --out OUT
    python -m model.convert --to-official DIR --out OUT

An authors' directory holds config.json (their field names), pytorch_model.bin or model.safetensors (their
bare model's keys, or their classifier's: `cocolm.*` and `classifier.*`), sp.model and dict.txt. The
platform directory is what `model.export.export_encoder` writes (config.json, model.safetensors, the code
and its manifest), so `model.classifier.load_encoder`, `model.export.load_export` and fine-tuning's
`--from` read it as any export; beside it: sp.model and dict.txt (the authors' tokenizer scheme,
`jobs.data.official_tokenizer`), `official.json` (their config as given, the weights' file, prefix and
dtype) and `official_heads.safetensors` (their SCL head and classifier, under their names), so that
`--to-official` gives back their tensors bit for bit.

As transformers' `convert_*_original_*_checkpoint_to_pytorch.py`: one mapping table (`MAPPING`), a shape
check per tensor, every source key used or named. Whatever cannot be converted (an unknown, missing or
mis-shaped key, a config field the platform cannot honour, a vocabulary that is not the dictionary's) is a
`ConversionError` naming it, raised before anything is written; the command prints it as one `error:` line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .attention import bucket_offset
from .classifier import encoder_config, load_encoder
from .config import EncoderConfig
from .encoder import Encoder
from .export import export_encoder
from .fairseq_dictionary import CLS, PAD, DictionaryError, read_dictionary

PREFIX = "cocolm."  # the authors' classifier keeps their model under this name
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # the first present is read
TOKENIZER_FILES = ("sp.model", "dict.txt")
OFFICIAL_JSON = "official.json"
OFFICIAL_HEADS = "official_heads.safetensors"
HEADS = ("scl_head.", "classifier.")  # the authors' tensors the platform encoder has no place for

# The authors' encoder key (without PREFIX) -> ours (an `Encoder` state dict key). {i}: the layer.
MAPPING = {
    "embeddings.word_embeddings.weight": "embeddings.tokens.weight",
    "embeddings.position_embeddings.weight": "embeddings.positions.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    "relative_attention_bias.weight": "relative_bias.table.weight",
    # q | k | v stacked in that order, heads in order inside each: our qkv's layout exactly
    "encoder.layer.{i}.attention.self_attn.in_proj.weight": "layers.{i}.attention.qkv.weight",
    "encoder.layer.{i}.attention.self_attn.in_proj.bias": "layers.{i}.attention.qkv.bias",
    "encoder.layer.{i}.attention.self_attn.out_proj.weight": "layers.{i}.attention.out.weight",
    "encoder.layer.{i}.attention.self_attn.out_proj.bias": "layers.{i}.attention.out.bias",
    "encoder.layer.{i}.attention.LayerNorm.weight": "layers.{i}.attention_norm.weight",
    "encoder.layer.{i}.attention.LayerNorm.bias": "layers.{i}.attention_norm.bias",
    "encoder.layer.{i}.intermediate.dense.weight": "layers.{i}.ffn.up.weight",
    "encoder.layer.{i}.intermediate.dense.bias": "layers.{i}.ffn.up.bias",
    "encoder.layer.{i}.output.dense.weight": "layers.{i}.ffn.down.weight",
    "encoder.layer.{i}.output.dense.bias": "layers.{i}.ffn.down.bias",
    "encoder.layer.{i}.output.LayerNorm.weight": "layers.{i}.ffn_norm.weight",
    "encoder.layer.{i}.output.LayerNorm.bias": "layers.{i}.ffn_norm.bias",
}

# The authors' config fields and their `COCOLMConfig` defaults (what a field left out of config.json means).
OFFICIAL_DEFAULTS = {
    "vocab_size": 30522, "embedding_size": 128, "hidden_size": 256, "num_hidden_layers": 12,
    "num_attention_heads": 4, "intermediate_size": 1024, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12, "summary_type": "first", "summary_use_proj": True,
    "summary_activation": "gelu", "summary_last_dropout": 0.1, "pad_token_id": 0, "rel_pos_bins": 0,
    "max_rel_pos": 0, "layer_norm_type": "post",
}
# Read elsewhere in their code, or nowhere in the forward pass: accepted and kept in official.json.
OFFICIAL_OTHER = {"need_pooler", "cls_dropout_prob", "num_labels", "fix_word_embedding", "num_ffn_layers",
                  "bos_token_id", "eos_token_id", "tokenizer_class"}
# transformers' own config.json keys (`PretrainedConfig().to_dict()`, 4.x and 5.x)
TRANSFORMERS_KEYS = {"_name_or_path", "architectures", "chunk_size_feed_forward", "dtype", "torch_dtype",
                     "id2label", "label2id", "is_encoder_decoder", "model_type", "output_attentions",
                     "output_hidden_states", "problem_type", "return_dict", "transformers_version",
                     "use_return_dict", "torchscript", "pruned_heads", "tie_word_embeddings", "auto_map"}


class ConversionError(ValueError):
    """What makes a directory unconvertible, naming the key, field or file."""


# ---------------------------------------------------------------- authors' directory -> platform


def platform_config(official: dict, vocab_size: int) -> EncoderConfig:
    """Our EncoderConfig for the authors' config.json (`official`, their defaults filled in), or a
    ConversionError naming the first field we cannot honour. `vocab_size`: the dictionary's."""
    unknown = sorted(set(official) - set(OFFICIAL_DEFAULTS) - OFFICIAL_OTHER - TRANSFORMERS_KEYS)
    if unknown:
        raise ConversionError(f"config.json: unknown field {unknown[0]!r}: not the authors' COCOLMConfig")
    c = {**OFFICIAL_DEFAULTS, **official}
    refuse = [
        ("layer_norm_type", c["layer_norm_type"] != "post", "only post-LN ('post') is implemented"),
        ("type_vocab_size", c["type_vocab_size"] != 0, "token type embeddings are not implemented (0 needed)"),
        ("hidden_act", c["hidden_act"] != "gelu", "the FFN's activation is the exact GELU ('gelu')"),
        ("num_ffn_layers", c.get("num_ffn_layers", 1) > 1, "one FFN per layer"),
        ("fix_word_embedding", bool(c.get("fix_word_embedding")), "the token embeddings always train"),
        ("rel_pos_bins", c["rel_pos_bins"] % 2 != 0, "an even number of buckets"),
        ("vocab_size", c["vocab_size"] != vocab_size,
         f"dict.txt gives {vocab_size} ids (4 specials, its symbols, [MASK])"),
    ]
    for field, bad, why in refuse:
        if bad:
            raise ConversionError(f"config.json: {field} = {c[field]!r} cannot be honoured: {why}")
    if c["hidden_size"] % c["num_attention_heads"]:
        raise ConversionError(f"config.json: hidden_size {c['hidden_size']} is not divisible by "
                              f"num_attention_heads {c['num_attention_heads']}")
    relative = c["rel_pos_bins"] > 0
    defaults = EncoderConfig()
    return EncoderConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], embedding_size=c["hidden_size"],
        num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"], ffn_size=c["intermediate_size"],
        max_positions=c["max_position_embeddings"], relative_position=relative,
        rel_pos_buckets=c["rel_pos_bins"] if relative else defaults.rel_pos_buckets,
        rel_pos_max_distance=c["max_rel_pos"] if relative else defaults.rel_pos_max_distance,
        rel_pos_shift_by_min=True, dropout=c["hidden_dropout_prob"],
        attention_dropout=c["attention_probs_dropout_prob"], layer_norm_eps=c["layer_norm_eps"],
        pad_token_id=PAD, token_padding_idx=CLS,
    )


def read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConversionError(f"{path} not found") from None
    except ValueError as error:
        raise ConversionError(f"{path}: not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ConversionError(f"{path}: not a JSON object")
    return value


def read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The state dict of an authors' directory (safetensors, or a pickle read with weights_only) and its file."""
    for name in WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            try:
                if name.endswith(".safetensors"):
                    return load_file(str(path)), name
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as error:  # noqa: BLE001 - a corrupt or unsafe file, whatever the cause
                raise ConversionError(f"{path}: cannot be read as weights ({type(error).__name__}: "
                                      f"{str(error).splitlines()[0] if str(error) else ''})") from None
            if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
                raise ConversionError(f"{path}: not a state dict of tensors")
            return state, name
    raise ConversionError(f"{directory}: no weights ({' or '.join(WEIGHT_FILES)})")


def expected_encoder_keys(cfg: EncoderConfig) -> dict[str, str]:
    """authors' key (no prefix) -> ours, for an encoder of this config."""
    keys = {}
    for theirs, ours in MAPPING.items():
        if "{i}" in theirs:
            keys |= {theirs.format(i=i): ours.format(i=i) for i in range(cfg.num_layers)}
        elif cfg.relative_position or not theirs.startswith("relative_attention_bias"):
            keys[theirs] = ours
    return keys


def split_layout(state: dict[str, torch.Tensor], weights: str) -> tuple[str, dict[str, torch.Tensor]]:
    """(prefix, the state without it): their classifier's layout (`cocolm.*` + `classifier.*`) or the bare model's."""
    prefixed = any(k.startswith(PREFIX) for k in state)
    if not prefixed:
        return "", dict(state)
    stray = sorted(k for k in state if not k.startswith((PREFIX, "classifier.")))
    if stray:
        raise ConversionError(f"{weights}: unknown key {stray[0]!r} beside the '{PREFIX}' keys")
    return PREFIX, {k.removeprefix(PREFIX) if k.startswith(PREFIX) else k: v for k, v in state.items()}


def head_shapes(official: dict, hidden: int) -> dict[str, tuple[int, ...]]:
    """The authors' head keys a checkpoint may hold, with their shapes (the classifier's rows: any)."""
    shapes = {"scl_head.dense.weight": (hidden, hidden), "scl_head.dense.bias": (hidden,),
              "scl_head.LayerNorm.weight": (hidden,), "scl_head.LayerNorm.bias": (hidden,),
              "classifier.dense.weight": (hidden, hidden), "classifier.dense.bias": (hidden,)}
    labels = official.get("num_labels", len(official.get("id2label", {})) or None)
    if labels:
        shapes |= {"classifier.out_proj.weight": (labels, hidden), "classifier.out_proj.bias": (labels,)}
    return shapes


def map_official(state: dict[str, torch.Tensor], cfg: EncoderConfig, official: dict, weights: str
                 ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(our encoder's state dict, the authors' heads) from their unprefixed state dict; every key used or named."""
    ours = Encoder(cfg).state_dict()
    mapping = expected_encoder_keys(cfg)
    heads = head_shapes(official, cfg.hidden_size)
    for key, tensor in state.items():
        if key in mapping:
            want = tuple(ours[mapping[key]].shape)
        elif key.startswith(HEADS):
            want = heads.get(key) or (None if key.startswith("classifier.out_proj.") else ())
            if want == ():
                raise ConversionError(f"{weights}: unknown key {key!r}")
        else:
            raise ConversionError(f"{weights}: unknown key {key!r}")
        if want is not None and tuple(tensor.shape) != want:
            raise ConversionError(f"{weights}: {key} has shape {list(tensor.shape)}, the config needs {list(want)}")
    missing = [k for k in mapping if k not in state]
    if official.get("need_pooler"):
        missing += [k for k in heads if k.startswith("scl_head.") and k not in state]
    present_heads = {k for k in state if k.startswith("classifier.")}
    if present_heads:
        missing += [k for k in ("classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight",
                                "classifier.out_proj.bias") if k not in present_heads]
    if missing:
        raise ConversionError(f"{weights}: missing key {missing[0]!r}")
    encoder = {mapping[k]: v for k, v in state.items() if k in mapping}
    return encoder, {k: v for k, v in state.items() if k.startswith(HEADS)}


def from_official(source: str | Path, out: str | Path) -> Path:
    """Convert the authors' directory `source` into a platform encoder directory `out` (created; must not
    exist, or be empty). Every check runs before anything is written."""
    source, out = Path(source), Path(out)
    check_out(out)
    if not source.is_dir():
        raise ConversionError(f"{source} is not a directory")
    official = read_json(source / "config.json")
    for name in TOKENIZER_FILES:
        if not (source / name).is_file():
            raise ConversionError(f"{source / name} not found: the authors' tokenizer needs {' and '.join(TOKENIZER_FILES)}")
    try:
        _, vocab_size = read_dictionary(source / "dict.txt")
    except DictionaryError as error:
        raise ConversionError(str(error)) from None
    cfg = platform_config(official, vocab_size)
    state, weights = read_weights(source)
    prefix, state = split_layout(state, weights)
    dtypes = {str(v.dtype).removeprefix("torch.") for v in state.values()}
    if len(dtypes) != 1 or not all(v.is_floating_point() for v in state.values()):
        raise ConversionError(f"{weights}: tensors of dtypes {sorted(dtypes)}; one floating dtype expected")
    encoder_state, heads = map_official(state, cfg, official, weights)
    encoder = Encoder(cfg)
    encoder.load_state_dict({k: v.float() for k, v in encoder_state.items()}, strict=True)
    record = {"config": official, "weights": weights, "prefix": prefix, "dtype": dtypes.pop(),
              "source": str(source.resolve())}

    def write(folder: Path) -> None:
        export_encoder(encoder, folder)
        for name in TOKENIZER_FILES:
            shutil.copy2(source / name, folder / name)
        (folder / OFFICIAL_JSON).write_text(json.dumps(record, indent=1) + "\n")
        if heads:
            save_file({k: v.contiguous() for k, v in heads.items()}, str(folder / OFFICIAL_HEADS))

    return write_atomically(out, write)


# ---------------------------------------------------------------- platform -> authors' directory


def official_config(cfg: EncoderConfig) -> dict:
    """The authors' config.json fields for our encoder (no record of an authors' original)."""
    return {
        "model_type": "cocolm", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.ffn_size, "hidden_act": "gelu", "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout, "max_position_embeddings": cfg.max_positions,
        "type_vocab_size": 0, "initializer_range": 0.02, "layer_norm_eps": cfg.layer_norm_eps,
        "rel_pos_bins": cfg.rel_pos_buckets if cfg.relative_position else 0,
        "max_rel_pos": cfg.rel_pos_max_distance if cfg.relative_position else 0,
        "layer_norm_type": "post", "need_pooler": False,
    }


def to_official(source: str | Path, out: str | Path) -> Path:
    """Write the platform encoder directory `source` (ours, or one `from_official` wrote) as an authors'
    directory `out`: their config.json, weights in their layout, and their tokenizer files when it has them."""
    source, out = Path(source), Path(out)
    check_out(out)
    if not (source / "model.safetensors").is_file():
        raise ConversionError(f"{source}: not a platform encoder directory (no model.safetensors)")
    try:
        cfg = encoder_config(read_json(source / "config.json"))
        encoder = load_encoder(source)
    except (ValueError, RuntimeError, TypeError) as error:
        raise ConversionError(f"{source}: {str(error).splitlines()[0]}") from None
    if cfg.pre_layer_norm:
        raise ConversionError("config.json: pre_layer_norm = true cannot be written: the authors' 'pre' "
                              "layout differs (its final LayerNorm's eps is fixed at 1e-5, named otherwise)")
    if cfg.embedding_size != cfg.hidden_size:
        raise ConversionError(f"config.json: embedding_size {cfg.embedding_size} != hidden_size "
                              f"{cfg.hidden_size}: the authors' model has no embedding projection")
    record = read_json(source / OFFICIAL_JSON) if (source / OFFICIAL_JSON).is_file() else {}
    ours = encoder.state_dict()
    if cfg.relative_position and not cfg.rel_pos_shift_by_min:
        # their id = ours - offset: row r of their table is our row r + offset (the rows rolled past the end are unused)
        offset = bucket_offset(cfg.rel_pos_buckets, cfg.rel_pos_max_distance, cfg.max_positions)
        ours["relative_bias.table.weight"] = ours["relative_bias.table.weight"].roll(-offset, 0)
    dtype = getattr(torch, record.get("dtype", "float32"))
    prefix = record.get("prefix", PREFIX)
    state = {prefix + theirs: ours[key].to(dtype) for theirs, key in expected_encoder_keys(cfg).items()}
    heads = load_file(str(source / OFFICIAL_HEADS)) if (source / OFFICIAL_HEADS).is_file() else {}
    state |= {(k if k.startswith("classifier.") else prefix + k): v for k, v in heads.items()}
    config = record.get("config") or official_config(cfg)
    weights = record.get("weights", "pytorch_model.bin")
    tokenizer = [name for name in TOKENIZER_FILES if (source / name).is_file()]

    def write(folder: Path) -> None:
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if weights.endswith(".safetensors"):
            save_file({k: v.contiguous() for k, v in state.items()}, str(folder / weights))
        else:
            torch.save(state, folder / weights)
        for name in tokenizer:
            shutil.copy2(source / name, folder / name)

    written = write_atomically(out, write)
    if len(tokenizer) < len(TOKENIZER_FILES):
        print(f"note: {source} has no authors' tokenizer ({' and '.join(TOKENIZER_FILES)}); wrote the model only")
    return written


# ---------------------------------------------------------------- shared


def is_official(directory: str | Path) -> bool:
    """Whether `directory` looks like an authors' checkpoint: their config field names, their tokenizer files."""
    folder = Path(directory)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict) and "num_hidden_layers" in config
            and all((folder / name).is_file() for name in TOKENIZER_FILES))


def content_key(directory: str | Path) -> str:
    """sha256 (16 hex digits) of what a conversion reads: a converted directory can be reused by this key."""
    folder, digest = Path(directory), hashlib.sha256()
    for name in ("config.json", *WEIGHT_FILES, *TOKENIZER_FILES):
        if (folder / name).is_file():
            digest.update(name.encode() + b"\0")
            with open(folder / name, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConversionError(f"{out} exists and is not an empty directory: choose a new --out")


def write_atomically(out: Path, write) -> Path:
    """`write(folder)` into a temporary folder beside `out`, then renamed to `out`: never half a directory."""
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(folder)
        if out.exists():
            out.rmdir()
        folder.rename(out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.convert", description=__doc__.split("\n\n")[0])
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument("--from-official", metavar="DIR", help="an authors' checkpoint directory")
    direction.add_argument("--to-official", metavar="DIR", help="a platform encoder directory")
    parser.add_argument("--out", required=True, metavar="OUT", help="the directory to create")
    args = parser.parse_args(argv)
    try:
        if args.from_official:
            out = from_official(args.from_official, args.out)
        else:
            out = to_official(args.to_official, args.out)
    except ConversionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
