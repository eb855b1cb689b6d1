"""The one loader that decides which tokenizer scheme a directory holds, and what the model reads for a
text (pair) under either.

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
from jobs.data.official_tokenizer import DICTIONARY_FILE, MODEL_FILE, OfficialTokenizer
from jobs.data.tokens import load_tokenizer

PLATFORM_FILE = "tokenizer.json"


class PlatformScheme:
    """A platform tokenizer directory, with the layout the fine-tuning tasks feed the model."""

    name = "platform"

    def __init__(self, directory: str | Path):
        self.tokenizer = load_tokenizer(directory)
        special = {t: self.tokenizer.token_to_id(t) for t in ("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]")}
        if None in special.values():
            raise UserError(f"{directory}: the tokenizer lacks {[t for t, i in special.items() if i is None]}")
        self.cls_id, self.pad_id, self.sep_id, self.unk_id, self.mask_id = special.values()
        self.vocab_size = self.tokenizer.get_vocab_size()

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode(self, text: str, pair: str | None = None, max_length: int = 512) -> list[int]:
        a = self.ids(text)
        if pair is None:
            return [self.cls_id, *a[: max(max_length - 2, 0)], self.sep_id]
        b = self.ids(pair)
        while len(a) + len(b) > max_length - 4 and (a or b):
            (a if len(a) >= len(b) else b).pop()
        return [self.cls_id, *a, self.sep_id, self.sep_id, *b, self.sep_id]


def scheme_of(directory: str | Path) -> str:
    """'platform' or 'official', from the files `directory` holds; a UserError naming them otherwise."""
    folder = Path(directory)
    platform = (folder / PLATFORM_FILE).is_file()
    official = (folder / MODEL_FILE).is_file() and (folder / DICTIONARY_FILE).is_file()
    if platform and official:
        raise UserError(f"{folder} holds both a platform tokenizer ({PLATFORM_FILE}) and the authors' "
                        f"({MODEL_FILE} + {DICTIONARY_FILE}): keep one")
    if not (platform or official):
        raise UserError(f"{folder} holds no tokenizer: neither {PLATFORM_FILE} (the platform's) nor "
                        f"{MODEL_FILE} + {DICTIONARY_FILE} (the authors')")
    return "platform" if platform else "official"


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
