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

Their code keeps no character offsets, and SQuAD's windows need them (`ids_and_offsets`): SentencePiece's
own offsets into the line it read, traced back through the pre-tokenizer to the text (`aligned_line`).
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import sentencepiece as spm

from model.config import SpecialTokens
from model.fairseq_dictionary import ALIASES, CLS, MASK, PAD, SEP, UNK, read_dictionary

from jobs.data.tokens import DICTIONARY_FILE, MODEL_FILE, Scheme

WORD_START = "\u2581"  # SentencePiece's ▁
FILLER = re.compile(r"madeupword\d+")  # fairseq's pad_to_multiple_ symbols: in the vocabulary, never in text
FOLD = str.maketrans("‘’´“”—–", "'''\"\"--")
BROWN_QUOTES = re.compile(r"``|''")  # two characters folded into one `"`
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


def fold(text: str) -> str:
    """Brown-corpus quotes, curly quotes, acute accents and dashes as ASCII. Replacing `` and then '' (the
    authors' order) is one left-to-right pass over both: no replacement makes a quote the other reads."""
    return BROWN_QUOTES.sub('"', text).translate(FOLD)


def fold_origins(text: str) -> list[tuple[int, int]]:
    """For each character of `fold(text)`, the [start, end) characters of `text` it came from."""
    origins, at = [], 0
    for quote in BROWN_QUOTES.finditer(text):
        origins += [(i, i + 1) for i in range(at, quote.start())]
        origins.append(quote.span())
        at = quote.end()
    return origins + [(i, i + 1) for i in range(at, len(text))]


def pre_tokenize(text: str) -> list[str]:
    """The authors' pre-tokenizer: the words SentencePiece then reads, joined by single spaces."""
    line = " ".join(part for word in fold(text).split() for part in split_edges(word))
    for pattern, replacement in CONTRACTIONS:
        line = pattern.sub(replacement, line)
    return line.split()


def aligned_line(text: str) -> tuple[str, list[tuple[int, int]]]:
    """The line SentencePiece reads for `text`, and for each of its characters the [start, end) characters
    of `text` it stands for. The pre-tokenizer only folds characters, drops whitespace and puts single
    spaces between words, so the words' characters are the folded text's characters other than
    whitespace, in order. A space before a word stands for the one whitespace character before the word
    in `text`, as the platform's offsets count it, or for none where the word was split off punctuation."""
    kept = [origin for char, origin in zip(fold(text), fold_origins(text)) if not char.isspace()]
    words, origins, at = pre_tokenize(text), [], 0
    for word in words:
        start = kept[at][0]
        if origins:
            origins.append((start - 1, start) if text[start - 1].isspace() else (start, start))
        origins += kept[at : at + len(word)]
        at += len(word)
    return " ".join(words), origins


def kept_pieces(pieces: list[str]) -> list[bool]:
    """Which SentencePiece pieces the authors keep: all but a lone ▁ that comes last or before punctuation."""
    return [not (piece == WORD_START and (i == len(pieces) - 1 or is_punctuation(pieces[i + 1][0])))
            for i, piece in enumerate(pieces)]


class OfficialTokenizer(Scheme):
    """sp.model + dict.txt of `directory`, encoding as the authors' tokenizer does."""

    name = "official"
    tie_cuts_first = False

    def __init__(self, directory: str | Path):
        directory = Path(directory)
        self.sp = spm.SentencePieceProcessor(model_file=str(directory / MODEL_FILE))
        self.indices, self.vocab_size = read_dictionary(directory / DICTIONARY_FILE)
        self.symbols = {i: symbol for symbol, i in self.indices.items()}
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
        return [piece for piece, keep in zip(pieces, kept_pieces(pieces)) if keep]

    def piece_ids(self, pieces: list[str]) -> list[int]:
        return [self.indices.get(ALIASES.get(piece, piece), self.unk_id) for piece in pieces]

    def ids(self, text: str) -> list[int]:
        """The text's ids without special tokens and without truncation."""
        return self.piece_ids(self.tokenize(text))

    def ids_and_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """`ids(text)`, and the [start, end) characters of `text` each piece came from (`aligned_line`).
        SentencePiece gives each piece's characters of the line it read ('offset_mapping', characters
        not bytes for a str); a piece its normalizer made of part of a character (ﬁ -> ▁f, i) may have
        none: it is empty, where that character starts, and the next piece covers the character."""
        line, origins = aligned_line(text)
        encoded = self.sp.encode(line, out_type="offset_mapping")
        pieces, offsets = [], []
        for piece, (start, end), keep in zip(encoded["pieces"], encoded["offsets"], kept_pieces(encoded["pieces"])):
            if keep:
                pieces.append(piece)
                offsets.append((origins[start][0], origins[end - 1][1] if end > start else origins[start][0]))
        return self.piece_ids(pieces), offsets

    def token(self, token_id: int) -> str:
        return self.symbols[token_id]
