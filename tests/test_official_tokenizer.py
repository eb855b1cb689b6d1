"""The authors' tokenizer scheme (`jobs.data.official_tokenizer`) against their own output on the 40 cases
of tests/fixtures/official-cocolm/cases.json, and its character offsets (SQuAD's windows need them); the
one loader that tells the schemes apart (`jobs.data.schemes`); and `python -m jobs.data.tokens`."""

from __future__ import annotations

import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from jobs.cli import UserError
from jobs.data.official_tokenizer import OfficialTokenizer, fold, pre_tokenize
from jobs.data.schemes import PlatformScheme, Scheme, load_scheme, scheme_of
from jobs.data.tokens.__main__ import main as tokens_main
from model.fairseq_dictionary import read_dictionary

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "official-cocolm"
CASES = json.loads((FIXTURE / "cases.json").read_text(encoding="utf-8"))
BY_ID = {case["id"]: case for case in CASES["cases"]}
# Paragraphs as SQuAD has them, with what the pre-tokenizer rewrites: Brown-corpus and curly quotes, dashes,
# acute accents, contractions (split and whole), runs of spaces, tabs, newlines, leading and trailing space.
SQUAD_LIKE = {
    "brown-quotes": "The song ``Yesterday'' was written by Paul McCartney in 1965.",
    "curly-and-dashes": "  It's one of the most covered;\tthe Beatles' “Help!” album—out in August—held it.\n",
    "spaced-contraction": "Critics called it ``a masterpiece'' ... and  ‘the best’ –  they ' re sure  ",
    "capitals-and-unicode": "WE ' LL SEE: Zürich, São Paulo, 東京 and Ελληνικά 🙂 (café) ´quoted´",
    "nested-quotes": "\n\n\tleading tabs, ``nested 'quotes' here'' and trailing\t \n",
    "one-letter": "x",
    "empty": "",
}
EVERY_TEXT = {**{case["id"]: case["text"] for case in CASES["cases"]},
              **{f"{case['id']}-pair": case["text_pair"] for case in CASES["cases"] if "text_pair" in case},
              **SQUAD_LIKE}


@pytest.fixture(scope="module")
def official() -> OfficialTokenizer:
    return OfficialTokenizer(FIXTURE)


@pytest.fixture()
def platform_dir(tmp_path) -> Path:
    """A platform tokenizer directory: tokenizer.json with the platform's specials at 0..4, a few words."""
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


@pytest.mark.parametrize("case_id", sorted(BY_ID))
def test_every_case_gives_the_authors_pieces_and_ids(official, case_id):
    case = BY_ID[case_id]
    assert official.tokenize(case["text"]) == case["tokens"]
    if "text_pair" in case:
        assert official.tokenize(case["text_pair"]) == case["tokens_pair"]
    if "ids_no_special" in case:
        assert official.ids(case["text"]) == case["ids_no_special"]
    assert official.encode(case["text"], case.get("text_pair"), CASES["max_length"]) == case["input_ids"]


def test_the_cases_cover_truncation_and_the_pair_layout():
    """So that the test above checks them: pairs cut to max_length, and [CLS] a [SEP] [SEP] b [SEP]."""
    cut = [c for c in CASES["cases"] if len(c["input_ids"]) == CASES["max_length"]]
    assert any("text_pair" in c for c in cut) and any("text_pair" not in c for c in cut)
    pair = BY_ID["p03"]["input_ids"]
    assert pair[0] == 0 and pair[-1] == 2 and pair.count(2) == 3 and pair[pair.index(2) + 1] == 2


def test_the_fixture_batch_is_the_cases_padded_with_the_authors_pad(official):
    batch = torch.load(FIXTURE / "outputs.pt", map_location="cpu", weights_only=True)
    for row, case_id in enumerate(CASES["batch_case_ids"]):
        case = BY_ID[case_id]
        ids = official.encode(case["text"], case.get("text_pair"), CASES["max_length"])
        padded = ids + [official.pad_id] * (CASES["max_length"] - len(ids))
        assert batch["input_ids"][row].tolist() == padded
        assert batch["attention_mask"][row].sum().item() == len(ids)


def test_the_special_ids_and_vocabulary_are_the_authors(official):
    specials = CASES["special_tokens"]
    assert [official.cls_id, official.pad_id, official.sep_id, official.unk_id, official.mask_id] == [
        specials[role][2] for role in ("bos/cls", "pad", "eos/sep", "unk", "mask")]
    assert official.vocab_size == CASES["dictionary_size_with_mask"] == 417


def test_ids_are_dictionary_ids_not_sentencepiece_ids(official):
    """The mistake a loader of the released model is most likely to make: it would pass no case above."""
    pieces = official.tokenize(BY_ID["t00"]["text"])
    assert [official.sp.piece_to_id(p) for p in pieces] != BY_ID["t00"]["ids_no_special"]


def test_the_pre_tokenizer_splits_punctuation_off_word_edges_and_rejoins_contractions():
    assert pre_tokenize("“Hi,” she said—it's (fine)...") == ['"', "Hi", ',"', "she", "said-it's", "(", "fine", ")..."]
    assert pre_tokenize("we ' ll see ' S") == ["we", "'ll", "see", "'S"]
    assert pre_tokenize("!!! ... ?") == ["!!!", "...", "?"]


# ---------------------------------------------------------------- character offsets (SQuAD's windows)


def read_back(text: str, start: int, end: int) -> str:
    """What SentencePiece read of text[start:end]: the pre-tokenizer's folds, its normalizer's NFKC, no spaces."""
    return unicodedata.normalize("NFKC", "".join(fold(text[start:end]).split()))


@pytest.mark.parametrize("name", sorted(EVERY_TEXT))
def test_ids_with_offsets_are_the_ids_and_each_piece_covers_the_characters_it_came_from(official, name):
    text = EVERY_TEXT[name]
    ids, offsets = official.ids_and_offsets(text)
    assert ids == official.ids(text) and len(offsets) == len(ids)
    carried, covered = "", 0
    for piece, (start, end) in zip(official.tokenize(text), offsets):
        assert covered <= start <= end <= len(text)  # in order, never overlapping
        covered = end
        read = read_back(text, start, end)
        if not read:  # NFKC made one character several pieces (ﬁ -> f, in): the last piece covers it
            carried += piece.lstrip("▁")
            continue
        assert read == carried + piece.lstrip("▁"), (piece, text[start:end])
        carried = ""
        word = start + text[start].isspace()  # a word's first piece covers the one space before it, if any
        before = text[:word]
        assert not text[word].isspace()
        assert (word > start) == (piece[0] == "▁" and before[-1:].isspace() and before.strip() != "")


def test_offsets_of_a_piece_are_the_platforms_a_leading_space_and_brown_quotes_whole(official):
    """By hand: "``" and "''" are one `"` piece over both characters, the pieces after them still land on
    their own characters, and "▁f" of "flows" covers the space before it as the platform's "▁rhine" does."""
    text = "The ``Rhine'' flows."
    assert official.tokenize(text) == ["▁The", '▁"', "▁R", "h", "in", "e", '▁"', "▁f", "l", "ow", "s", "▁."]
    assert official.ids_and_offsets(text)[1] == [(0, 3), (3, 6), (6, 7), (7, 8), (8, 10), (10, 11), (11, 13),
                                                  (13, 15), (15, 16), (16, 18), (18, 19), (19, 20)]


def test_both_schemes_give_ids_with_offsets_and_tokens_through_one_interface(official, platform_dir):
    platform = load_scheme(platform_dir)
    assert isinstance(platform, Scheme) and isinstance(official, Scheme)
    assert platform.batch_ids_and_offsets(["a  c", "b"]) == [([5, 7], [(0, 1), (3, 4)]), ([6], [(0, 1)])]
    hello = [(0, 1), (1, 4), (4, 5), (5, 7), (7, 9), (9, 11), (11, 12)]  # ▁H ell o ▁w or ld !
    assert official.batch_ids_and_offsets(["Hello world!"]) == [(BY_ID["t00"]["ids_no_special"], hello)]
    assert [platform.token(i) for i in (2, 5)] == ["[CLS]", "a"]
    assert [official.token(i) for i in (official.cls_id, official.mask_id)] == ["[CLS]", "[MASK]"]
    assert [official.token(i) for i in BY_ID["t00"]["ids_no_special"]] == BY_ID["t00"]["tokens"]


def test_the_dictionary_reader_follows_fairseq(tmp_path):
    """Aliases of the specials keep their ids, a repeat keeps its first id, an overwrite line takes a
    new one (the old stays taken), a line without a count is a symbol, [MASK] comes last."""
    (tmp_path / "dict.txt").write_text("x 5\n<s> 3\ny 2\nx 1\nz\nx 0 #fairseq:overwrite\n", encoding="utf-8")
    indices, size = read_dictionary(tmp_path / "dict.txt")
    assert indices == {"[CLS]": 0, "[PAD]": 1, "[SEP]": 2, "[UNK]": 3, "x": 7, "y": 5, "z": 6, "[MASK]": 8}
    assert size == 9


def test_one_loader_tells_the_schemes_apart(platform_dir, tmp_path):
    assert scheme_of(FIXTURE) == "official" and isinstance(load_scheme(FIXTURE), OfficialTokenizer)
    assert scheme_of(platform_dir) == "platform" and isinstance(load_scheme(platform_dir), PlatformScheme)
    both = tmp_path / "both"
    both.mkdir()
    for name in ("sp.model", "dict.txt"):
        (both / name).write_bytes((FIXTURE / name).read_bytes())
    (both / "tokenizer.json").write_bytes((platform_dir / "tokenizer.json").read_bytes())
    with pytest.raises(UserError, match="holds both"):
        scheme_of(both)
    with pytest.raises(UserError, match="holds no tokenizer"):
        scheme_of(tmp_path / "missing")


def test_a_converted_encoder_directory_carries_the_authors_scheme(tmp_path):
    from model.convert import from_official

    converted = from_official(FIXTURE, tmp_path / "converted")
    case = BY_ID["p09"]
    assert load_scheme(converted).encode(case["text"], case["text_pair"], 64) == case["input_ids"]


def test_the_platform_scheme_lays_out_pairs_and_cuts_the_first_text_on_a_tie(platform_dir):
    scheme = load_scheme(platform_dir)
    assert scheme.encode("a b", "c") == [2, 5, 6, 3, 3, 7, 3]
    assert scheme.encode("a b c", "c b a", max_length=8) == [2, 5, 6, 3, 3, 7, 6, 3]  # 3 + 3 > 4: a, b, a
    assert scheme.encode("a b c", "c b a", max_length=9) == [2, 5, 6, 3, 3, 7, 6, 5, 3]  # 3 + 3 > 5: a only
    assert scheme.encode("a b c", max_length=4) == [2, 5, 6, 3]


def test_the_tokens_command_prints_the_ids_as_one_json_list_on_its_last_line(capsys, platform_dir):
    case = BY_ID["p09"]
    tokens_main([str(FIXTURE), "--text", case["text"], "--pair", case["text_pair"], "--max-length", "64"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == case["input_ids"]
    tokens_main([str(platform_dir), "--text", "a c"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == [2, 5, 7, 3]


def test_the_tokens_command_runs_as_a_module_and_names_a_bad_directory(tmp_path):
    run = [sys.executable, "-m", "jobs.data.tokens"]
    ok = subprocess.run([*run, str(FIXTURE), "--text", "Hello world!"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout.strip().splitlines()[-1]) == BY_ID["t00"]["input_ids"]
    bad = subprocess.run([*run, str(tmp_path), "--text", "x"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.startswith(f"error: {tmp_path} holds no tokenizer")


# ---------------------------------------------------------------- fine-tuning from the authors' directory


def test_fine_tuning_from_an_authors_directory_converts_it_once_into_the_run_storage(tmp_path, capsys):
    from jobs.pretraining.encoders import resolve_encoder
    from model.classifier import load_encoder

    encoder = resolve_encoder(str(FIXTURE), None, tmp_path)
    assert "the authors' checkpoint, converted into" in capsys.readouterr().out
    converted = encoder.tokenizer_dir
    assert converted.parent == tmp_path / "official" and scheme_of(converted) == "official"
    assert encoder.cfg == load_encoder(converted).cfg and encoder.cfg.token_padding_idx == 0
    again = resolve_encoder(str(FIXTURE), None, tmp_path)  # the same content: reused, not converted again
    assert again.tokenizer_dir == converted and capsys.readouterr().out == ""
    assert all(torch.equal(again.state[k], v) for k, v in encoder.state.items())


def test_a_pair_task_encodes_with_the_authors_ids_and_their_tie_rule(tmp_path, official):
    from jobs.finetuning.encoding import encode_task
    from jobs.finetuning.tasks.glue import read_glue_task
    from test_readers import write_glue

    write_glue(tmp_path, n=4)
    task = read_glue_task("rte", tmp_path)
    encoded = encode_task(task, FIXTURE, max_length=64)
    assert encoded.pad_id == 1
    first = encoded.train.ids[encoded.train.offsets[0]:encoded.train.offsets[1]].tolist()
    assert first == official.encode(task.train.text[0], task.train.text_pair[0], 64)
    short = encode_task(task, FIXTURE, max_length=8)
    assert short.train.lengths().max() <= 8 and short.truncated["train"] == len(task.train)
    assert official.layout([10, 11], [20, 21], 7)[0] == [0, 10, 11, 2, 2, 20, 2]  # a tie: the second text is cut
