"""Every stored document equals transformers' ids, on production tokenizers of three families.

Tekken (131k byte-level BPE, Llama-3-style merges), Qwen (151k BPE with an NFC normalizer) and
Mistral's SentencePiece (byte fallback), built from files registry packages ship
(`real_tokenizers`). Each is compared with `tokenizer(text)["input_ids"] + [eos]` document by
document, on both engines and with several worker processes; so are the folder variants that
broke before: truncation/padding saved in tokenizer.json, and `split_special_tokens`.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import real_tokenizers as rt
from conftest import saved_text
from moai.errors import TokenizerError
from moai.formats.tokens import TokenStore
from moai.stages import tokenize as tk
from moai.stages.tokenize import pieces
from moai.stages.tokenizer import describe, load_tokenizer

# What auto picks per family (the fastest exact engine), and what a named engine is refused with.
AUTO_ENGINE = {"tekken": "fastokens", "qwen": "fastokens", "sentencepiece": "gigatoken"}
CANNOT = {
    (
        "sentencepiece",
        "fastokens",
    ): "load error: ValueError: pre-tokenizer error: unsupported pre-tokenizer type: Metaspace",
    ("sentencepiece", "tiktoken"): "cannot express this tokenizer",
}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {name: rt.build(name, root / name) for name in rt.FAMILIES}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    texts = rt.hard_texts(300, seed=1)
    return texts, saved_text(tmp_path_factory.mktemp("corpus"), texts, val_fraction=0.0)


def tokenize_and_compare(folder, texts, saved, out, *, engine="auto", num_proc=1, check=None):
    """Tokenize `saved` with the tokenizer in `folder`; assert every document equals transformers'."""
    hf = load_tokenizer(str(folder))
    info = describe(hf, str(folder), "fp")
    out.mkdir()
    report = tk.tokenize(
        info, saved, out, num_proc=num_proc, threads_per_proc=1, batch_size=64, engine=engine, progress=False
    )
    split = assert_documents(out, texts, hf(texts)["input_ids"], info.eos_id)
    return report, hf, info, split


def assert_documents(out, texts, want, eos_id):
    """Assert every stored document of the store in `out` is transformers' ids (`want`) + EOS; its train split."""
    split = TokenStore(out).split("train")
    assert split.num_documents == len(texts)
    wrong = [i for i, ids in enumerate(want) if split.document(i).tolist() != [*ids, eos_id]]
    assert not wrong, f"{len(wrong)} of {len(texts)} documents differ, first {wrong[0]}: {texts[wrong[0]][:60]!r}"
    return split


def store_bytes(out):
    """Every file of the store in `out`: relative path -> bytes."""
    return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("family", rt.FAMILIES)
@pytest.mark.parametrize(
    "engine,num_proc",
    [("auto", 1), ("auto", 2), ("fastokens", 1), ("gigatoken", 1), ("tiktoken", 1), ("tokenizers", 1)],
)
def test_every_document_equals_transformers(families, corpus, tmp_path, family, engine, num_proc):
    """Each engine, named or chosen by auto, gives transformers' ids on every document, or (named)
    is refused before anything is written, with its reason."""
    texts, saved = corpus
    if (family, engine) in CANNOT:
        with pytest.raises(TokenizerError, match=f"tokenize.engine {engine}: {CANNOT[family, engine]}"):
            tokenize_and_compare(families[family], texts, saved, tmp_path / "out", engine=engine)
        assert not list((tmp_path / "out").rglob("*.bin"))
        return
    report, *_ = tokenize_and_compare(
        families[family], texts, saved, tmp_path / "out", engine=engine, num_proc=num_proc
    )
    assert report["engine"] == (AUTO_ENGINE[family] if engine == "auto" else engine), report["engines_tried"]
    if engine == "auto" and family == "sentencepiece":  # fastokens was tried first, and why it was passed over
        assert report["engines_tried"]["fastokens"].startswith("load error: ValueError"), report["engines_tried"]


@pytest.mark.slow
@pytest.mark.parametrize("family", rt.FAMILIES)
def test_every_exact_engine_writes_byte_identical_stores(families, corpus, tmp_path, family):
    texts, saved = corpus
    stores = {}
    for engine in ("fastokens", "gigatoken", "tiktoken", "tokenizers"):
        if (family, engine) not in CANNOT:
            tokenize_and_compare(families[family], texts, saved, tmp_path / engine, engine=engine)
            stores[engine] = store_bytes(tmp_path / engine)
    first, *rest = stores.values()
    assert len(stores) >= 2 and all(other == first for other in rest), list(stores)


@pytest.mark.slow
@pytest.mark.parametrize("family", rt.FAMILIES)
def test_truncation_and_padding_in_tokenizer_json_are_ignored_as_transformers_does(families, corpus, tmp_path, family):
    texts, saved = corpus
    folder = rt.with_truncation_and_padding(families[family], tmp_path / "tok")
    _, _, _, split = tokenize_and_compare(folder, texts, saved, tmp_path / "out")
    lengths = np.diff(split.doc_offsets)
    assert lengths.max() > 8 + 1 and len(set(lengths.tolist())) > 10  # neither cut at 8 nor padded to it


@pytest.mark.slow
@pytest.mark.parametrize("family", rt.FAMILIES)
def test_split_special_tokens_makes_special_text_plain(families, tmp_path, family):
    folder = rt.with_split_special_tokens(families[family], tmp_path / "tok")
    hf = load_tokenizer(str(folder))
    specials = [t for t in ("</s>", "<s>", "<|endoftext|>", "<|im_start|>") if t in hf.get_vocab()]
    texts = [f"before {s} after {s}" for s in specials] * 3 + rt.hard_texts(40, seed=2)
    saved = saved_text(tmp_path, texts, val_fraction=0.0)
    _, hf, _, split = tokenize_and_compare(folder, texts, saved, tmp_path / "out")
    special_ids = {hf.convert_tokens_to_ids(s) for s in specials}
    for i in range(len(specials)):
        body = split.document(i).tolist()[:-1]  # without the EOS moai appends
        assert not special_ids & set(body[len(hf("")["input_ids"]) :]), (family, texts[i], body)


# llama.cpp's vocabularies (`rt.LLAMA_CPP`): what auto picks where it is not fastokens, and what a
# named engine is refused with (fastokens 0.3.5, gigatoken 0.10.0, transformers' GGUF converter)
LLAMA_CPP_AUTO = {"llama-spm": "gigatoken"}
NO_BYTE = "cannot express this tokenizer: .* single bytes have no token"
REMAP = "load error: RuntimeError: Byte remapping failed: no single-byte vocab entry for byte {} "  # its first line
LLAMA_CPP_CANNOT = {
    ("llama-spm", "fastokens"): CANNOT["sentencepiece", "fastokens"],
    ("falcon", "gigatoken"): REMAP.format("0x03"),
    ("starcoder", "gigatoken"): REMAP.format("0xf1"),
    ("falcon", "tiktoken"): NO_BYTE,
    ("starcoder", "tiktoken"): NO_BYTE,
    **{
        (family, "tiktoken"): "cannot express this tokenizer: token .* is not reached by merging its own bytes"
        for family in ("llama-bpe", "deepseek-coder", "deepseek-llm")
    },
    **{
        (family, "tiktoken"): "cannot express this tokenizer: BPE with dropout, byte fallback or sub-word affixes"
        for family in ("llama-spm", "phi-3")
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("family", rt.LLAMA_CPP)
def test_llama_cpp_vocabularies_every_document_equals_transformers(tmp_path, family):
    """Production vocabularies from llama.cpp's tokenizer tests, as transformers reads them: auto and
    each fast engine and tiktoken named give transformers' ids + EOS on every document (llama.cpp's test strings,
    Korean, code, emoji, the vocabulary's own special tokens in text), byte-identical stores from
    every exact engine, or (named) a one-line refusal before anything is written."""
    folder = rt.llama_cpp(family, tmp_path / "tok")
    hf = load_tokenizer(str(folder))
    specials = [t for t in hf.all_special_tokens if t]
    texts = [*rt.llama_cpp_test_strings(), *rt.hard_texts(300, seed=3), *(f"x {t} y{t}\n" for t in specials)]
    saved = saved_text(tmp_path, texts, val_fraction=0.0)
    want = hf(texts)["input_ids"]
    info = describe(hf, str(folder), "fp")
    stores = {}
    # not `tokenizers` named: it is transformers' own library (the families above run it), and the slowest
    for engine in ("auto", "fastokens", "gigatoken", "tiktoken"):
        out = tmp_path / engine
        out.mkdir()
        run = functools.partial(
            tk.tokenize, info, saved, out, num_proc=1, threads_per_proc=1, batch_size=64, engine=engine, progress=False
        )
        if (family, engine) in LLAMA_CPP_CANNOT:
            with pytest.raises(
                TokenizerError, match=f"tokenize.engine {engine}: {LLAMA_CPP_CANNOT[family, engine]}"
            ) as e:
                run()
            assert "\n" not in str(e.value) and not list(out.rglob("*.bin"))
            continue
        report = run()
        assert report["engine"] == (LLAMA_CPP_AUTO.get(family, "fastokens") if engine == "auto" else engine)
        assert_documents(out, texts, want, info.eos_id)
        stores[engine] = store_bytes(out)
    first, *rest = stores.values()
    assert len(stores) >= 2 and all(other == first for other in rest), list(stores)


@pytest.mark.slow
@pytest.mark.parametrize("family", rt.FAMILIES)
def test_giant_documents_are_encoded_in_exact_pieces(families, tmp_path, monkeypatch, family):
    """Documents over the limit go through the piece path (limits made small here) with the ids of
    encoding them whole; the rule was checked on the sample first."""
    monkeypatch.setattr(pieces, "LARGE_DOCUMENT_BYTES", 16 << 10)
    monkeypatch.setattr(pieces, "PIECE_BYTES", 2 << 10)
    small = rt.hard_texts(200, seed=3)
    giants = ["\n".join(small[i::4]) for i in range(4)]  # ~20-40 KB each, Korean, code, emoji, CRLF
    texts = small[:20] + giants + small[20:40]
    saved = saved_text(tmp_path, texts, val_fraction=0.0)
    report, *_ = tokenize_and_compare(families[family], texts, saved, tmp_path / "out")
    assert report["large_documents"] == sum(len(t.encode()) > 16 << 10 for t in texts) > 0
    assert report["forced_cuts"] == 0 and report["large_documents_whole"] is None


def test_a_stretch_without_newline_or_space_is_a_counted_forced_cut():
    data = ("word " * 100 + "x" * 5000 + " tail").encode()
    cuts, forced = pieces.cut_points(data, 512, max_search=2)
    assert forced >= 1 and all(data[c] & 0xC0 != 0x80 for c in cuts)
    assert b"".join(data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)) == data


@pytest.mark.parametrize(
    "text,allowed",
    [
        ("ab\ncd", [3]),
        ("ab\n\ncd", []),
        ("ab \ncd", []),
        ("ab\n cd", []),
        ("a b", [1]),
        ("a  b", []),
        ("가\n나", [4]),
        ("가 나", [3]),
        ("a\u00a0\nb", []),
        ("a\n\u3000b", []),
        ("x */\n/y", []),
        ("a\n(b", []),
        ("a (b", []),
        ("a\n12", [2]),
        ("a 12", [1]),
    ],
)
def test_cuts_only_between_solid_characters(text, allowed):
    arr = np.frombuffer(text.encode(), dtype=np.uint8)
    assert [i for i in range(len(arr)) if pieces._is_cut(arr, i)] == allowed
