"""The one loader of the tokenizer scheme a directory holds (`load_scheme`), and what the model reads for a
text (pair) under either. Which scheme it is (`scheme_of`), what every scheme gives the paths that encode
(`Scheme`) and the platform's scheme live in `jobs.data.tokens`, which the pretraining stream's Ray Data
workers import without sentencepiece.

- the platform's: `tokenizer.json`, written by `python -m jobs.data.tokenizer` (SentencePiece rebuilt as a
  fast tokenizer; [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4), encoded through `jobs.data.tokens`;
- the authors': `sp.model` + `dict.txt`, the released COCO-LM's and what `python -m model.convert
  --from-official` writes ([CLS]=0 [PAD]=1 [SEP]=2 [UNK]=3, [MASK] last), `jobs.data.official_tokenizer`.

Both lay a pair out `[CLS] a [SEP] [SEP] b [SEP]`. They differ in one tie: cutting a pair to length, the
platform drops from the first text when both are as long, the authors' code from the second; each scheme
keeps its own rule (`Scheme.tie_cuts_first`). Every path that encodes (fine-tuning and SQuAD's windows,
few-shot prompts, the [CLS] readouts and probes, pretraining's stream) takes either through `Scheme`.
"""

from __future__ import annotations

from pathlib import Path

from jobs.data.official_tokenizer import OfficialTokenizer
from jobs.data.tokens import PlatformScheme, Scheme, scheme_of

__all__ = ["PlatformScheme", "Scheme", "load_scheme", "scheme_of"]


def load_scheme(directory: str | Path) -> Scheme:
    """The tokenizer of `directory`, whichever scheme it holds."""
    return PlatformScheme(directory) if scheme_of(directory) == "platform" else OfficialTokenizer(directory)
