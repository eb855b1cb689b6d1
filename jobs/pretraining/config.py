"""Resolved run configuration: a preset from `platform/presets/`, a variant, then `--set` overrides.

One frozen dataclass per concept (model, objective, data, train, cluster). Every key is checked
against the dataclass it lands in, so a typo is an error that names it instead of a silent default.
The paper's variants are defined once, in `model/variants.py` (the Ray-free GPU benchmark selects
them there too, and model/ reads no YAML); a user's own variants are YAML overlays in
`platform/variants/`, each optionally extending a built-in one. Presets are YAML because they are
what users copy and edit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from model import VARIANTS, ModelConfig, ObjectiveConfig, model_size, variant
from model.step import OptimizerConfig

from jobs.cli import (AT_LEAST_ONE, NON_NEGATIVE, OPEN_FRACTION, POSITIVE, PROBABILITY, Range, UserError, check_name,
                      redact, short_repr)
from jobs.config_reader import NoAliasLoader, load_yaml, read_yaml, typed

from jobs.data.config import DataConfig


PLATFORM = Path(__file__).resolve().parents[2] / "platform"
PRESETS = PLATFORM / "presets"
VARIANT_FILES = PLATFORM / "variants"


@dataclass(frozen=True)
class TrainConfig(OptimizerConfig):
    """Optimisation and bookkeeping (docs/method.md section 6; defaults are the paper's base setting).
    The optimizer's fields (peak_lr, warmup_steps, max_steps, adamw.*, clip_norm, position_bias_lr_scale)
    are model.step.OptimizerConfig's, declared there once, so the Ray-free bench times this recipe."""

    global_batch: int = 2048  # sequences per optimizer step over all workers; gradient accumulation of
    #                           data.batch_size-sequence micro-batches makes up the rest
    bf16: bool = True  # autocast on GPU; CPU runs fp32 unless bf16_on_cpu
    bf16_on_cpu: bool = False  # autocast to bf16 on a CPU as well, where it multiplies bf16 natively: a study-cpu
    #                            step 1.5x faster with AVX512-BF16 (`python -m bench --cpu-bf16`); a CPU without it
    #                            runs fp32 all the same (model.step.step_precision: emulated bf16 is ~10x slower);
    #                            off by default, as CPU tests compare fp32 numbers
    compile: bool = True  # torch.compile each Transformer layer (model.encoder.compile_encoders); the tiny
    #                       preset turns it off: on 2 CPU cores it gains nothing (`python -m bench --compile`)
    seed: int = 0
    long_steps: int = 0  # the last this many steps train on blocks of data.long_seq_len (0: none)
    log_every: int = 100
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    max_failures: int = 3  # worker-group restarts from the last checkpoint before the run fails
    aux_checkpoint: str = ""  # converged_aux: checkpoint dir of a finished run to take the auxiliary from
    fixed_shapes: bool = False  # pad the masked-position index to a fixed count per batch
    #                             (model.corruption.prediction_slots), so every step has the same shapes
    compile_step: str = "off"  # off | default | reduce-overhead (CUDA graphs): torch.compile the whole step
    #                            as one graph (model.step.compile_step); needs fixed_shapes, replaces `compile`


@dataclass(frozen=True)
class ClusterConfig:
    """Ray Train scaling. CPUs per worker are fractional so Ray Data keeps a CPU budget (docs/design.md section 4)."""

    workers: int = 1
    min_workers: int = 0  # elastic when 0 < min_workers < workers: after a node is lost Ray Train restarts
    #                       with as many workers as the cluster still fits (at least min_workers), and
    #                       grows back to `workers` when nodes join; 0 = always exactly `workers`
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 0.5
    placement_strategy: str = "PACK"  # Ray placement of the workers: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD

    def __post_init__(self) -> None:
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise UserError(f"cluster.placement_strategy must be one of {PLACEMENT_STRATEGIES}, "
                             f"not {self.placement_strategy!r}")
        if not 0 <= self.min_workers <= self.workers:
            raise UserError(f"cluster.min_workers={self.min_workers} must be between 0 and cluster.workers={self.workers}")

    def worker_counts(self) -> range:
        """Every world size the run may train with."""
        return range(self.min_workers or self.workers, self.workers + 1)


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True)
class PretrainConfig:
    preset: str
    variant: str
    model: ModelConfig
    objective: ObjectiveConfig
    data: DataConfig
    train: TrainConfig
    cluster: ClusterConfig
    # Where the main encoder's weights came from (`--init-from`: a directory, a hub id or a run id), "" for a
    # fresh initialisation. A setting like the preset: two sources of one shape are two runs, not one resumed.
    init_from: str = ""

    def __post_init__(self) -> None:
        """Every world size the run may take (elastic runs shrink and grow) keeps the global batch:
        only the gradient accumulation changes, so a lost node does not change the recipe."""
        for workers in self.cluster.worker_counts():
            if self.train.global_batch % (self.data.batch_size * workers):
                raise UserError(f"train.global_batch={self.train.global_batch} is not a multiple of data.batch_size x "
                                 f"workers = {self.data.batch_size} x {workers}")
        self._check_long_phase()

    def _check_long_phase(self) -> None:
        """data.long_seq_len and train.long_steps go together: a tail of steps on longer blocks, within the run
        and within the position table."""
        long_len, steps, t = self.data.long_seq_len, self.train.long_steps, self.train
        if bool(long_len) != bool(steps):
            raise UserError(f"data.long_seq_len={long_len} and train.long_steps={steps} go together: set both "
                            "(the last long_steps steps on blocks of long_seq_len) or neither")
        if not steps:
            return
        if not self.data.seq_len < long_len <= self.model.max_positions:
            raise UserError(f"data.long_seq_len={long_len} must be longer than data.seq_len={self.data.seq_len} "
                            f"and at most model.max_positions={self.model.max_positions}")
        if steps >= t.max_steps:
            raise UserError(f"train.long_steps={steps} must be fewer than train.max_steps={t.max_steps}: "
                            "set data.seq_len instead to train every step on one length")

    @property
    def long_from(self) -> int:
        """The optimizer steps done when the long phase starts (max_steps: no long phase)."""
        return self.train.max_steps - self.train.long_steps

    def seq_len_at(self, done: int) -> int:
        """The block length of the optimizer step after `done` steps."""
        return self.data.long_seq_len if self.train.long_steps and done >= self.long_from else self.data.seq_len

    def tokens_left(self, done: int) -> int:
        """Tokens of the steps after `done` steps, the long phase's counted at its length."""
        long = self.train.max_steps - max(done, self.long_from)
        short = max(0, self.long_from - done)
        return self.train.global_batch * (short * self.data.seq_len + long * self.data.long_seq_len)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def redacted(self) -> PretrainConfig:
        """This config as it may be shown or stored (params, config.yaml, checkpoints): corpus URIs and the
        source a run started from without the credentials in them (jobs.cli.redact)."""
        return dataclasses.replace(self, data=dataclasses.replace(self.data, paths=tuple(map(redact, self.data.paths))),
                                   init_from=redact(self.init_from))

    def flat(self) -> dict[str, Any]:
        """Dotted keys, as MLflow params and as `--set` takes them; corpus URIs redacted."""
        shown = self.redacted()
        out: dict[str, Any] = {"preset": self.preset, "variant": self.variant}
        if self.init_from:  # only where set: a fresh run's params, and so its name's hash, stay what they were
            out["init_from"] = shown.init_from
        for section in SECTIONS:
            out.update(_dotted(section, dataclasses.asdict(getattr(shown, section))))
        return out

    def digest(self) -> str:
        """Stable short hash of everything that shapes the run (names its Ray run and checkpoints)."""
        return hashlib.sha256(json.dumps(self.flat(), sort_keys=True, default=str).encode()).hexdigest()[:10]


def _dotted(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    """{"adamw": {"eps": 1e-6}} under "train" -> {"train.adamw.eps": 1e-6}: nested configs as flat keys."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        out.update(_dotted(f"{prefix}.{key}", value) if isinstance(value, dict) else {f"{prefix}.{key}": value})
    return out


SECTIONS = {"model": ModelConfig, "objective": ObjectiveConfig, "data": DataConfig, "train": TrainConfig,
            "cluster": ClusterConfig}
VARIANTS_SECTION = "variants"  # a preset's word on single variants (`load_preset`)


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def load_preset(name: str) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
    """A preset's sections, and its word on single variants: `variants:`, then a variant's name and sections
    of keys. A recipe can need one variant set otherwise (the study-cpu preset: electra without ELECTRA's
    discriminator head), and a variant's own overlays come after the preset's sections, so that word is
    applied after them (`resolve`)."""
    path = PRESETS / f"{check_name('preset', name)}.yaml"
    if not path.is_file():
        raise UserError(f"unknown preset {name!r}: no {path}; available: {available_presets()}")
    raw = _mapping(path, read_yaml(path))
    for_variants = raw.pop(VARIANTS_SECTION, None) or {}
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise UserError(f"{path}: unknown section(s) {unknown}; sections are {sorted(SECTIONS)} and "
                        f"'{VARIANTS_SECTION}'")
    return {section: dict(raw.get(section) or {}) for section in SECTIONS}, _preset_variants(path, for_variants)


def _preset_variants(path: Path, raw: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """A preset's `variants:` section, checked: known variant names, each with known sections of keys."""
    unknown = sorted(set(raw) - set(available_variants()))
    if unknown:
        raise UserError(f"{path}: {VARIANTS_SECTION}: unknown variant(s) {unknown}; choose from {available_variants()}")
    out = {}
    for name, sections in raw.items():
        sections = _mapping(path, sections)
        unknown = sorted(set(sections) - set(SECTIONS))
        if unknown:
            raise UserError(f"{path}: {VARIANTS_SECTION}: {name}: unknown section(s) {unknown}; "
                            f"sections are {sorted(SECTIONS)}")
        out[name] = {section: dict(sections.get(section) or {}) for section in SECTIONS}
    return out


def available_variants() -> list[str]:
    return sorted(VARIANTS) + sorted(p.stem for p in VARIANT_FILES.glob("*.yaml"))


def variant_overlays(name: str) -> dict[str, dict[str, Any]]:
    """A built-in variant's overlays, or a YAML variant's on top of the built-in it `extends`."""
    if name in VARIANTS:
        chosen = variant(name)
        return {section: dict(getattr(chosen, section, {})) for section in SECTIONS}
    path = VARIANT_FILES / f"{check_name('variant', name)}.yaml"
    if not path.is_file():
        raise UserError(f"unknown variant {name!r}; choose one of {available_variants()}")
    raw = _mapping(path, read_yaml(path), scalars=("extends",))
    base = raw.pop("extends", "cocolm")
    if base not in VARIANTS:
        raise UserError(f"{path}: extends {base!r}, which is not a built-in variant ({sorted(VARIANTS)})")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise UserError(f"{path}: unknown section(s) {unknown}; sections are {sorted(SECTIONS)} and 'extends'")
    inherited = variant_overlays(base)
    return {section: {**inherited[section], **(raw.get(section) or {})} for section in SECTIONS}


def _mapping(path: Path, raw: Any, scalars: tuple[str, ...] = ()) -> dict[str, Any]:
    """A preset's or variant's top level: sections, each a mapping of keys (and the plain values named
    in `scalars`, such as a variant's `extends`)."""
    raw = raw or {}
    if not isinstance(raw, dict) or any(v is not None and not isinstance(v, dict)
                                        for k, v in raw.items() if k not in scalars):
        raise UserError(f"{path}: expected sections of keys (e.g. 'train:' then indented 'max_steps: 40'), "
                        f"found {short_repr(raw, 80)}")
    return dict(raw)


def parse_overrides(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """`section.key=value` pairs (values read as YAML) -> {section: {key: value}}."""
    out: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        section, dot, field_name = key.strip().partition(".")
        if not sep or not dot:
            raise UserError(f"--set {pair!r}: expected section.key=value, e.g. train.max_steps=40")
        if section not in SECTIONS:
            raise UserError(f"--set {pair!r}: unknown section {section!r}; sections are {sorted(SECTIONS)}")
        try:
            out[section][field_name] = yaml.load(value, Loader=NoAliasLoader)
        except yaml.YAMLError as error:
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise UserError(f"--set {key.strip()}: cannot read the value {value!r} ({problem}); values are YAML, "
                             f"e.g. {key.strip()}=40, =true, =[1, 2] or ='a string'") from None
    return out


# Keys that moved, with where they live now: an old preset or --set gets one line naming the new key, and
# an old checkpoint's config.yaml loads (`_migrated`).
RENAMED = {f"train.{old}": f"train.adamw.{new}" for old, new in
           (("weight_decay", "weight_decay"), ("adam_beta1", "beta1"), ("adam_beta2", "beta2"), ("adam_eps", "eps"))}


def resolve(preset: str, variant_name: str = "cocolm", overrides: list[str] | None = None, init_from: str = "",
            shape: dict[str, Any] | None = None) -> PretrainConfig:
    """Preset, then the variant's overlays, then the preset's word on this variant (its `variants:`
    section), then the user's overrides: the user has the last word. A run started from a checkpoint
    (`init_from`) takes that checkpoint's `shape` (model fields) in place of the preset's size."""
    if init_from and shape is None:
        raise ValueError("a run started from a checkpoint takes its shape and tokenizer: resolve its config with "
                         "jobs.pretraining.job.init_config")
    layers, for_variants = load_preset(preset)
    overlays = variant_overlays(variant_name)
    recipe = for_variants.get(variant_name, {})
    set_by_user = parse_overrides(overrides or [])
    merged = {section: {**layers[section], **overlays[section], **recipe.get(section, {}), **set_by_user[section]}
              for section in SECTIONS}
    if "vocab_size" in merged["model"]:
        raise UserError("model.vocab_size is not set by hand: the model's vocabulary is the tokenizer's; set "
                         "data.vocab_size (the size of the tokenizer trained when data.tokenizer_dir is not given)")
    size = merged["model"].pop("size", preset)
    given = {name: typed(cls, merged[name], name, ranges_of(name), renamed=RENAMED) for name, cls in SECTIONS.items()}
    model_keys = on_shape(given.pop("model"), shape or {}, init_from)
    with _config_errors():
        model_cfg = model_size(size, **model_keys)
        cfg = PretrainConfig(preset=preset, variant=variant_name, model=model_cfg, init_from=init_from,
                             **{name: SECTIONS[name](**values) for name, values in given.items()})
    return with_vocab_size(cfg, cfg.data.vocab_size)


def on_shape(given: dict[str, Any], shape: dict[str, Any], source: str) -> dict[str, Any]:
    """The model keys a preset, variant or --set gave, with a checkpoint's shape in place of the size's: a
    key given otherwise than the checkpoint has would not fit its weights, so it is one line naming both."""
    for key, value in shape.items():
        if key in given and given[key] != value:
            raise UserError(f"model.{key}={given[key]} (from the preset, the variant or --set) conflicts with "
                            f"--init-from {redact(source)}, whose encoder has {key}={value}: the run takes the "
                            f"checkpoint's shape, so leave model.{key} out or start from another checkpoint")
    return {**given, **shape}


@contextlib.contextmanager
def _config_errors():
    """model/ (Ray-free, no jobs import) says what is wrong with a config as a ValueError; built from a
    user's preset and --set, it is the user's to fix."""
    try:
        yield
    except UserError:
        raise
    except ValueError as error:
        raise UserError(str(error)) from error


# The allowed range of every numeric key. Checked before Ray starts, so `--workers 0` or
# `train.max_steps=-5` is one line naming the key, not a failure deep inside a worker.
# tests/test_pretrain.py checks that every numeric key has an entry.
RANGES: dict[str, Range] = {
    **{f"model.{k}": AT_LEAST_ONE for k in ("vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_size",
                                             "max_positions", "rel_pos_buckets", "rel_pos_max_distance",
                                             "aux_layers", "aux_width_divisor")},
    "model.dropout": PROBABILITY, "model.attention_dropout": PROBABILITY, "model.layer_norm_eps": POSITIVE,
    "model.pad_token_id": NON_NEGATIVE,
    **{f"objective.{k}": NON_NEGATIVE for k in ("aux_mlm_weight", "copy_weight", "lm_weight", "scl_weight")},
    "objective.scl_temperature": POSITIVE, "objective.aux_unchanged_fraction": PROBABILITY,
    "objective.cls_cosines_every": AT_LEAST_ONE,
    "data.vocab_size": AT_LEAST_ONE, "data.seq_len": Range(2), "data.long_seq_len": NON_NEGATIVE,
    "data.mask_rate": OPEN_FRACTION,
    "data.crop_fraction": OPEN_FRACTION, "data.max_record_chars": AT_LEAST_ONE, "data.seed": NON_NEGATIVE,
    "data.pack_batch_docs": AT_LEAST_ONE, "data.batch_size": AT_LEAST_ONE, "data.shuffle_buffer": NON_NEGATIVE,
    "data.data_cpus": POSITIVE, "data.block_bytes": AT_LEAST_ONE,
    "train.peak_lr": POSITIVE, "train.warmup_steps": NON_NEGATIVE, "train.max_steps": AT_LEAST_ONE,
    "train.adamw.weight_decay": NON_NEGATIVE, "train.adamw.beta1": PROBABILITY, "train.adamw.beta2": PROBABILITY,
    "train.adamw.eps": POSITIVE, "train.clip_norm": POSITIVE, "train.position_bias_lr_scale": POSITIVE,
    "train.global_batch": AT_LEAST_ONE, "train.seed": NON_NEGATIVE, "train.long_steps": NON_NEGATIVE,
    "train.log_every": AT_LEAST_ONE,
    "train.checkpoint_every": AT_LEAST_ONE, "train.keep_checkpoints": AT_LEAST_ONE,
    "train.max_failures": NON_NEGATIVE,
    "cluster.workers": AT_LEAST_ONE, "cluster.min_workers": NON_NEGATIVE, "cluster.gpus_per_worker": NON_NEGATIVE,
    "cluster.cpus_per_worker": POSITIVE,
}


def ranges_of(section: str) -> dict[str, Range]:
    """RANGES of one section, by the key below it (`adamw.eps` for train.adamw.eps), as `typed` takes them."""
    return {key.split(".", 1)[1]: bounds for key, bounds in RANGES.items() if key.startswith(f"{section}.")}


def with_vocab_size(cfg: PretrainConfig, vocab_size: int) -> PretrainConfig:
    """One vocabulary size: the tokenizer's. The model's embedding table follows it, and data.vocab_size
    says it too, so a run's params never name two sizes."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab_size),
                               data=dataclasses.replace(cfg.data, vocab_size=vocab_size))


def to_yaml(cfg: PretrainConfig) -> str:
    """The config.yaml of a run and its checkpoints, corpus URIs redacted."""
    return yaml.safe_dump(cfg.redacted().to_dict(), sort_keys=False)


def from_yaml(text: str) -> PretrainConfig:
    """A resolved config back from `to_yaml` (a checkpoint's config.yaml) into the same dataclasses,
    every key checked as `resolve` checks them: `from_yaml(to_yaml(cfg)) == cfg`."""
    return from_dict(load_yaml(text, "config.yaml"))


def from_dict(raw: dict[str, Any]) -> PretrainConfig:
    """A resolved config back from its plain data (`PretrainConfig.to_dict`, a parsed config.yaml), every
    key checked as `resolve` checks them: `from_dict(cfg.to_dict()) == cfg`."""
    unknown = sorted(set(raw) - {"preset", "variant", "init_from", *SECTIONS})
    if unknown:
        raise UserError(f"unknown config section(s) {unknown}; known: preset, variant, init_from, {', '.join(SECTIONS)}")
    sections = {name: cls(**typed(cls, _migrated(name, raw.get(name) or {}), name, ranges_of(name), "config.yaml"))
                for name, cls in SECTIONS.items()}
    return PretrainConfig(preset=raw["preset"], variant=raw["variant"], init_from=raw.get("init_from") or "",
                          **sections)


def _migrated(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint written before a key moved (RENAMED) still loads: its keys go where they live now."""
    out = {}
    for key, value in values.items():
        out[RENAMED.get(f"{section}.{key}", f"{section}.{key}").split(".", 1)[1]] = value
    return out
