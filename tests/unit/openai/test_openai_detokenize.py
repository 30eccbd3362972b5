"""Exact text from streamed ids (openai/detokenize.py, openai/tokenizer.py), over tokenizers in real models' shapes
(harness/tokenizers_fixture.py): SentencePiece with byte fallback in three conversions, byte-level BPE with and
without a BOS and with transformers' cleanup, and a tiktoken-style bytes vocabulary.

The property everywhere: whatever way the ids arrive (one by one, in chunks), the pieces add up to the tokenizer's
decoding of all ids at once, no piece holds a `�` the whole text does not, and a character is sent in one piece.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness import tokenizers_fixture as fx
from trtllm_entrypoint.openai import tokenizer as tokenizer_module
from trtllm_entrypoint.openai.detokenize import REPLACEMENT, Codec, IncrementalDetokenizer, clean_up

SHAPES = ("llama2", "metaspace", "gemma", "qwen", "llama3")
SPECIALS = {"llama2": "</s>", "metaspace": "</s>", "gemma": "<end_of_turn>", "qwen": "<|im_end|>",
            "llama3": "<|eot_id|>"}  # fmt: skip


def stream(codec: Codec, ids: Sequence[int], chunks: Sequence[int] | None = None) -> list[str]:
    """The pieces a detokenizer returns for `ids` pushed in chunks of the given sizes (one by one by default)."""
    detok = IncrementalDetokenizer(codec)
    pieces, at = [], 0
    for size in chunks or [1] * len(ids):
        pieces.append(detok.push(ids[at : at + size]))
        at += size
    pieces.append(detok.finish())
    return pieces


def assert_adds_up(pieces: Sequence[str], whole: str, label: object) -> None:
    """The pieces add up to the whole decoding exactly where it holds no `�`. Where it does (a byte run that is not
    valid UTF-8, which the decoder writes as one `�` per byte), characters of the run sent before it proved invalid
    stand for their bytes: no other text is lost or repeated, and no piece adds a `�`."""
    joined = "".join(pieces)
    if REPLACEMENT not in whole:
        assert joined == whole, label
        return
    at = 0  # in whole: every character of joined is whole's, or stands for as many `�` as it has bytes
    for char in joined:
        size = 1 if char == whole[at : at + 1] else len(char.encode())
        assert char == whole[at : at + 1] or whole[at : at + size] == REPLACEMENT * size, (label, joined, whole)
        at += size
    assert at == len(whole), (label, joined, whole)


@pytest.fixture(scope="module", params=SHAPES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tokenizer_module.Tokenizer:
    """A model directory of that shape, loaded as the front loads it."""
    directory = fx.write_tokenizer(tmp_path_factory.mktemp(request.param), request.param)
    return tokenizer_module.load(directory)


def test_the_shapes_are_what_they_claim() -> None:
    """The fixture's tokenizers split words and characters the way real ones do, or the tests below prove little."""
    llama2 = fx.sentencepiece("llama2")
    assert llama2.encode("The capital").tokens == ["<s>", "\u2581The", "\u2581capital"]
    assert llama2.decode(llama2.encode(" x").ids[1:2]) == ""  # a lone `▁` decodes to nothing: the Strip decoder
    emoji = llama2.encode("😀").tokens
    assert emoji[-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"], emoji
    # decoding one token alone loses its space: the defect of joining per-token decodes
    ids = llama2.encode("capital of France", add_special_tokens=False).ids
    assert "".join(llama2.decode([i]) for i in ids) == "capitalofFrance"
    qwen = fx.byte_level("qwen")
    cjk = qwen.encode("你", add_special_tokens=False).ids
    assert len(cjk) > 1 and qwen.decode(cjk[:1]) == REPLACEMENT
    assert fx.byte_level("llama3").encode("a").tokens[0] == "<|begin_of_text|>"


@pytest.mark.parametrize("text", fx.TEXTS)
def test_streamed_pieces_add_up_to_the_whole_decoding(served: tokenizer_module.Tokenizer, text: str) -> None:
    ids = served.encode(text)
    whole = served.codec.text(ids)
    pieces = stream(served.codec, ids)
    assert "".join(pieces) == whole
    assert not any(REPLACEMENT in piece for piece in pieces), pieces  # none of these texts decodes to `�`
    for chunks in ([3] * (len(ids) // 3 + 1), [len(ids)], [2, 5, 1, 7] * (len(ids) // 15 + 1)):
        assert "".join(stream(served.codec, ids, chunks)) == whole


def test_spaces_survive_sentencepiece_word_starts() -> None:
    codec = Codec(decode=lambda ids: fx.sentencepiece("llama2").decode(list(ids)))
    tok = fx.sentencepiece("llama2")
    ids = tok.encode("France of capital the is What", add_special_tokens=False).ids
    assert stream(codec, ids)[:3] == ["France", " of", " capital"]
    assert "".join(stream(codec, ids)) == "France of capital the is What"


def test_a_character_of_several_tokens_is_sent_once_complete(served: tokenizer_module.Tokenizer) -> None:
    for text in ("Emoji: 😀 ok", "中文 ok", "Noël ok", "👩\u200d👩\u200d👧 ok"):
        ids = served.encode(text)
        pieces = [p for p in stream(served.codec, ids) if p]
        joined = "".join(pieces)
        assert joined == served.codec.text(ids)
        for char in ("😀", "中", "ë"):
            if char in text:
                assert any(char in piece for piece in pieces), pieces  # whole in one piece, not split


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_between_words(tmp_path: Path, skip: bool) -> None:
    for shape in SHAPES:
        served = tokenizer_module.load(
            fx.write_tokenizer(tmp_path / f"{shape}-{skip}", shape), skip_special_tokens=skip
        )
        special = fx.tokenizer_of(shape).token_to_id(SPECIALS[shape])
        words = served.encode("Hello world")
        more = served.encode(" and 😀 more")
        for ids in (words + [special] + more, [special] + words, words + [special], words + [special, special] + more):
            whole = served.codec.text(ids)
            assert "".join(stream(served.codec, ids)) == whole, (shape, skip, ids)
            assert (SPECIALS[shape] in whole) is not skip


def test_transformers_cleanup_is_applied_across_tokens() -> None:
    tok = fx.byte_level("qwen")
    codec = Codec(decode=lambda ids: tok.decode(list(ids)), cleanup=True)
    text = "Hello , world ! It 's fine . They 're here , we 've gone . Is n't it ? I 'm sure ."
    ids = tok.encode(text, add_special_tokens=False).ids
    assert codec.text(ids) == clean_up(text) == "Hello, world! It's fine. They're here, we've gone. Isn't it? I'm sure."
    assert "".join(stream(codec, ids)) == codec.text(ids)
    assert "".join(stream(codec, ids, [len(ids)])) == codec.text(ids)
    rng = random.Random(35)
    words = text.split(" ") + ["", "'", "  "]
    for _ in range(300):
        ids = tok.encode(" ".join(rng.choice(words) for _ in range(12)), add_special_tokens=False).ids
        assert "".join(stream(codec, ids)) == codec.text(ids), tok.decode(ids)


def test_tiktoken_style_bytes_vocabulary() -> None:
    tik = fx.TiktokenStyle()
    codec = Codec(decode=lambda ids: tik.decode(list(ids)))
    for text in fx.TEXTS:
        ids = tik.encode(text)
        pieces = stream(codec, ids)
        assert "".join(pieces) == text == tik.decode(ids)
        assert not any(REPLACEMENT in p for p in pieces)


def test_a_decode_that_really_ends_in_a_replacement_character_is_sent_at_the_end() -> None:
    tok = fx.byte_level("qwen")
    codec = Codec(decode=lambda ids: tok.decode(list(ids)))
    ids = tok.encode("ok 😀", add_special_tokens=False).ids[:-1]  # the emoji's last byte never comes
    assert tok.decode(ids).endswith(REPLACEMENT)
    pieces = stream(codec, ids)
    assert pieces[-1].endswith(REPLACEMENT) and "".join(pieces) == tok.decode(ids)


def test_held_text_waits_only_for_its_character(served: tokenizer_module.Tokenizer) -> None:
    """Text is sent as soon as it is final: a stream of plain words sends each word when the next token comes (or at
    once), never at the end only."""
    ids = served.encode("The capital of France is Paris")
    pieces = stream(served.codec, ids)
    assert pieces[-1] == "" and sum(1 for p in pieces if p) >= 5, pieces


def test_loading_reads_end_and_pad_ids(tmp_path: Path) -> None:
    qwen = tokenizer_module.load(fx.write_tokenizer(tmp_path / "q", "qwen"))
    tok = fx.byte_level("qwen")
    assert (qwen.end_id, qwen.pad_id) == (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
    llama = tokenizer_module.load(fx.write_tokenizer(tmp_path / "l", "llama2"))
    assert (llama.end_id, llama.pad_id) == (2, 2)  # no pad token: the eos token, as the preprocessing model
    assert llama.encode("The")[0] == 1 and llama.count("The") == 2  # BOS added, as add_special_tokens=True
    assert len(llama.codec.byte_tokens) == 256 and not qwen.codec.byte_tokens
    # as transformers decodes: the config's clean_up_tokenization_spaces, which transformers 5 ignores for BPE
    cleans_up = tokenizer_module._transformers_major() < 5
    assert tokenizer_module.load(fx.write_tokenizer(tmp_path / "l3", "llama3")).codec.cleanup is cleans_up


def test_a_prompt_given_as_ids_reads_back_as_the_text_that_encodes_to_them(tmp_path: Path) -> None:
    """Special tokens kept (a prompt's own BOS or turn markers are part of it); ids outside the vocabulary, added
    tokens included, are refused naming the id and the range."""
    llama = tokenizer_module.load(fx.write_tokenizer(tmp_path / "l", "llama2"))
    ids = llama.encode("The capital of France")
    assert llama.decode_prompt_ids(ids) == "<s> The capital of France"  # an answer's decoding skips the <s>
    assert llama.codec.text(ids) == "The capital of France" and llama.encode(llama.decode_prompt_ids(ids[1:])) == ids
    size = fx.sentencepiece("llama2").get_vocab_size(with_added_tokens=True)
    assert llama.decode_prompt_ids([size - 1])  # the last id is in the vocabulary
    for bad in (size, -1):
        with pytest.raises(ValueError, match=rf"token id {bad} is outside the model's vocabulary \(0 to {size - 1}\)"):
            llama.decode_prompt_ids([5, bad])


def test_loading_refuses_a_tokenizer_without_an_eos_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="eos_token"):
        tokenizer_module.load(fx.write_tokenizer(tmp_path / "q", "qwen", eos_token=None))


@pytest.mark.parametrize("skip", [True, False])
def test_the_whole_text_is_what_transformers_decodes(tmp_path: Path, skip: bool) -> None:
    """transformers is what upstream's postprocessing model decodes with (cleanup included): ours agrees on random
    ids, and the prompt ids match its encoding. Runs where transformers is installed (the stub's environment)."""
    transformers = pytest.importorskip("transformers")
    rng = random.Random(35)
    for shape in SHAPES:
        directory = fx.write_tokenizer(tmp_path / shape, shape)
        theirs = transformers.AutoTokenizer.from_pretrained(str(directory), legacy=False, padding_side="left")
        ours = tokenizer_module.load(directory, skip_special_tokens=skip)
        vocab = fx.tokenizer_of(shape).get_vocab_size()  # transformers 5 may add its class's own special tokens
        for _ in range(300):
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))]
            assert ours.codec.text(ids) == theirs.decode(ids, skip_special_tokens=skip), (shape, ids)
            assert_adds_up(stream(ours.codec, ids), theirs.decode(ids, skip_special_tokens=skip), (shape, ids))
        for text in fx.TEXTS:
            # transformers 5 builds Llama tokenizers' pre-tokenization from the class (legacy=False), not from a
            # legacy tokenizer.json's normalizer: a prompt that starts with a space loses its extra `▁` there
            # (transformers 4, which NGC images carry, encodes as tokenizer.json says, as we do).
            if shape == "llama2" and text.startswith(" ") and int(transformers.__version__.split(".")[0]) >= 5:
                continue
            assert ours.encode(text) == theirs.encode(text), (shape, text)
        pad = theirs.eos_token_id if theirs.pad_token_id is None else theirs.pad_token_id
        assert (ours.end_id, ours.pad_id) == (theirs.eos_token_id, pad)


def test_a_run_of_byte_tokens_streams_each_character_once_complete(tmp_path: Path) -> None:
    """Text outside a byte-fallback vocabulary (CJK, emoji) is one long run of `<0xXX>` tokens: each character is
    sent as soon as its last byte comes, not when the run ends (a stop string inside it is seen in time)."""
    llama = tokenizer_module.load(fx.write_tokenizer(tmp_path / "l", "llama2"))
    text = "你好世界😀中文"
    ids = llama.encode(text)[1:]  # no BOS
    assert all(i in llama.codec.byte_tokens for i in ids[1:]), fx.sentencepiece("llama2").id_to_token(ids[1])
    detok = IncrementalDetokenizer(llama.codec)
    pieces = [detok.push([i]) for i in ids]
    assert [p for p in pieces if p][:3] == ["你", "好", "世"], pieces
    assert "".join(pieces) + detok.finish() == text and detok.finish() == ""


@pytest.mark.parametrize("skip", [True, False])
def test_random_ids_in_random_chunks_over_every_shape(tmp_path: Path, skip: bool) -> None:
    """Ids drawn at random (any token: byte tokens, specials, pieces) and pushed in random chunks. Where every run of
    byte tokens is valid UTF-8 (what a model's text is), the pieces add up to the whole decoding exactly. Where a run
    proves invalid after some of its characters went out (the decoder then writes `�` for each of its bytes), those
    characters stand and the rest of the run comes as `�`: no word is lost or repeated, and no piece holds a `�` the
    whole decoding has not."""
    rng = random.Random(3501)
    for shape in SHAPES:
        served = tokenizer_module.load(
            fx.write_tokenizer(tmp_path / f"{shape}-{skip}", shape), skip_special_tokens=skip
        )
        vocab = fx.tokenizer_of(shape).get_vocab_size()
        texts = [served.encode(t)[1:] for t in fx.TEXTS]
        for _ in range(300):
            if rng.random() < 0.5:  # valid text with random specials and pieces between
                ids = [i for _ in range(3) for i in rng.choice(texts) + [rng.randrange(vocab)]]
            else:
                ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
            chunks, left = [], len(ids)
            while left > 0:
                chunks.append(min(left, rng.randint(1, 4)))
                left -= chunks[-1]
            assert_adds_up(stream(served.codec, ids, chunks), served.codec.text(ids), (shape, ids, chunks))


def test_each_tokens_own_bytes_add_up_to_the_text(served: tokenizer_module.Tokenizer) -> None:
    """What chat's logprobs show of a token (openai/logprobs.py): its own bytes, byte-level BPE's printable
    characters and SentencePiece's `▁` and `<0xXX>` read back, so that a character of several tokens is in their
    bytes together (SentencePiece's first word keeps the space its decoder strips)."""
    for text in fx.TEXTS:
        ids = [i for i in served.encode(text) if i not in served.codec.skipped]
        assert b"".join(served.token_bytes(i) for i in ids).decode() in (text, " " + text), text
    for special in served.codec.skipped:  # a special token is its own text, skipped in the answer's or not
        assert served.token_bytes(special).decode() == served.decode_kept([special]) != "", special
