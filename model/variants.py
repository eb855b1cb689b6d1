"""The named variants and baselines of docs/method.md section 5, each an overlay on a size and the objective.

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
        Variant("all_token_lm", "Table 3 'All-Token LM Only': ELECTRA's All-Token MLM, LM on every position "
                "through the copy mixture, no explicit copy loss, no SCL ('Only' keeps one component)",
                objective={"lm_all_tokens": True, "use_copy_loss": False, "lm_stop_gradient": False,
                           "use_scl": False}),
        # Table 3's 'CLM Setup' rows: their RTE and MRPC (76.9 / 80.9, 89.5 / 90.0) track CLM Only (80.1,
        # 90.0), not COCO-LM (84.8, 91.4), and SCL is what moves those two tasks (section 5.4), so the
        # paper ran them on the CLM-only backbone: clm_*. The cocolm_* twins keep SCL, for the other reading.
        Variant("clm_no_copy", "Table 3 'CLM w/o. Copy' on the CLM-only backbone: LM at M with a plain "
                "softmax, the copy loss still trained, no SCL", objective={"lm_copy_mixture": False, "use_scl": False}),
        Variant("clm_no_stopgrad", "Table 3 'CLM w/o. Stop-grad' on the CLM-only backbone: the LM loss also "
                "moves the copy head, no SCL", objective={"lm_stop_gradient": False, "use_scl": False}),
        Variant("cocolm_no_copy", "'CLM w/o. Copy' with SCL kept", objective={"lm_copy_mixture": False}),
        Variant("cocolm_no_stopgrad", "'CLM w/o. Stop-grad' with SCL kept", objective={"lm_stop_gradient": False}),
        *(Variant(f"crop_{f}", f"COCO-LM with crop fraction {f}", data={"crop_fraction": float(f)})
          for f in ("0.7", "0.8", "0.9", "1.0")),
        Variant("roberta_mlm", "baseline (Table 1 RoBERTa): the main encoder trained by MLM on its 15% chosen "
                "positions read as 80% [MASK], 10% random, 10% unchanged; no auxiliary",
                objective={"replacement": "none", "use_copy_loss": False, "use_lm": False, "use_scl": False}),
        Variant("electra", "baseline (Table 1 ELECTRA): replaced-token detection with ELECTRA's auxiliary "
                "(full depth, 1/3 width) reading ELECTRA's generator input (85% of the chosen positions [MASK], "
                "15% unchanged), replacements sampled from its train-mode (dropout) logits, and ELECTRA's "
                "discriminator head (dense + GELU + dense(1)); dropout-free sampling is COCO-LM's change "
                "(section 3.3)", objective={**_RTD, "sample_in_eval": False, "electra_head": True,
                                            "aux_unchanged_fraction": 0.15},
                model=_ELECTRA_AUX),
    ]
}


def variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose one of {sorted(VARIANTS)}")
    return VARIANTS[name]
