"""A trained tokenizer, loaded for encoding: the one loader the stream and the fine-tuning tasks share; what
every tokenizer scheme gives the paths that encode (`Scheme`), the platform's scheme, and which scheme a
directory holds (`jobs.data.schemes` loads either).

Only `tokenizers`: no Ray, MLflow, transformers or sentencepiece, so a fine-tuning trial and every Ray Data
worker of the pretraining stream stay light (the authors' scheme, `jobs.data.official_tokenizer`, loads
sentencepiece: a stream that encodes with it receives it pickled, from the driver).
"""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import Tokenizer

from model.config import SpecialTokens

from jobs.cli import UserError

PLATFORM_FILE = "tokenizer.json"
MODEL_FILE, DICTIONARY_FILE = "sp.model", "dict.txt"  # the authors' scheme
# A tokenizer's own files, by scheme: what a checkpoint and a run keep of its tokenizer directory. A run
# started from an encoder directory (`--init-from` an export or the authors' converted checkpoint) has that
# directory as its tokenizer's, weights and all; a copy of the weights in every checkpoint would double it.
TOKENIZER_FILES = {
    "platform": ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spm.model", "spm.vocab",
                 "training_info.json"),  # what `python -m jobs.data.tokenizer` writes
    "official": (MODEL_FILE, DICTIONARY_FILE),
}


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


class Scheme:
    """What every path that encodes text asks of a tokenizer scheme, the platform's (`PlatformScheme`) or the
    authors' (`jobs.data.official_tokenizer.OfficialTokenizer`): the special ids, a text's ids (with each
    token's characters for SQuAD), a token's string, and the model's layout of a text or a pair."""

    name: str
    cls_id: int
    sep_id: int
    pad_id: int
    unk_id: int
    mask_id: int
    vocab_size: int
    special_tokens: SpecialTokens
    # Cutting a pair to length when both texts are as long: True drops the first text's last token (the
    # platform's rule), False the second's (the authors' code).
    tie_cuts_first: bool

    def ids(self, text: str) -> list[int]:
        """The text's ids without special tokens and without truncation."""
        raise NotImplementedError

    def batch_ids(self, texts: list[str]) -> list[list[int]]:
        """`ids` of each text."""
        return [self.ids(text) for text in texts]

    def ids_and_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """`ids(text)`, and the [start, end) characters of `text` each token came from. A token that begins
        a word covers the one whitespace character before the word, when there is one (never before the
        text's first word); SQuAD's windows find an answer's tokens by overlap, so that space is harmless."""
        raise NotImplementedError

    def batch_ids_and_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """`ids_and_offsets` of each text (SQuAD's paragraphs)."""
        return [self.ids_and_offsets(text) for text in texts]

    def token(self, token_id: int) -> str:
        """The token an id stands for (a label word's piece, named in a note)."""
        raise NotImplementedError

    def layout(self, a: list[int], b: list[int] | None, max_length: int) -> tuple[list[int], bool]:
        """`[CLS] a [SEP]` or `[CLS] a [SEP] [SEP] b [SEP]`, at most `max_length` ids: a single text cut at
        its end, a pair's longer side first (`tie_cuts_first`); and whether anything was cut."""
        if b is None:
            body = max(max_length - 2, 0)
            return [self.cls_id, *a[:body], self.sep_id], len(a) > body
        a, b, cut = list(a), list(b), len(a) + len(b) > max_length - 4
        while len(a) + len(b) > max_length - 4 and (a or b):
            (a if len(a) > len(b) or (self.tie_cuts_first and len(a) == len(b)) else b).pop()
        return [self.cls_id, *a, self.sep_id, self.sep_id, *b, self.sep_id], cut

    def encode(self, text: str, pair: str | None = None, max_length: int = 512) -> list[int]:
        """What the model reads for `text` (and `pair`), at most `max_length` ids."""
        return self.layout(self.ids(text), None if pair is None else self.ids(pair), max_length)[0]


class PlatformScheme(Scheme):
    """A platform tokenizer directory, with the layout the fine-tuning tasks feed the model. It pickles as
    its tokenizer.json text, loaded once per process (`tokenizer_from_json`): so it travels to Ray Data tasks."""

    name = "platform"
    tie_cuts_first = True

    def __init__(self, directory: str | Path):
        self.directory = str(directory)
        self.spec = (Path(directory) / PLATFORM_FILE).read_text(encoding="utf-8")
        self._load()

    def _load(self) -> None:
        self.tokenizer = tokenizer_from_json(self.spec)
        special = {t: self.tokenizer.token_to_id(t) for t in ("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]")}
        if None in special.values():
            raise UserError(f"{self.directory}: the tokenizer lacks {[t for t, i in special.items() if i is None]}")
        self.cls_id, self.pad_id, self.sep_id, self.unk_id, self.mask_id = special.values()
        self.vocab_size = self.tokenizer.get_vocab_size()
        # The ids pretraining packs, masks and draws with; another special token the file adds is a filler.
        added = {i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special}
        self.special_tokens = SpecialTokens(pad=self.pad_id, unk=self.unk_id, cls=self.cls_id, sep=self.sep_id,
                                            mask=self.mask_id, fillers=tuple(sorted(added - set(special.values()))))

    def __getstate__(self) -> dict:
        return {"directory": self.directory, "spec": self.spec}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._load()

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def batch_ids(self, texts: list[str]) -> list[list[int]]:
        """`ids` of each text, encoded in parallel by `tokenizers` (the documents of one packing batch)."""
        return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    def ids_and_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        return self.batch_ids_and_offsets([text])[0]

    def batch_ids_and_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """`ids_and_offsets` of each text, encoded in parallel: the offsets are `tokenizers`' own."""
        return [(e.ids, e.offsets) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def token(self, token_id: int) -> str:
        return self.tokenizer.id_to_token(token_id)


def tokenizer_files(directory: str | Path) -> list[Path]:
    """The files of the tokenizer `directory` holds (`TOKENIZER_FILES` of its scheme), without whatever else is there."""
    folder = Path(directory)
    return [folder / name for name in TOKENIZER_FILES[scheme_of(folder)] if (folder / name).is_file()]


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
