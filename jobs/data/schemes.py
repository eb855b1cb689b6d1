"""The one loader of the tokenizer scheme a directory holds (`load_scheme`), and what the model reads for a
text (pair) under either. Which scheme it is (`scheme_of`) and the platform's scheme live in `jobs.data.tokens`,
which the pretraining stream's Ray Data workers import without sentencepiece.

- the platform's: `tokenizer.json`, written by `python -m jobs.data.tokenizer` (SentencePiece rebuilt as a
  fast tokenizer; [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4), encoded through `jobs.data.tokens`;
- the authors': `sp.model` + `dict.txt`, the released COCO-LM's and what `python -m model.convert
  --from-official` writes ([CLS]=0 [PAD]=1 [SEP]=2 [UNK]=3, [MASK] last), `jobs.data.official_tokenizer`.

Both lay a pair out `[CLS] a [SEP] [SEP] b [SEP]`. They differ in one tie: cutting a pair to length, the
platform drops from the first text when both are as long (jobs/finetuning/encoding.py), the authors'
code from the second; each scheme keeps its own rule.
"""

from __future__ import annotations

from pathlib import Path

from jobs.cli import UserError
from jobs.data.official_tokenizer import OfficialTokenizer
from jobs.data.tokens import DICTIONARY_FILE, MODEL_FILE, PlatformScheme, load_tokenizer, scheme_of

__all__ = ["PlatformScheme", "load_scheme", "platform_tokenizer_for", "scheme_of"]


def platform_tokenizer_for(directory: str | Path, purpose: str):
    """The platform tokenizer of `directory`, for a path that encodes with it alone: an authors' tokenizer
    there is one error line naming the path that does not take it yet, not a missing tokenizer.json."""
    if scheme_of(directory) == "official":
        raise UserError(f"{purpose} does not take the authors' tokenizer yet ({directory} holds {MODEL_FILE} + "
                        f"{DICTIONARY_FILE}): fine-tuning sweeps do (python -m jobs.finetuning)")
    return load_tokenizer(directory)


def load_scheme(directory: str | Path) -> PlatformScheme | OfficialTokenizer:
    """The tokenizer of `directory`, whichever scheme it holds."""
    return PlatformScheme(directory) if scheme_of(directory) == "platform" else OfficialTokenizer(directory)
