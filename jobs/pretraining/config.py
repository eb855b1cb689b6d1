"""Resolved run configuration: a preset from `platform/presets/`, a variant, then `--set` overrides.

One frozen dataclass per concept (model, objective, data, train, cluster). Every key is checked
against the dataclass it lands in, so a typo is an error that names it instead of a silent default.
The paper's variants are defined once, in `model/variants.py` (the Ray-free GPU benchmark selects
them there too, and model/ reads no YAML); a user's own variants are YAML overlays in
`platform/variants/`, each optionally extending a built-in one. Presets are YAML because they are
what users copy and edit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from model import VARIANTS, ModelConfig, ObjectiveConfig, model_size, variant
from model.step import OptimizerConfig

from jobs.data.config import DataConfig


PLATFORM = Path(__file__).resolve().parents[2] / "platform"
PRESETS = PLATFORM / "presets"
VARIANT_FILES = PLATFORM / "variants"


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and bookkeeping (docs/method.md section 6; defaults are the paper's base setting)."""

    max_steps: int = 125_000
    peak_lr: float = 5e-4
    warmup_steps: int = 10_000
    global_batch: int = 2048  # sequences per optimizer step over all workers; gradient accumulation of
    #                           data.batch_size-sequence micro-batches makes up the rest
    weight_decay: float = 0.01  # not on biases and LayerNorms
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-6
    clip_norm: float = 2.0
    position_bias_lr_scale: float = 1.0  # model.step.OptimizerConfig: the relative bias tables' lr multiple
    bf16: bool = True  # autocast on GPU; CPU runs fp32
    compile: bool = True  # torch.compile each Transformer layer (model.encoder.compile_encoders); the tiny
    #                       preset turns it off: on 2 CPU cores it gains nothing (`model.bench --compile`)
    seed: int = 0
    log_every: int = 100
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    max_failures: int = 3  # worker-group restarts from the last checkpoint before the run fails
    aux_checkpoint: str = ""  # converged_aux: checkpoint dir of a finished run to take the auxiliary from

    def optimizer(self) -> OptimizerConfig:
        """The fields the shared training step (`model.step`) needs."""
        return OptimizerConfig(**{f.name: getattr(self, f.name) for f in fields(OptimizerConfig)})


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
            raise ValueError(f"cluster.placement_strategy must be one of {PLACEMENT_STRATEGIES}, "
                             f"not {self.placement_strategy!r}")
        if not 0 <= self.min_workers <= self.workers:
            raise ValueError(f"cluster.min_workers={self.min_workers} must be between 0 and cluster.workers={self.workers}")

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

    def __post_init__(self) -> None:
        """Every world size the run may take (elastic runs shrink and grow) keeps the global batch:
        only the gradient accumulation changes, so a lost node does not change the recipe."""
        for workers in self.cluster.worker_counts():
            if self.train.global_batch % (self.data.batch_size * workers):
                raise ValueError(f"train.global_batch={self.train.global_batch} is not a multiple of data.batch_size x "
                                 f"workers = {self.data.batch_size} x {workers}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Dotted keys, as MLflow params and as `--set` takes them."""
        out: dict[str, Any] = {"preset": self.preset, "variant": self.variant}
        for section in SECTIONS:
            for key, value in dataclasses.asdict(getattr(self, section)).items():
                out[f"{section}.{key}"] = value
        return out

    def digest(self) -> str:
        """Stable short hash of everything that shapes the run (names its Ray run and checkpoints)."""
        return hashlib.sha256(json.dumps(self.flat(), sort_keys=True, default=str).encode()).hexdigest()[:10]


SECTIONS = {"model": ModelConfig, "objective": ObjectiveConfig, "data": DataConfig, "train": TrainConfig,
            "cluster": ClusterConfig}


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def load_preset(name: str) -> dict[str, dict[str, Any]]:
    path = PRESETS / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r}: no {path}; available: {available_presets()}")
    raw = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {unknown}; sections are {sorted(SECTIONS)}")
    return {section: dict(raw.get(section) or {}) for section in SECTIONS}


def available_variants() -> list[str]:
    return sorted(VARIANTS) + sorted(p.stem for p in VARIANT_FILES.glob("*.yaml"))


def variant_overlays(name: str) -> dict[str, dict[str, Any]]:
    """A built-in variant's overlays, or a YAML variant's on top of the built-in it `extends`."""
    if name in VARIANTS:
        chosen = variant(name)
        return {section: dict(getattr(chosen, section, {})) for section in SECTIONS}
    path = VARIANT_FILES / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown variant {name!r}; choose one of {available_variants()}")
    raw = yaml.safe_load(path.read_text()) or {}
    base = raw.pop("extends", "cocolm")
    if base not in VARIANTS:
        raise ValueError(f"{path}: extends {base!r}, which is not a built-in variant ({sorted(VARIANTS)})")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {unknown}; sections are {sorted(SECTIONS)} and 'extends'")
    inherited = variant_overlays(base)
    return {section: {**inherited[section], **(raw.get(section) or {})} for section in SECTIONS}


def parse_overrides(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """`section.key=value` pairs (values read as YAML) -> {section: {key: value}}."""
    out: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        section, dot, field_name = key.strip().partition(".")
        if not sep or not dot:
            raise ValueError(f"--set {pair!r}: expected section.key=value, e.g. train.max_steps=40")
        if section not in SECTIONS:
            raise ValueError(f"--set {pair!r}: unknown section {section!r}; sections are {sorted(SECTIONS)}")
        try:
            out[section][field_name] = yaml.safe_load(value)
        except yaml.YAMLError as error:
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise ValueError(f"--set {key.strip()}: cannot read the value {value!r} ({problem}); values are YAML, "
                             f"e.g. {key.strip()}=40, =true, =[1, 2] or ='a string'") from None
    return out


def _coerce(cls: type, section: str, values: dict[str, Any]) -> dict[str, Any]:
    """Check keys against the dataclass and coerce YAML scalars to the field's type (YAML reads 1e-3 as a string)."""
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown config key(s) {[f'{section}.{k}' for k in unknown]}; "
                         f"known {section} keys: {sorted(known)}")
    out = {}
    for key, value in values.items():
        default = known[key].default
        if isinstance(default, tuple) and isinstance(value, list):
            value = tuple(value)  # frozen configs hold tuples; YAML and JSON give lists
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{section}.{key} must be true or false, not {value!r}")
        elif isinstance(default, (int, float)) and value is not None:
            try:
                value = type(default)(float(value)) if isinstance(default, int) else float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{section}.{key} must be a number, not {value!r}") from None
        out[key] = value
    return out


def resolve(preset: str, variant_name: str = "cocolm", overrides: list[str] | None = None) -> PretrainConfig:
    """Preset, then the variant's overlays, then the user's overrides: the user has the last word."""
    layers = load_preset(preset)
    overlays = variant_overlays(variant_name)
    set_by_user = parse_overrides(overrides or [])
    merged = {section: {**layers[section], **overlays[section], **set_by_user[section]} for section in SECTIONS}
    size = merged["model"].pop("size", preset)
    model_cfg = model_size(size, **_coerce(ModelConfig, "model", merged["model"]))
    sections = {name: cls(**_coerce(cls, name, merged[name])) for name, cls in SECTIONS.items() if name != "model"}
    return PretrainConfig(preset=preset, variant=variant_name, model=model_cfg, **sections)


def with_vocab_size(cfg: PretrainConfig, vocab_size: int) -> PretrainConfig:
    """The tokenizer decides the vocabulary: the model's embedding table follows it."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab_size))


def to_yaml(cfg: PretrainConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def from_yaml(text: str) -> PretrainConfig:
    """A resolved config back from `to_yaml` (a checkpoint's config.yaml) into the same dataclasses,
    every key checked as `resolve` checks them: `from_yaml(to_yaml(cfg)) == cfg`."""
    raw = yaml.safe_load(text)
    unknown = sorted(set(raw) - {"preset", "variant", *SECTIONS})
    if unknown:
        raise ValueError(f"unknown config section(s) {unknown}; known: preset, variant, {', '.join(SECTIONS)}")
    sections = {name: cls(**_coerce(cls, name, raw.get(name) or {})) for name, cls in SECTIONS.items()}
    return PretrainConfig(preset=raw["preset"], variant=raw["variant"], **sections)
