"""The tokenizer-info file for the C++ backend's guided decoding (xgrammar_info.py), made with the standard library,
against what upstream's generate_xgrammar_tokenizer_info.py makes with transformers (the same three fields from
AutoTokenizer: get_vocab() in id order, backend_tokenizer.to_str(), [eos_token_id]), on a byte-level BPE tokenizer
(Llama 3, Qwen, GPT-2 style) and a SentencePiece Unigram one, each with added special tokens."""

from __future__ import annotations

import json

import pytest

from harness.image import templates_for
from tests.factories import image_facts, settings
from trtllm_entrypoint.repository import fill, xgrammar_info

tokenizers = pytest.importorskip("tokenizers")
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France; 3 days, 20°C.", "été"] * 20
SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<tool_call>", "</tool_call>"]


def bpe(dest):
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS[:2],
                            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    tok.add_tokens([tokenizers.AddedToken(t, special=False) for t in SPECIALS[2:]])
    tok.save(str(dest / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1]}
    (dest / "tokenizer_config.json").write_text(json.dumps(config))


def unigram(dest):
    tok = tokenizers.Tokenizer(tokenizers.models.Unigram())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    tok.decoder = tokenizers.decoders.Metaspace()
    tok.train_from_iterator(CORPUS, tokenizers.trainers.UnigramTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>"))  # fmt: skip  # noqa: E501
    tok.add_special_tokens(["[TOOL_CALLS]", "[ARGS]"])
    tok.save(str(dest / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "unk_token": "<unk>",
              "eos_token": {"content": "</s>", "special": True, "__type": "AddedToken"}}  # fmt: skip
    (dest / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("make", [bpe, unigram])
def test_the_info_matches_what_transformers_gives_upstreams_script(tmp_path, make):
    transformers = pytest.importorskip("transformers")
    make(tmp_path)
    info = xgrammar_info.tokenizer_info(tmp_path)
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    expected_vocab = [t for t, _ in sorted(reference.get_vocab().items(), key=lambda item: item[1])]
    assert info["encoded_vocab"] == expected_vocab
    assert info["stop_token_ids"] == [reference.eos_token_id]
    # The tokenizer's own JSON: the same tokenizer when read back (the backend's xgrammar reads its decoder).
    assert json.loads(info["tokenizer_str"]) == json.loads((tmp_path / "tokenizer.json").read_text())
    again = tokenizers.Tokenizer.from_str(info["tokenizer_str"])
    assert again.get_vocab(with_added_tokens=True) == reference.backend_tokenizer.get_vocab(with_added_tokens=True)
    assert set(info) == {"encoded_vocab", "tokenizer_str", "stop_token_ids"}


def test_a_model_without_a_fast_tokenizer_or_eos_has_none_and_says_why(tmp_path):
    with pytest.raises(xgrammar_info.NoTokenizerInfo, match="no tokenizer.json"):
        xgrammar_info.tokenizer_info(tmp_path)
    bpe(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(xgrammar_info.NoTokenizerInfo, match="eos_token"):
        xgrammar_info.tokenizer_info(tmp_path)


def test_the_cache_key_follows_the_tokenizer_files_bytes(tmp_path):
    bpe(tmp_path)
    first = xgrammar_info.source_digest(tmp_path)
    assert xgrammar_info.source_digest(tmp_path) == first
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": SPECIALS[0]}))
    assert xgrammar_info.source_digest(tmp_path) != first


def test_ensure_writes_the_file_once_under_the_tokenizers_digest_and_repairs_a_damaged_one(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    bpe(model)
    path = xgrammar_info.ensure(tmp_path / "cache", model)
    assert path.parent.name == xgrammar_info.source_digest(model) and path.name == xgrammar_info.FILE_NAME
    assert json.loads(path.read_text()) == xgrammar_info.tokenizer_info(model)
    stamp = path.stat().st_mtime_ns
    assert xgrammar_info.ensure(tmp_path / "cache", model) == path and path.stat().st_mtime_ns == stamp
    path.write_text('{"encoded_vo')  # killed mid-write by something else
    assert json.loads(xgrammar_info.ensure(tmp_path / "cache", model).read_text())["stop_token_ids"]
    assert [p.name for p in path.parent.iterdir()] == [xgrammar_info.FILE_NAME]


@pytest.mark.parametrize(
    "features,workflow,problem,words",
    [
        (("guided_decoding",), "engine", None, None),
        (
            (),
            "engine",
            None,
            "tag 25.01's backend models declare no guided decoding inputs; the first tag that serves it is 25.05",
        ),  # noqa: E501
        (("guided_decoding",), "llmapi", None, "WORKFLOW=engine (the first tag that serves it is 25.05)"),
        (
            ("guided_decoding",),
            "engine",
            "it has no tokenizer.json",
            "tokenizer info for it, and it has no tokenizer.json",
        ),  # noqa: E501
    ],
)
def test_why_guided_decoding_is_off_names_the_way_out(features, workflow, problem, words):
    said = xgrammar_info.guided_off(features, workflow, "25.01", "25.05", problem)
    assert said == "" if words is None else words in said


@pytest.mark.parametrize("templates,filled", [("v0.17.0", False), ("v0.19.0", True), ("triton_backend", True)])
def test_the_fill_turns_guided_decoding_on_only_where_the_templates_have_its_parameters(tmp_path, templates, filled):
    """With the file, the tensorrt_llm model gets guided_decoding_backend=xgrammar and its path; templates before
    v0.19.0 have neither placeholder and fill as before; without the file both stay unset (the backend: off)."""
    facts, info = image_facts(), tmp_path / "info.json"
    root = templates_for(templates)
    s = settings(facts, TEMPLATES_DIR=str(root), WORKFLOW="engine")
    for given in (info, None):
        values = fill.fill_values(s, facts, tmp_path / "engine", tmp_path / "tokenizer")
        values.update(fill.guided_values(given) if given is not None else {})
        plan = fill.plan_fill(root, values, settings=s, model_path=tmp_path)
        config = next(m for m in plan.models if m.source.endswith("tensorrt_llm")).files["config.pbtxt"]
        on = 'string_value: "xgrammar"' in config and f'string_value: "{info}"' in config
        assert on == (filled and given is not None), (templates, given)
        if filled and given is None:
            assert plan.effective["guided_decoding_backend"] == fill.UNSET
