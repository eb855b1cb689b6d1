"""COCO-LM in pure PyTorch: encoders, heads, corruption maths and the pretraining objective.

Imports torch and the standard library only (transformers lazily, inside the export function; triton
where it is installed, for the fused attention kernel in model.kernels, which imports without it), so
it runs with plain python on a GPU machine that has no Ray or MLflow.
"""

from .attention import relative_position_bucket
from .config import SIZES, EncoderConfig, ModelConfig, ObjectiveConfig, model_size
from .corruption import BATCH_KEYS, SpecialTokens, make_pretraining_batch
from .encoder import Encoder
from .flops import flops_per_token, step_flops
from .objective import AuxiliaryModel, PretrainingObjective, PretrainingOutput, build_pretraining_model
from .variants import VARIANTS, Variant, variant

__all__ = [
    "BATCH_KEYS", "SIZES", "VARIANTS", "AuxiliaryModel", "Encoder", "EncoderConfig", "ModelConfig",
    "ObjectiveConfig", "PretrainingObjective", "PretrainingOutput", "SpecialTokens", "Variant",
    "build_pretraining_model", "flops_per_token", "make_pretraining_batch", "model_size",
    "relative_position_bucket", "step_flops", "variant",
]
