"""COCO-LM in pure PyTorch: encoders, heads, corruption maths and the pretraining objective.

Imports torch and the standard library only (transformers lazily, inside the export function; triton
where it is installed, for the fused attention kernel in model.kernels, which imports without it), so
it runs with plain python on a GPU machine that has no Ray or MLflow.

The names below load with their module on first use (PEP 562), so that `model.config` (the shapes and a
tokenizer's special ids) imports without torch: Ray Data's workers unpickle a tokenizer scheme holding
`SpecialTokens`, and torch cost each of them 2 s (jobs.data.packing).
"""

from __future__ import annotations

import importlib

# Each exported name -> the module that defines it.
_HOMES = {
    "relative_position_bucket": "attention",
    **dict.fromkeys(("SIZES", "EncoderConfig", "ModelConfig", "ObjectiveConfig", "SpecialTokens", "model_size"),
                    "config"),
    **dict.fromkeys(("BATCH_KEYS", "make_pretraining_batch"), "corruption"),
    "Encoder": "encoder",
    **dict.fromkeys(("flops_per_token", "step_flops"), "flops"),
    **dict.fromkeys(("AuxiliaryModel", "PretrainingObjective", "PretrainingOutput", "build_pretraining_model"),
                    "objective"),
    **dict.fromkeys(("VARIANTS", "Variant", "variant"), "variants"),
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value
    return value
