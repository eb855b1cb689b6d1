"""The authors' vocabulary: a fairseq `dict.txt` read into the ids their released COCO-LM was trained on.

One reader for the checkpoint converter (`model.convert` checks the embedding rows against it) and the
tokenizer scheme (`jobs.data.official_tokenizer` looks pieces up in it). Standard library only.

The ids: [CLS] [PAD] [SEP] [UNK] at 0..3 (fairseq's `<s> <pad> </s> <unk>`, stored under their bracketed
aliases), then the file's symbols in file order, then [MASK] last (added after loading). A line is
`<symbol> <count>`, optionally followed by ` #fairseq:overwrite`; a symbol seen before (or an alias of a
special) keeps its first id unless the line says overwrite.
"""

from __future__ import annotations

from pathlib import Path

# fairseq's names and the aliases the authors store them under; ids follow this order, mask last.
ALIASES = {"<s>": "[CLS]", "<pad>": "[PAD]", "</s>": "[SEP]", "<unk>": "[UNK]", "<mask>": "[MASK]"}
SPECIALS = ("[CLS]", "[PAD]", "[SEP]", "[UNK]")
CLS, PAD, SEP, UNK = range(4)
MASK = "[MASK]"
OVERWRITE = "#fairseq:overwrite"


class DictionaryError(ValueError):
    """A dict.txt line that is not `<symbol> <count> [#fairseq:overwrite]`."""


def read_dictionary(path: str | Path) -> tuple[dict[str, int], int]:
    """(symbol -> id, the number of ids), specials and [MASK] included: the number is the model's vocab_size.
    As fairseq reads it: a line without a count is a symbol; an overwrite line gives its symbol a new id
    (the old id stays taken, so the count of ids can exceed the number of symbols)."""
    indices = {symbol: i for i, symbol in enumerate(SPECIALS)}
    size = len(SPECIALS)
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        symbol, space, field = line.rstrip().rpartition(" ")
        if not space:
            symbol, field = field, "0"
        overwrite = field == OVERWRITE
        if overwrite:
            symbol, _, field = symbol.rpartition(" ")
        try:
            int(field)
        except ValueError:
            raise DictionaryError(f"{path}:{number}: expected '<symbol> <count>', got {line!r}") from None
        if symbol in indices and not overwrite:
            continue
        symbol = ALIASES.get(symbol, symbol)
        if symbol not in indices or overwrite:
            indices[symbol] = size
            size += 1
    if MASK not in indices:
        indices[MASK] = size
        size += 1
    return indices, size
