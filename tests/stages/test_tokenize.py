"""Token ids equal `tokenizer(text)["input_ids"] + [eos]`; the store reproduces every document;
1 and N workers write identical bytes."""

import dataclasses
import itertools
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import make_texts, saved_text
from moai.errors import TokenizerError
from moai.formats.tokens import TokenStore
from moai.stages import tokenize as tk
from moai.stages.tokenize import engine as engine_module, engines, parts
from moai.stages.tokenize.tiktoken import spec_from_tokenizer_json
from moai.stages.tokenizer import describe, load_tokenizer

UNICODE_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(list("한국어 데이터 토큰 def x(): return 1\n\t🙂🚀👩‍💻")),
    ),
    max_size=80,
)


@pytest.fixture(scope="module", params=["plain", "bos"])
def tok(request, tokenizer_dir, bos_tokenizer_dir):
    folder = tokenizer_dir if request.param == "plain" else bos_tokenizer_dir
    t = load_tokenizer(str(folder))
    return t, describe(t, str(folder), "fp")


@pytest.fixture(scope="module", params=[e.name for e in engines.ENGINES])
def engine(request, tok):
    """The set-up of each engine for the tokenizer (every one of them can run these two)."""
    hf, info = tok
    setup = engine_module.engine_setup(request.param, info, 2)
    if request.param == "tiktoken":
        assert setup.spec is not None
        assert setup.spec.prefix == ((hf.bos_token_id,) if hf.bos_token_id is not None else ())
    return setup


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(
        UNICODE_TEXT | st.sampled_from(["<eos>", "a<pad>b", " <bos> x", "   ", " \n\t ", ""]), min_size=1, max_size=12
    )
)
def test_ids_equal_hf_tokenizer_plus_eos(tok, engine, texts):
    hf, info = tok
    tk.init_encoder(dataclasses.replace(engine, pieces_exact=True))
    try:
        flat, lengths = tk.encode_documents(texts, info.eos_id, tk.token_dtype(info.vocab_size))
    finally:
        tk.clear_encoder()
    ends = np.cumsum(lengths)
    for text, end, n in zip(texts, ends, lengths, strict=True):
        assert flat[end - n : end].tolist() == hf(text)["input_ids"] + [info.eos_id]


def run_tokenize(saved: Path, out: Path, info, num_proc: int, engine: str) -> dict:
    out.mkdir()
    return tk.tokenize(
        info, saved, out, num_proc=num_proc, threads_per_proc=1, batch_size=97, engine=engine, progress=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["tokenizers", "auto", "gigatoken"])
def test_store_reproduces_documents_and_worker_count_does_not_matter(tmp_path, tok, monkeypatch, engine):
    monkeypatch.setattr(parts, "PART_MIN_BYTES", 20_000)  # several parts from a small corpus
    hf, info = tok
    texts = [t for t in make_texts(2600, seed=7) if t.strip()]
    saved = saved_text(tmp_path, texts)
    one = run_tokenize(saved, tmp_path / "one", info, 1, engine)
    two = run_tokenize(saved, tmp_path / "two", info, 2, engine)
    assert one["tokens"] == two["tokens"] and two["processes"] == 2
    assert one["engine"] == two["engine"] == ("fastokens" if engine == "auto" else engine)
    # each worker reports its encoding's wall and CPU seconds (the breakdown benchmark's bound uses them)
    assert len(two["profile"]) == 2 and all(p["wall"] > 0 and p["cpu"] > 0 for p in two["profile"])

    import datasets

    splits = datasets.load_from_disk(str(saved))
    store = TokenStore(tmp_path / "one")
    assert store.dtype == np.dtype("<u2")
    for name in ("train", "validation"):
        split = store.split(name)
        assert split.num_documents == splits[name].num_rows
        assert len(split.parts) > 1 or name == "validation"
        for i, text in enumerate(splits[name]["text"]):
            assert split.document(i).tolist() == hf(text)["input_ids"] + [info.eos_id]
        assert split.doc_offsets[-1] == split.num_tokens

    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "two") for p in (tmp_path / "two").rglob("*") if p.is_file())
    for f in files:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f


@pytest.mark.parametrize("engine", ["fastokens", "tokenizers"])
def test_fastokens_calls_take_fast_batch_size_documents_with_the_same_bytes(tmp_path, tok, monkeypatch, engine):
    """`fast_batch_size` (the plan's: by the text, not 1000 documents) sizes fastokens' calls; the
    other engines keep `batch_size`; the store's bytes do not change."""
    _, info = tok
    texts = [t for t in make_texts(900, seed=3) if t.strip()]
    saved = saved_text(tmp_path, texts)
    calls: list[int] = []
    real = parts.encode_documents

    def counted(batch, *args):
        calls.append(len(batch))
        return real(batch, *args)

    monkeypatch.setattr(parts, "encode_documents", counted)
    stores = {}
    for fast_batch_size in (None, 100_000):
        out = tmp_path / f"out-{fast_batch_size}"
        out.mkdir()
        calls.clear()
        r = tk.tokenize(
            info,
            saved,
            out,
            num_proc=1,
            threads_per_proc=1,
            batch_size=50,
            engine=engine,
            fast_batch_size=fast_batch_size,
            progress=False,
        )
        assert r["engine"] == engine
        most = 50 if fast_batch_size is None or engine != "fastokens" else 100_000
        assert max(calls) <= most and sum(calls) == len(texts)
        assert max(calls) > 50 if most > 50 else max(calls) == 50
        files = sorted(p for p in out.rglob("*") if p.is_file())
        stores[fast_batch_size] = {p.relative_to(out): p.read_bytes() for p in files}
    assert stores[None] == stores[100_000]


def test_a_disk_that_fills_stops_the_parts_with_its_own_error(tmp_path, small_disk, tok, monkeypatch):
    """The first failed write's error is the one raised, with no other under it: the writes queued
    after it are not tried and no part is closed twice (that ended the chain in EBADF)."""
    import errno

    monkeypatch.setattr(parts, "PART_MIN_BYTES", 20_000)  # several parts
    monkeypatch.setattr(parts, "WRITES_AHEAD_BYTES", 1 << 30)  # every write queued: they were all tried
    _, info = tok
    saved = saved_text(tmp_path, [t for t in make_texts(24000, seed=5) if t.strip()])  # ~3 MB of text
    with pytest.raises(OSError) as raised:
        tk.tokenize(
            info,
            saved,
            small_disk / "out",
            num_proc=1,
            threads_per_proc=1,
            batch_size=40,
            engine="fastokens",
            progress=False,
        )
    chain, err = [], raised.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    assert raised.value.errno == errno.ENOSPC
    assert [e for e in chain if isinstance(e, OSError)] == [raised.value], chain


def test_ids_go_through_the_page_cache_once_the_disk_is_behind_with_the_same_bytes(tmp_path, tok, monkeypatch):
    from moai import store
    from moai.stages.tokenize import idsfile

    monkeypatch.setattr(parts, "PART_MIN_BYTES", 20_000)  # several parts from a small corpus
    _, info = tok
    saved = saved_text(tmp_path, [t for t in make_texts(2600, seed=7) if t.strip()])
    direct = run_tokenize(saved, tmp_path / "direct", info, 1, "auto")
    monkeypatch.setattr(idsfile.Pace, "MIN_BYTES", 1)  # measured from the first direct write on
    monkeypatch.setattr(idsfile.Pace, "FACTOR", 1e12)  # and no disk is fast enough
    behind = run_tokenize(saved, tmp_path / "behind", info, 1, "auto")

    files = sorted(p.relative_to(tmp_path / "direct") for p in (tmp_path / "direct").rglob("*") if p.is_file())
    bins = [(tmp_path / "direct" / f).stat().st_size for f in files if f.suffix == ".bin"]
    assert len(bins) > 2
    for f in files:
        assert (tmp_path / "direct" / f).read_bytes() == (tmp_path / "behind" / f).read_bytes(), f
    # every part's whole blocks went past the page cache; once behind, only the first part's did
    assert direct["profile"][0]["ids_direct_bytes"] == sum(n - n % idsfile.ALIGN for n in bins)
    assert behind["profile"][0]["ids_direct_bytes"] == bins[0] - bins[0] % idsfile.ALIGN > 0
    # the digests the writer took as it wrote (used by publishing) are the files' own
    for out in ("direct", "behind"):
        assert store.describe_files(tmp_path / out) == store.describe_files(tmp_path / out)  # 2nd: read again


@given(sizes=st.lists(st.integers(0, 5_000_000), max_size=300))
def test_part_ranges_cover_rows_in_order(sizes):
    ranges = tk.part_ranges(np.array(sizes, dtype=np.int64))
    assert sum(b - a for a, b in ranges) == len(sizes)
    assert all(a < b for a, b in ranges)
    assert all(a == b_prev for (_, b_prev), (a, _) in itertools.pairwise(ranges))
    assert len(ranges) <= tk.MAX_PARTS
    if sum(sizes) >= 2 * tk.PART_MIN_BYTES and max(sizes) <= sum(sizes) // 4:
        assert len(ranges) >= 2


def test_large_vocab_uses_uint32():
    assert tk.token_dtype(65536) == np.dtype("<u2")
    assert tk.token_dtype(65537) == np.dtype("<u4")


def test_engine_choice_names_every_engine_tried_and_why(tok):
    import json

    from tokenizers import Tokenizer

    _, info = tok
    data = json.loads(info.backend_json)
    data["normalizer"] = {"type": "Lowercase"}
    changed = dataclasses.replace(info, backend_json=json.dumps(data))
    backend = Tokenizer.from_str(changed.backend_json)
    # named explicitly, an engine that cannot run the tokenizer is an error before anything is written
    with pytest.raises(
        TokenizerError, match=r"tokenize\.engine tiktoken: cannot express this tokenizer: normalizer Lowercase"
    ):
        tk.choose_engine("tiktoken", changed, ["Some Text"], 1, [backend.encode("Some Text").ids])

    reference = tk.transformers_reference(info)
    setup, encoder, tried = tk.choose_engine("tokenizers", info, ["x"], 1, reference(["x"]))
    assert setup.engine == encoder.name == "tokenizers" and list(tried) == ["tokenizers"]
    texts = make_texts(50)
    setup, encoder, tried = tk.choose_engine("auto", info, texts, 1, reference(texts))
    assert setup.engine == "fastokens" and list(tried) == ["fastokens"]
    assert tried["fastokens"].startswith("matches transformers on all 50 sampled documents")


def test_an_encoder_that_differs_from_transformers_writes_nothing(tok):
    """The reference is transformers itself: a backend that differs from it is refused, whatever the engine."""
    import json

    _, info = tok
    data = json.loads(info.backend_json)
    data["normalizer"] = {"type": "Lowercase"}
    changed = dataclasses.replace(info, backend_json=json.dumps(data))
    with pytest.raises(TokenizerError, match="no engine gives transformers' ids on the sample") as err:
        tk.choose_engine("auto", changed, ["Hello World"], 1, tk.transformers_reference(info)(["Hello World"]))
    for name in ("fastokens", "tokenizers"):
        where = (
            rf"{name}: ids differ from transformers on sample document 0 \('Hello World'\) at token [01]: id \d+ where"
        )
        assert re.search(where, str(err.value)), str(err.value)
    assert "tiktoken: cannot express this tokenizer: normalizer Lowercase" in str(err.value)
    # an engine's own loader refusing the tokenizer.json is its reason, word for word
    assert "gigatoken: load error: RuntimeError: Unsupported normalizer type: Lowercase" in str(err.value)


def test_an_engine_that_differs_on_the_sample_is_passed_over_with_where_it_parts(tok, monkeypatch):
    """auto falls back to the next exact engine and says where the first one's ids part from
    transformers'; the same engine named in the config is refused before anything is written."""
    _, info = tok
    original = engines.FastokensEncoder.encode_flat

    def off_by_one(self, texts, add_special_tokens=True):  # the last id of every text is wrong
        ids, offsets = original(self, texts, add_special_tokens)
        ids = ids.copy()
        ids[offsets[1:] - 1] += 1
        return ids, offsets

    monkeypatch.setattr(engines.FastokensEncoder, "encode_flat", off_by_one)
    texts = ["hello world", "a b c"]
    want = tk.transformers_reference(info)(texts)
    setup, _, tried = tk.choose_engine("auto", info, texts, 1, want)
    assert setup.engine == "gigatoken" and list(tried) == ["fastokens", "gigatoken"]
    n = len(want[0]) - 1
    assert tried["fastokens"].startswith(
        f"ids differ from transformers on sample document 0 ('hello world') at token {n}"
    )
    with pytest.raises(
        TokenizerError, match=r"tokenize\.engine fastokens: ids differ from transformers on sample document 0"
    ):
        tk.choose_engine("fastokens", info, texts, 1, want)


def test_a_missing_engine_is_named_with_how_to_install_it(tok, monkeypatch):
    import builtins

    _, info = tok
    real_import = builtins.__import__

    def no_fastokens(name, *args, **kwargs):
        if name == "fastokens":
            raise ModuleNotFoundError("No module named 'fastokens'", name="fastokens")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_fastokens)
    texts = ["hello world"]
    setup, _, tried = tk.choose_engine("auto", info, texts, 1, tk.transformers_reference(info)(texts))
    assert setup.engine == "gigatoken"
    assert tried["fastokens"] == "not installed (No module named 'fastokens'); pip install 'fastokens==0.3.5'"


def test_an_engines_error_of_several_lines_is_one_line_of_the_report(tok, monkeypatch):
    """gigatoken's Rust errors run over lines (a blank line, then the source location): a named
    engine's refusal (and the report's reason) keeps the first."""
    _, info = tok

    def refuses(self, setup):
        raise RuntimeError(
            "Byte remapping failed: no single-byte vocab entry for byte 0x03\n\nLocation:\n    src/x.rs:88"
        )

    monkeypatch.setattr(engines.GigatokenEncoder, "__init__", refuses)
    texts = ["hello world"]
    want = tk.transformers_reference(info)(texts)
    with pytest.raises(TokenizerError, match="byte 0x03 \\(tokenizer") as err:
        tk.choose_engine("gigatoken", info, texts, 1, want)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("large", [False, True])
def test_the_piece_rule_is_checked_only_when_a_document_is_large_enough(tmp_path, tok, monkeypatch, large):
    """Without a document over LARGE_DOCUMENT_BYTES the cut rule is never used: it is not checked
    (~0.3-0.6 s a run) and no process may encode in pieces; with one it is checked and allowed."""
    from moai.stages.tokenize import pieces

    _, info = tok
    texts = [t for t in make_texts(300, seed=3) if t.strip()]
    saved = saved_text(tmp_path, texts)
    checked = []
    original = pieces.check_cut_rule
    monkeypatch.setattr(pieces, "check_cut_rule", lambda *a, **k: checked.append(1) or original(*a, **k))
    if large:
        monkeypatch.setattr(pieces, "LARGE_DOCUMENT_BYTES", max(len(t.encode()) for t in texts) - 1)
    choice = tk.choose_encoder(info, saved, "auto", 1)
    assert bool(checked) is large
    assert choice.pieces_reason is None and choice.setup.pieces_exact is large


def test_tiktoken_hands_the_parts_arrays_with_the_same_ids(tok):
    """The parts take tiktoken's ids as arrays straight from its buffer (no Python int per
    token); they are the very ids of the list path the checks compare with transformers."""
    from moai.stages.tokenize.tiktoken import TiktokenEncoder

    _, info = tok
    enc = TiktokenEncoder(spec_from_tokenizer_json(info.backend_json), 2)
    texts = [*make_texts(300, seed=5), "<eos>", "", "a<pad>b", "한국어 🙂"]
    arrays = enc.encode_arrays(texts)
    assert all(isinstance(a, np.ndarray) and a.dtype == np.uint32 for a in arrays)
    assert [a.tolist() for a in arrays] == enc.encode_batch(texts, True)
    from moai.stages.tokenize.engine import state

    tk.init_encoder(engine_module.engine_setup("tiktoken", info, 1))
    try:
        ids, offsets = state["encoder"].encode_flat(texts, True)
        assert ids.dtype == np.uint32
        assert [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)] == enc.encode_batch(texts, True)
    finally:
        tk.clear_encoder()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(st.none() | UNICODE_TEXT | st.sampled_from(["<eos>", "a<pad>b", "", " \n"]), min_size=1, max_size=9),
    cut=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    large=st.booleans(),
)
def test_gigatoken_takes_the_arrow_text_as_it_is_with_the_ids_of_the_strings(tok, texts, cut, large):
    """The parts hand gigatoken the saved Arrow text (its buffers, no `str`): a slice at any offset,
    either string type, nulls as "" (`filled`); its ids are those of the same texts as strings."""
    import pyarrow as pa

    from moai.formats.text import filled

    _, info = tok
    column = pa.array(["x", "y", "z", *texts, "w", "v"], type=pa.large_string() if large else pa.string())
    part = filled(column.slice(cut[0], 3 + len(texts) + 2 - cut[0] - cut[1]))
    strings = [t or "" for t in ["x", "y", "z", *texts, "w", "v"][cut[0] : len(column) - cut[1]]]
    encoder = engines.GigatokenEncoder(engine_module.engine_setup("gigatoken", info, 2))
    got, want = encoder.encode_documents(part, info.eos_id), encoder.encode_documents(strings, info.eos_id)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


@given(
    docs=st.lists(st.lists(st.integers(0, 2**32 - 1), max_size=6), max_size=8),
    prefix=st.lists(st.integers(0, 9), max_size=2),
    suffix=st.lists(st.integers(0, 9), max_size=2),
)
def test_wrap_puts_the_affixes_around_every_document(docs, prefix, suffix):
    ids, offsets = engines.wrap(engines.flat_of(docs), tuple(prefix), tuple(suffix))
    assert engines.lists_of((ids, offsets)) == [[*prefix, *d, *suffix] for d in docs]


TEXTS = ["hello world", "", " <eos> and <bos> as text", "a\n\nb", "  spaces  ", "한국어 문장", "x" * 3000]


def _fastokens(info, tok=None):
    return engines.FastokensEncoder(engine_module.engine_setup("fastokens", info, 2), tok)


def test_fastokens_puts_eos_after_every_document_in_its_post_processor(tok):
    """The EOS step is added to fastokens' post-processor: the parts take its buffer as it comes,
    and the check's call (`encode_flat`) still gives transformers' ids, EOS taken off again."""
    hf, info = tok
    enc = _fastokens(info)
    ids, offsets = enc.encode_documents(TEXTS, info.eos_id)
    assert enc.eos == info.eos_id
    want = [hf(t)["input_ids"] for t in TEXTS]
    assert engines.lists_of((ids, offsets)) == [[*w, info.eos_id] for w in want]
    assert engines.lists_of(enc.encode_flat(TEXTS, True)) == want
    plain = [hf(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    assert engines.lists_of(enc.encode_flat(TEXTS, False)) == plain


def test_fastokens_folds_eos_into_the_tokenizers_own_template(tok):
    """A tokenizer whose post-processor is a template (BOS in one of these) gets EOS at the end of
    that template: one pass over each document's ids, not a second step after it."""
    hf, info = tok
    own = json.loads(str(engines.fastokens_tokenizer(info.backend_json).post_processor))
    assert own["type"] == "TemplateProcessing"  # as transformers saves them
    enc = _fastokens(info)
    enc.ready()
    processor = json.loads(str(enc.tok.post_processor))
    assert processor["type"] == "TemplateProcessing"
    specials = [s.get("SpecialToken", {}).get("id") for s in processor["single"]]
    assert specials == [s.get("SpecialToken", {}).get("id") for s in own["single"]] + [hf.eos_token]
    if hf.bos_token_id is not None:
        assert specials[0] == hf.bos_token
    ids, offsets = enc.encode_documents(TEXTS, info.eos_id)
    assert engines.lists_of((ids, offsets)) == [[*hf(t)["input_ids"], info.eos_id] for t in TEXTS]


def test_eos_goes_into_the_last_template_only_where_its_name_means_eos():
    a = {"Sequence": {"id": "A", "type_id": 0}}
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    template = {"type": "TemplateProcessing", "single": [bos, a], "pair": [a], "special_tokens": {}}
    folded = engines.eos_in_template({"type": "Sequence", "processors": [{"type": "ByteLevel"}, template]}, "</s>", 2)
    assert folded is not None
    assert folded["processors"][0] == {"type": "ByteLevel"}
    assert folded["processors"][1]["single"] == [bos, a, {"SpecialToken": {"id": "</s>", "type_id": 0}}]
    assert folded["processors"][1]["special_tokens"]["</s>"]["ids"] == [2]
    assert template["single"] == [bos, a]  # the tokenizer's own is left as it was
    assert engines.eos_in_template({"type": "ByteLevel"}, "</s>", 2) is None
    template_first = {"type": "Sequence", "processors": [template, {"type": "ByteLevel"}]}
    assert engines.eos_in_template(template_first, "</s>", 2) is None
    assert engines.eos_in_template(None, "</s>", 2) is None
    taken = {**template, "special_tokens": {"</s>": {"id": "</s>", "ids": [7], "tokens": ["</s>"]}}}
    assert engines.eos_in_template(taken, "</s>", 2) is None


class _IgnoresPostProcessors:
    """A fastokens tokenizer that accepts a new post-processor and keeps its own (as a version
    without Sequence post-processors might)."""

    def __init__(self, tok):
        self.__dict__["_tok"] = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __setattr__(self, name, value):
        pass


def test_fastokens_whose_post_processor_cannot_take_the_eos_step_gets_eos_by_numpy(tok):
    hf, info = tok
    enc = _fastokens(info, _IgnoresPostProcessors(engines.fastokens_tokenizer(info.backend_json)))
    ids, offsets = enc.encode_documents(TEXTS, info.eos_id)
    assert enc.eos is None  # the probe saw no EOS: the step is not used
    assert engines.lists_of((ids, offsets)) == [[*hf(t)["input_ids"], info.eos_id] for t in TEXTS]


def test_a_document_the_eos_step_left_without_eos_is_an_error_not_a_store(tok, monkeypatch):
    _, info = tok
    enc = _fastokens(info)
    enc.encode_documents(TEXTS[:1], info.eos_id)
    real = enc._call

    def drops_last(texts, special):  # the step stopped working: the last id of each text is gone
        return engines.unwrap_suffix(real(texts, special), info.eos_id)

    monkeypatch.setattr(enc, "_call", drops_last)
    with pytest.raises(RuntimeError, match="left out EOS"):
        enc.encode_documents(["hello world"], info.eos_id)


def test_pipelined_helpers_are_renewed_after_their_share_in_order_and_the_old_threads_gone_first():
    """`_pipelined` with `renew_after`: the results come in order, every item once; new helper
    threads take over after each share, started only once the old ones have ended (their OS
    threads gone), so that what an engine keeps per thread is freed and reused."""
    import threading

    live_at_submit: list[set[int]] = []

    def weigh(_):  # called as each item is handed to the helpers
        live_at_submit.append({int(t) for t in os.listdir("/proc/self/task")})
        return 1

    def call(item):
        return item, threading.get_native_id()

    out = list(parts._pipelined(range(12), call, threads=2, ahead=4, weigh=weigh, renew_after=3))
    assert [item for item, _ in out] == list(range(12))
    helpers = [{tid for _, tid in out[i : i + 3]} for i in range(0, 12, 3)]
    for k, (before, after) in enumerate(itertools.pairwise(helpers)):
        assert not before & after  # new threads each share
        assert not before & live_at_submit[3 * (k + 1)]  # the old threads had ended before
    kept = list(parts._pipelined(range(12), call, threads=2, ahead=4))
    assert len({tid for _, tid in kept}) <= 2


def test_renewed_encode_threads_write_the_same_bytes(tmp_path, tok, monkeypatch):
    """fastokens with a pool of one (a call runs on the calling thread, which keeps its word cache):
    the parts renew their encode threads every RENEW_THREADS_BYTES of text, and the store's bytes
    are those of threads kept throughout."""
    import threading

    _, info = tok
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "1")
    texts = [t for t in make_texts(900, seed=5) if t.strip()]
    saved = saved_text(tmp_path, texts)
    threads: set[int] = set()
    real = parts.encode_documents

    def recorded(batch, *args):
        threads.add(threading.get_native_id())
        return real(batch, *args)

    monkeypatch.setattr(parts, "encode_documents", recorded)
    stores, used = {}, {}
    for renew in (1 << 40, 2_000):
        monkeypatch.setattr(parts, "RENEW_THREADS_BYTES", renew)
        out = tmp_path / f"out-{renew}"
        out.mkdir()
        threads.clear()
        r = tk.tokenize(
            info, saved, out, num_proc=1, threads_per_proc=2, batch_size=20, engine="fastokens", progress=False
        )
        assert r["engine"] == "fastokens"
        used[renew] = len(threads)
        stores[renew] = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert used[1 << 40] <= engines.CALLS_IN_FLIGHT < used[2_000]
    assert stores[1 << 40] == stores[2_000]


def test_fastokens_pool_is_one_thread_a_call_up_to_two_cores_and_a_users_setting_stays(monkeypatch):
    monkeypatch.delenv("FASTOKENS_BPE_THREADS", raising=False)
    engines.size_fastokens_pool(16)
    assert "FASTOKENS_BPE_THREADS" not in os.environ  # its own pool of every core, as measured on 16
    engines.size_fastokens_pool(2)
    assert os.environ["FASTOKENS_BPE_THREADS"] == "1"
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "3")
    engines.size_fastokens_pool(1)
    assert os.environ["FASTOKENS_BPE_THREADS"] == "3"


def test_a_prebuild_given_the_threads_sizes_the_pool_and_leaves_the_encoder_ready(tokenizer_dir, monkeypatch):
    """With the plan's threads, `prebuild` sizes fastokens' pool and makes the encoder ready (its
    EOS step appended and probed), so the stage's first calls wait for nothing; without, it
    encodes nothing. Either way the ids are transformers' + EOS."""
    monkeypatch.delenv("FASTOKENS_BPE_THREADS", raising=False)
    info = describe(load_tokenizer(str(tokenizer_dir)), str(tokenizer_dir), "fp")
    setup = dataclasses.replace(engine_module.engine_setup("fastokens", info, 1), eos_id=info.eos_id)
    engines.prebuild(info.backend_json, info.split_special_tokens, info.eos_id)
    idle = engines.take_prebuilt(setup)
    assert idle is not None and idle._pending_eos == info.eos_id and idle.eos is None
    assert "FASTOKENS_BPE_THREADS" not in os.environ
    engines.prebuild(info.backend_json, info.split_special_tokens, info.eos_id, threads=2)
    ready = engines.take_prebuilt(setup)
    assert ready is not None and ready._pending_eos is None and ready.eos == info.eos_id
    assert os.environ["FASTOKENS_BPE_THREADS"] == "1"
    hf = load_tokenizer(str(tokenizer_dir))
    texts = ["hello world", "", "한국어 문서 and code: def f(x): return x"]
    want = [[*hf(t)["input_ids"], info.eos_id] for t in texts]
    for encoder in (idle, ready):
        assert engines.lists_of(encoder.encode_documents(texts, info.eos_id)) == want


def test_the_encoder_built_ahead_is_taken_once_and_waited_for(tokenizer_dir):
    """`prebuild` builds fastokens from the pipeline transformers runs (its `backend_json`), ready to
    encode; `take_prebuilt` waits while a prebuild runs rather than build the encoder again, and
    takes it once. Its ids are transformers' + EOS."""
    import threading

    hf = load_tokenizer(str(tokenizer_dir))
    info = describe(hf, str(tokenizer_dir), "fp")
    setup = engine_module.engine_setup("fastokens", info, 1)
    taken: list = []
    ended = engines.prebuild_begins()
    waiter = threading.Thread(target=lambda: taken.append(engines.take_prebuilt(setup)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # waits for the prebuild rather than build the encoder again
    engines.prebuild(info.backend_json, info.split_special_tokens, info.eos_id, 1)
    ended()
    waiter.join(10)
    assert taken and taken[0] is not None and taken[0].eos == info.eos_id  # made ready: EOS step probed
    assert engines.take_prebuilt(setup) is None  # taken once
    texts = ["hello world", "", "한국어 문서 and code: def f(x): return x"]
    assert engines.lists_of(taken[0].encode_documents(texts, info.eos_id)) == [
        [*hf(t)["input_ids"], info.eos_id] for t in texts
    ]
