"""A trained tokenizer, loaded for encoding: the one loader the stream and the fine-tuning tasks share.

Only `tokenizers`: no Ray, MLflow or transformers, so a fine-tuning trial stays light.
"""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import Tokenizer


def load_tokenizer(tokenizer_dir: str | Path) -> Tokenizer:
    """The `tokenizers` object inside a saved fast tokenizer (what the stream encodes with)."""
    return tokenizer_from_json((Path(tokenizer_dir) / "tokenizer.json").read_text(encoding="utf-8"))


@functools.cache
def tokenizer_from_json(spec: str) -> Tokenizer:
    """Once per worker process. Encoding with `tokenizers` directly skips transformers' per-call
    overhead; `encode_special_tokens` makes a literal "[SEP]" in a document plain text, so
    [CLS]/[SEP]/[MASK] ids come only from packing and masking."""
    tokenizer = Tokenizer.from_str(spec)
    tokenizer.encode_special_tokens = True
    return tokenizer
