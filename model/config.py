"""Model sizes, objective settings (docs/method.md sections 2, 4 and 6) and a tokenizer's special ids, as
frozen dataclasses.

The jobs fill these from `platform/` YAML; `model/` itself only needs the dataclasses, so it runs
with plain torch on a GPU machine that has no YAML, Ray or MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True, kw_only=True)
class EncoderShape:
    """The fields every encoder is built from, declared once: `EncoderConfig` describes one encoder with
    them, `ModelConfig` the main encoder (its auxiliary derived from it), and the exported
    transformers config (`hf_configuration.COCOLMConfig`) takes exactly EncoderConfig's fields.
    Defaults are the base size."""

    vocab_size: int = 32768
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    ffn_size: int = 3072
    max_positions: int = 512
    relative_position: bool = True  # False for the no_rel_pos ablation
    rel_pos_buckets: int = 32
    rel_pos_max_distance: int = 128
    # False: bucket ids shifted by rel_pos_buckets // 2 - 1. True: shifted by minus the smallest id over the
    # max_positions x max_positions matrix, as the authors' released code does; the two differ only where
    # max_positions is too short to reach the farthest bucket (`model.attention.bucket_offset`).
    rel_pos_shift_by_min: bool = False
    dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 0
    # The token row that gets no gradient (nn.Embedding's padding_idx); None: every row trains. The authors'
    # released checkpoints set 0, their [CLS] row (their pad is 1): `model.convert` writes 0 for those.
    token_padding_idx: int | None = None
    # False: the paper's post-LN block. True: pre-LN (LN before each sublayer, one final LN), a recorded
    # departure for short studies only (docs/design.md section 5.4); every variant of a study gets it.
    pre_layer_norm: bool = False


@dataclass(frozen=True, kw_only=True)
class EncoderConfig(EncoderShape):
    """One Transformer encoder: the main encoder or the auxiliary model."""

    embedding_size: int = 768  # width of the shared token embeddings; != hidden_size only for electra_aux

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True, kw_only=True)
class ModelConfig(EncoderShape):
    """Main encoder plus auxiliary ("generator") model. The auxiliary shares width, FFN and heads
    with the main encoder unless `aux_width_divisor` shrinks it (ELECTRA's auxiliary)."""

    aux_layers: int | None = 4  # None: as deep as the main encoder (ELECTRA's auxiliary)
    aux_width_divisor: int = 1  # 3 gives ELECTRA's 1/3-width auxiliary, joined to the embeddings by a projection

    def __post_init__(self) -> None:
        for name, width, heads in (("main", self.hidden_size, self.num_heads), ("aux", *self._aux_width_heads())):
            if width % heads:
                raise ValueError(f"{name} hidden size {width} is not divisible by its {heads} heads")

    def _aux_width_heads(self) -> tuple[int, int]:
        """A narrower auxiliary keeps the main encoder's head width, rounded down to whole heads:
        base / 3 gives ELECTRA-base's generator (256 wide, 4 heads of 64); large++ / 3 gives 320."""
        head_dim = self.hidden_size // self.num_heads
        width = max(head_dim, self.hidden_size // self.aux_width_divisor // head_dim * head_dim)
        return width, width // head_dim

    def _encoder(self, **sizes: int) -> EncoderConfig:
        shape = {f.name: getattr(self, f.name) for f in fields(EncoderShape)}
        return EncoderConfig(**{**shape, "embedding_size": self.hidden_size, **sizes})

    @property
    def main(self) -> EncoderConfig:
        return self._encoder()

    @property
    def aux(self) -> EncoderConfig:
        width, heads = self._aux_width_heads()
        return self._encoder(
            hidden_size=width, num_heads=heads, ffn_size=self.ffn_size // self.aux_width_divisor,
            num_layers=self.num_layers if self.aux_layers is None else self.aux_layers,
        )


# Paper sizes (docs/method.md sections 2.5 and 6) plus two small ones for one GPU / a CPU and for tests.
SIZES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=4000, hidden_size=64, num_layers=2, num_heads=2, ffn_size=256, aux_layers=1),
    "small": ModelConfig(vocab_size=32768, hidden_size=256, num_layers=12, num_heads=4, ffn_size=1024, aux_layers=4),
    "base": ModelConfig(),
    "base++": ModelConfig(vocab_size=64000, rel_pos_buckets=64),
    "large++": ModelConfig(
        vocab_size=64000, hidden_size=1024, num_layers=24, num_heads=16, ffn_size=4096, aux_layers=6,
        rel_pos_buckets=128, rel_pos_max_distance=256,
    ),
}


def model_size(name: str, **overrides) -> ModelConfig:
    """A named size with field overrides; unknown names and fields are errors that name them."""
    if name not in SIZES:
        raise ValueError(f"unknown model size {name!r}; choose one of {sorted(SIZES)}")
    return replace(SIZES[name], **overrides)


@dataclass(frozen=True)
class ObjectiveConfig:
    """Which loss parts run and how they are weighted (docs/method.md sections 4-5). Variants overlay this."""

    aux_mlm_weight: float = 1.0
    copy_weight: float = 50.0  # lambda_copy
    lm_weight: float = 1.0
    scl_weight: float = 1.0
    scl_temperature: float = 1.0
    scl_gather: bool = False  # gather SCL vectors from all data-parallel workers for more negatives
    use_copy_loss: bool = True
    use_lm: bool = True
    use_scl: bool = True
    lm_copy_mixture: bool = True  # False: clm_no_copy, LM at M with a plain softmax
    lm_stop_gradient: bool = True  # False: clm_no_stopgrad, the LM loss also moves the copy head
    lm_all_tokens: bool = False  # True: all_token_lm, LM on every real position
    replacement: str = "auxiliary"  # auxiliary | random | none (roberta_mlm: the main encoder reads [MASK]s)
    sample_in_eval: bool = True  # dropout-free no-grad sampling pass; False (or no dropout) reuses the train pass
    freeze_aux: bool = False  # converged_aux: the auxiliary is loaded from a finished run and not trained
    electra_head: bool = False  # the electra baseline: ELECTRA's dense + GELU + dense(1) head as the copy head
    aux_unchanged_fraction: float = 0.0  # the electra baseline: 0.15 of the auxiliary's chosen inputs unmasked
    # Log the [CLS] cosines of the x_mlm and crop views (cls_positive_cosine, cls_negative_cosine) in every
    # variant that corrupts, SCL or not: paper Fig. 7a/b compares them with and without SCL. Variants
    # without SCL then encode the crop view once more, without gradient (about a sixth more compute), so
    # it is off unless a study asks for it; with SCL it is free.
    cls_cosines: bool = False
    # Variants without SCL encode the crop view for the cosines on every k-th training pass only: the
    # logged value is then the mean over a tenth of an interval's batches (study-cpu: 10), for a tenth
    # of the extra compute. Held-out passes always compute them.
    cls_cosines_every: int = 1

    def __post_init__(self) -> None:
        if self.replacement not in ("auxiliary", "random", "none"):
            raise ValueError(f"objective.replacement must be auxiliary, random or none, not {self.replacement!r}")
        if self.replacement != "none" and not (self.use_copy_loss or self.use_lm):
            raise ValueError("a replaced-token objective needs the copy loss or the LM loss")
        if self.cls_cosines_every < 1:
            raise ValueError(f"objective.cls_cosines_every must be at least 1, not {self.cls_cosines_every}")
        if not 0 <= self.aux_unchanged_fraction < 1:
            raise ValueError(f"objective.aux_unchanged_fraction must be in [0, 1), not {self.aux_unchanged_fraction}")
        if self.use_lm and self.lm_copy_mixture and self.lm_stop_gradient and not self.use_copy_loss:
            raise ValueError("with the copy mixture under stop-gradient and no copy loss, the copy head never learns")


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens of a tokenizer (`jobs.data.schemes`: `scheme.special_tokens`), and of the
    ids no regular piece stands for. The defaults are the platform tokenizer's, which writes them in this
    order; the authors' dictionary numbers [CLS]=0 [PAD]=1 [SEP]=2 [UNK]=3, [MASK] last."""

    pad: int = 0
    unk: int = 1
    cls: int = 2
    sep: int = 3
    mask: int = 4
    # Ids that are neither special nor a regular piece: the fairseq dictionary's madeupword fillers (it pads
    # the vocabulary to a multiple of 8 with them) and ids an overwrite left without a symbol. Never drawn.
    fillers: tuple[int, ...] = ()

    @property
    def never_drawn(self) -> tuple[int, ...]:
        """Every id a random replacement never takes, ascending: the specials and the fillers."""
        return tuple(sorted({self.pad, self.unk, self.cls, self.sep, self.mask, *self.fillers}))
