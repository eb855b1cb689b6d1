"""The named variants and baselines of SPEC section 4, each an overlay on a size and the objective.

An ablation study is a list of these names. `data` overlays are fields of the stream's config
(the crop fraction), applied by the jobs; `model` and `objective` overlays are applied here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .config import ModelConfig, ObjectiveConfig


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    objective: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    def apply(self, model: ModelConfig, objective: ObjectiveConfig) -> tuple[ModelConfig, ObjectiveConfig]:
        return replace(model, **self.model), replace(objective, **self.objective)


_RTD = {"use_lm": False, "use_scl": False}
_ELECTRA_AUX = {"aux_layers": None, "aux_width_divisor": 3}

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant("cocolm", "COCO-LM: auxiliary MLM + corrective LM (copy + LM) + SCL"),
        Variant("rtd_only", "ELECTRA's objective: copy (replaced-token) head only, no LM, no SCL", objective=_RTD),
        Variant("clm_only", "COCO-LM without SCL", objective={"use_scl": False}),
        Variant("scl_rtd", "SCL with the copy head, no LM head", objective={"use_lm": False}),
        Variant("no_rel_pos", "COCO-LM without the relative position bias", model={"relative_position": False}),
        Variant("electra_aux", "ELECTRA's auxiliary: full depth, 1/3 width, embeddings through a projection",
                model=_ELECTRA_AUX),
        Variant("random_replace", "Table 3 'w. Random Replacements': uniform random regular tokens instead of "
                "auxiliary samples", objective={"replacement": "random"}),
        Variant("converged_aux", "auxiliary loaded from a finished run and frozen (the job loads it)",
                objective={"freeze_aux": True}),
        Variant("all_token_lm", "ELECTRA's All-Token MLM: LM on every position through the copy mixture, "
                "no explicit copy loss", objective={"lm_all_tokens": True, "use_copy_loss": False,
                                                    "lm_stop_gradient": False}),
        Variant("clm_no_copy", "LM at M with a plain softmax; the copy loss still trained",
                objective={"lm_copy_mixture": False}),
        Variant("clm_no_stopgrad", "the LM loss also moves the copy head", objective={"lm_stop_gradient": False}),
        *(Variant(f"crop_{f}", f"COCO-LM with crop fraction {f}", data={"crop_fraction": float(f)})
          for f in ("0.7", "0.8", "0.9", "1.0")),
        Variant("roberta_mlm", "baseline (Table 1 RoBERTa): the main encoder trained by MLM on its 15% chosen "
                "positions read as 80% [MASK], 10% random, 10% unchanged; no auxiliary",
                objective={"replacement": "none", "use_copy_loss": False, "use_lm": False, "use_scl": False}),
        Variant("electra", "baseline: rtd_only with ELECTRA's auxiliary", objective=_RTD, model=_ELECTRA_AUX),
    ]
}


def variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose one of {sorted(VARIANTS)}")
    return VARIANTS[name]
