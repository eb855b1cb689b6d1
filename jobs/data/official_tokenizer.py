"""The authors' tokenizer scheme, for their released COCO-LM (`microsoft/cocolm-base`, `-large`) and the
directories `python -m model.convert --from-official` writes: sp.model + dict.txt.

What their Hugging Face tokenizer does (microsoft/COCO-LM, huggingface/cocolm), written anew here and held
to their output by tests/fixtures/official-cocolm/cases.json:

1. a pre-tokenizer: Brown-corpus quotes (`` and '') and curly quotes, acute accents and dashes folded
   to ASCII; split on whitespace; a run of punctuation split off the front and the back of each word
   (a word that is all punctuation stays whole); then contractions re-joined (`' s` -> `'s`, `' ll`,
   `' re`, `' ve`; in capitals `'LL`, `'RE`, `'VE`);
2. SentencePiece on the words joined by single spaces, then a lone `▁` piece dropped where it comes
   last or before a piece that starts with punctuation;
3. each piece looked up by string in the fairseq dictionary (`model.fairseq_dictionary`): [UNK] when
   absent. Ids are dictionary ids, not SentencePiece's;
4. `[CLS] a [SEP]` or `[CLS] a [SEP] [SEP] b [SEP]` (no token types); a pair is cut to max_length - 4
   by dropping the last token of the longer side, of the second on a tie; a single text to max_length - 2.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import sentencepiece as spm

from model.corruption import SpecialTokens
from model.fairseq_dictionary import ALIASES, CLS, MASK, PAD, SEP, UNK, read_dictionary

from jobs.data.tokens import DICTIONARY_FILE, MODEL_FILE

WORD_START = "\u2581"  # SentencePiece's ▁
FILLER = re.compile(r"madeupword\d+")  # fairseq's pad_to_multiple_ symbols: in the vocabulary, never in text
FOLD = str.maketrans("‘’´“”—–", "'''\"\"--")
# A quote split from a contraction is put back: (pattern, replacement), in this order.
CONTRACTIONS = (
    (re.compile(r"' ([smdSMDtT])\b"), r"'\1"),
    (re.compile(r"' ll\b"), "'ll"), (re.compile(r"' re\b"), "'re"), (re.compile(r"' ve\b"), "'ve"),
    (re.compile(r"' LL\b"), "'LL "), (re.compile(r"' RE\b"), "'RE "), (re.compile(r"' VE\b"), "'VE "),
)


def is_punctuation(char: str) -> bool:
    """Every printable ASCII character that is not a letter or digit, and Unicode's P* categories."""
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def split_edges(word: str) -> list[str]:
    """A word's leading and trailing runs of punctuation as words of their own; the middle stays whole."""
    if len(word) < 2 or not (is_punctuation(word[0]) or is_punctuation(word[-1])):
        return [word]
    start = next((i for i, ch in enumerate(word) if not is_punctuation(ch)), None)
    if start is None:  # all punctuation
        return [word]
    end = next(i for i in range(len(word), 0, -1) if not is_punctuation(word[i - 1]))
    return [part for part in (word[:start], word[start:end], word[end:]) if part]


def pre_tokenize(text: str) -> list[str]:
    """The authors' pre-tokenizer: the words SentencePiece then reads, joined by single spaces."""
    text = text.strip().replace("``", '"').replace("''", '"').translate(FOLD)
    line = " ".join(part for word in text.split() for part in split_edges(word))
    for pattern, replacement in CONTRACTIONS:
        line = pattern.sub(replacement, line)
    return line.split()


class OfficialTokenizer:
    """sp.model + dict.txt of `directory`, encoding as the authors' tokenizer does."""

    name = "official"

    def __init__(self, directory: str | Path):
        directory = Path(directory)
        self.sp = spm.SentencePieceProcessor(model_file=str(directory / MODEL_FILE))
        self.indices, self.vocab_size = read_dictionary(directory / DICTIONARY_FILE)
        self.cls_id, self.pad_id, self.sep_id, self.unk_id = CLS, PAD, SEP, UNK
        self.mask_id = self.indices[MASK]
        self.special_tokens = self._special_tokens()

    def _special_tokens(self) -> SpecialTokens:
        """The ids pretraining packs, masks and draws with: the specials, and as fillers the madeupword
        symbols and the ids an overwrite left without a symbol (`model.fairseq_dictionary.read_dictionary`)."""
        fillers = {i for symbol, i in self.indices.items() if FILLER.fullmatch(symbol)}
        fillers |= set(range(self.vocab_size)) - set(self.indices.values())
        return SpecialTokens(pad=self.pad_id, unk=self.unk_id, cls=self.cls_id, sep=self.sep_id, mask=self.mask_id,
                             fillers=tuple(sorted(fillers)))

    def tokenize(self, text: str) -> list[str]:
        """SentencePiece pieces of the pre-tokenized text, without lone ▁ before punctuation or at the end."""
        pieces = self.sp.encode(" ".join(pre_tokenize(text)), out_type=str)
        return [piece for i, piece in enumerate(pieces)
                if not (piece == WORD_START and (i == len(pieces) - 1 or is_punctuation(pieces[i + 1][0])))]

    def piece_ids(self, pieces: list[str]) -> list[int]:
        return [self.indices.get(ALIASES.get(piece, piece), self.unk_id) for piece in pieces]

    def ids(self, text: str) -> list[int]:
        """The text's ids without special tokens and without truncation."""
        return self.piece_ids(self.tokenize(text))

    def batch_ids(self, texts: list[str]) -> list[list[int]]:
        """`ids` of each text: the documents of one packing batch."""
        return [self.ids(text) for text in texts]

    def encode(self, text: str, pair: str | None = None, max_length: int = 512) -> list[int]:
        """What the model reads for `text` (and `pair`), at most `max_length` ids."""
        return self.layout(self.ids(text), None if pair is None else self.ids(pair), max_length)[0]

    def layout(self, a: list[int], b: list[int] | None, max_length: int) -> tuple[list[int], bool]:
        """The special tokens around a text's ids (and a pair's), cut to `max_length`; and whether it was cut."""
        if b is None:
            body = max(max_length - 2, 0)
            return [self.cls_id, *a[:body], self.sep_id], len(a) > body
        a, b, cut = list(a), list(b), len(a) + len(b) > max_length - 4
        while len(a) + len(b) > max_length - 4 and (a or b):
            (a if len(a) > len(b) else b).pop()  # the longer side; the second on a tie
        return [self.cls_id, *a, self.sep_id, self.sep_id, *b, self.sep_id], cut
