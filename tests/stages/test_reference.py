"""transformers in a process of its own (`moai.stages.tokenize.reference`): a cold prepare takes
the tokenizer's description and the check's ids from it, the ids stay exact, and only a folder with
the very same files is served by it."""

import json
import shutil
import time
from pathlib import Path

import datasets
import pytest

from conftest import config_dict
from moai.config import parse_config
from moai.errors import ConfigError, TokenizerError
from moai.formats.tokens import TokenStore
from moai.pipeline import prepare
from moai.pipeline.walk import cold_cache
from moai.stages import tokenizer as tokenizer_stage
from moai.stages.tokenize import engine as engine_module, engines, reference
from moai.stages.tokenize.engine import sample_rows, sample_texts
from moai.stages.tokenizer import load_tokenizer


@pytest.mark.slow
def test_a_cold_prepare_loads_transformers_only_in_the_reference_process(tmp_path, corpus, tokenizer_dir, monkeypatch):
    def not_here(*_a, **_k):
        raise AssertionError("transformers loaded the tokenizer in the main process")

    monkeypatch.setattr(tokenizer_stage, "loaded_tokenizer", not_here)
    served = []
    original = reference.Reference.prefetched
    monkeypatch.setattr(reference.Reference, "prefetched", lambda self, tag: served.append(tag) or original(self, tag))
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    result = prepare(cfg, progress=False)
    assert served == [result["stages"]["save"]["key"]], "the check asked for the sample made during save"
    manifest = json.loads((Path(result["token_store"]) / "_manifest.json").read_text())["report"]
    assert manifest["check_sampled_ahead"] is True and manifest["check_parts"]["transformers"] == 0
    # the parts were encoded with fastokens while the check waited for transformers' ids, and kept
    assert manifest["check_beside_encoding"] is True and manifest["encoded_twice"] is False
    assert manifest["engine"] == "fastokens"
    # and transformers had encoded every document of the sample while filter ran (it drops none here)
    sample = sample_texts(tmp_path / "cache" / "save" / result["stages"]["save"]["key"])
    assert manifest["check_sample_encoded_during_filter"] == len(sample) > 0
    assert not reference._running and not engines._prebuilt  # the process ended with the run

    # exact as ever: every stored document is transformers' ids + EOS
    _assert_every_document_is_transformers(tmp_path, result, tokenizer_dir)


@pytest.mark.slow
def test_a_document_for_pieces_holds_the_encoding_until_the_check(tmp_path, corpus, tokenizer_dir, monkeypatch):
    """Whether pieces give the same ids is the check's to say: with a document large enough for
    them the parts wait for it (the stage reads each split's sizes once for this and its parts)."""
    from moai.stages.tokenize import pieces

    monkeypatch.setattr(pieces, "LARGE_DOCUMENT_BYTES", 4 << 10)
    giant = " ".join(f"word{i} 한국어 def f(x): return x" for i in range(400))  # ~12 KB, one line
    with open(corpus, "a") as f:
        f.write(json.dumps({"text": giant}) + "\n")
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    result = prepare(cfg, progress=False)
    manifest = json.loads((Path(result["token_store"]) / "_manifest.json").read_text())["report"]
    assert manifest["check_sampled_ahead"] is True and "check_beside_encoding" not in manifest
    assert manifest["large_documents"] >= 1 and manifest["large_documents_whole"] is None
    assert manifest["check_parts"]["pieces"] > 0
    _assert_every_document_is_transformers(tmp_path, result, tokenizer_dir)


def _assert_every_document_is_transformers(tmp_path, result, tokenizer_dir):
    """Every document of the run's token store is transformers' ids of its saved text + EOS."""
    hf = load_tokenizer(str(tokenizer_dir))
    store = TokenStore(result["token_store"])
    saved = datasets.load_from_disk(str(tmp_path / "cache" / "save" / result["stages"]["save"]["key"]))
    for split in ("train", "validation"):
        texts = saved[split]["text"]
        assert store.split(split).num_documents == len(texts)
        for i, text in enumerate(texts):
            assert store.split(split).document(i).tolist() == [*hf(text)["input_ids"], hf.eos_token_id]


@pytest.mark.slow
def test_the_process_ends_once_the_runs_last_tokenize_check_is_done(tmp_path, tokenizer_dir, monkeypatch):
    """Two sources, one tokenize stage each: the process serves the first stage's check and stays;
    after the second stage's check it is ended at once, while that stage still encodes (what it
    holds is freed for the ids' files), not at the end of the run."""
    from conftest import make_texts, write_jsonl

    seen = []
    original = reference.checked
    published = tmp_path / "cache" / "tokenize"

    def checked(ref):
        before = ref.uses
        original(ref)
        if before == 1:
            # ended by the closer thread, now. That thread reaps the process: joining it here as well
            # races for the exit status (the loser of waitpid reads ECHILD and still sees it alive)
            deadline = time.monotonic() + 60
            while ref.process.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
        stores = sorted(p.name for p in published.iterdir() if not p.name.startswith("."))
        seen.append((before, ref.process.is_alive(), ref in reference._running, len(stores)))

    monkeypatch.setattr(reference, "checked", checked)
    sources = []
    for name, seed in (("a", 1), ("b", 2)):
        data = write_jsonl(tmp_path / f"{name}.jsonl", [{"text": t} for t in make_texts(3000, seed=seed)])
        sources.append({"name": name, "path": str(data), "weight": 1.0})
    cfg_dict = config_dict(tmp_path, "unused", {"path": str(tokenizer_dir)})
    del cfg_dict["source"]
    cfg = parse_config({**cfg_dict, "sources": sources})
    prepare(cfg, progress=False)
    # (uses left, alive, served, token stores published): the second check is that of the second
    # source's stage, before its store is published
    assert seen == [(2, True, True, 0), (1, False, False, 1)]
    assert not reference._running


def test_a_run_that_reuses_every_stage_starts_no_process(tmp_path, corpus, tokenizer_dir, monkeypatch):
    """The process starts with the first stage a run builds: a cold run starts one, the same run
    again (every stage reused) none; removing the token store starts one for that stage alone."""
    started = []
    original = reference.Reference.__init__

    def counting(self, *args, **kwargs):
        started.append(args[0])
        original(self, *args, **kwargs)

    monkeypatch.setattr(reference.Reference, "__init__", counting)
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    first = prepare(cfg, progress=False)
    assert len(started) == 1 and all(s["built"] for s in first["stages"].values())
    again = prepare(cfg, progress=False)
    assert len(started) == 1, "a run that built nothing started transformers' process"
    assert not any(s["built"] for s in again["stages"].values()) and again["token_store"] == first["token_store"]
    shutil.rmtree(first["token_store"])
    third = prepare(cfg, progress=False)
    assert len(started) == 2 and [n for n, s in third["stages"].items() if s["built"]] == ["tokenize"]
    assert third["stages"]["tokenize"]["key"] == first["stages"]["tokenize"]["key"]
    assert not reference._running


def test_on_a_cold_cache_the_process_starts_before_the_preflight(tmp_path, corpus, tokenizer_dir):
    """`moai prepare` gives its preflight checks as `first`: with no token store in the cache the
    process is already loading while they run; with one, nothing starts before the stages (and
    nothing at all when every stage is reused). A failing preflight leaves no process behind."""
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    seen = []

    def first():
        seen.append([ref.process.is_alive() for ref in reference._running])

    assert cold_cache(cfg)
    prepare(cfg, progress=False, first=first)
    assert seen == [[True]] and not reference._running
    assert not cold_cache(cfg)
    again = prepare(cfg, progress=False, first=first)
    assert seen[1] == [] and not any(s["built"] for s in again["stages"].values())

    cold = parse_config(config_dict(tmp_path / "other", corpus, {"path": str(tokenizer_dir)}))

    def failing():
        assert len(reference._running) == 1
        raise ConfigError("preflight: no")

    with pytest.raises(ConfigError, match="preflight: no"):
        prepare(cold, progress=False, first=failing)
    assert not reference._running and not engines._prebuilt
    assert not (tmp_path / "other" / "cache" / "convert").exists()  # no stage ran


def _maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps (Linux)")
def test_transformers_runs_without_torch_there_and_with_it_where_the_folder_needs_it(tokenizer_dir, monkeypatch):
    """The process hides torch from transformers (its tokenizers need none of it) and gives the same
    description and ids; a folder that fails to load so is loaded again in a process with torch."""
    from conftest import serve_needing_torch

    texts = ["hello world", "안녕하세요 <bos> x", "", "def f():\n\treturn 1\n"]
    hf = load_tokenizer(str(tokenizer_dir))
    want = hf(texts)["input_ids"]
    ref = reference.Reference(tokenizer_dir)
    try:
        info = ref.info(str(tokenizer_dir))
        assert ref.without_torch and not _maps_torch(ref.process.pid)
        assert ref.ids(texts) == want
    finally:
        ref.close()

    monkeypatch.setattr(reference, "_serve", serve_needing_torch)
    ref = reference.Reference(tokenizer_dir)
    try:
        first = ref.process.pid
        again = ref.info(str(tokenizer_dir))
        assert not ref.without_torch and ref.process.pid != first and _maps_torch(ref.process.pid)
        assert again == info and ref.ids(texts) == want
    finally:
        ref.close()


@pytest.mark.slow
def test_only_a_folder_with_the_same_files_is_served(tmp_path, tokenizer_dir, bos_tokenizer_dir):
    copy = tmp_path / "copy"
    shutil.copytree(tokenizer_dir, copy)
    cfg = parse_config(config_dict(tmp_path, "x.jsonl", {"path": str(tokenizer_dir)}))
    with reference.prefetch(cfg) as ref:
        assert ref is not None
        assert reference.for_folder(copy) is ref
        assert reference.for_folder(bos_tokenizer_dir) is None
        info = ref.info("named", "fp")
        assert info.name_or_path == "named" and info.fingerprint == "fp"
        assert ref.ids(["hello world"]) == load_tokenizer(str(tokenizer_dir))(["hello world"])["input_ids"]
    assert reference.for_folder(copy) is None and not ref.process.is_alive()


def test_the_prebuild_thread_has_ended_when_the_block_ends(tmp_path, tokenizer_dir):
    """A run that ends at once (every stage reused) leaves no prebuild thread behind: one still in
    fastokens' Rust code when Python exits is unwound by force and aborts the process."""
    import threading

    cfg = parse_config(config_dict(tmp_path, "x.jsonl", {"path": str(tokenizer_dir)}))
    for _ in range(3):
        with reference.prefetch(cfg) as ref:
            assert ref is not None
        assert not [t for t in threading.enumerate() if t.name == "moai-prebuild"]
        assert not engines._prebuilt


@pytest.mark.slow
def test_a_tokenizer_the_process_cannot_load_is_one_error_naming_it(tmp_path, tokenizer_dir):
    broken = tmp_path / "broken"
    shutil.copytree(tokenizer_dir, broken)
    (broken / "tokenizer.json").write_text("{not json")
    cfg = parse_config(config_dict(tmp_path, "x.jsonl", {"path": str(broken)}))
    with reference.prefetch(cfg) as ref, pytest.raises(TokenizerError, match="cannot load tokenizer"):
        assert ref is not None
        ref.info(str(broken))


def test_no_process_for_remote_code_chat_data_or_a_hub_name(tmp_path, tokenizer_dir):
    for tokenizer, source in (
        ({"path": str(tokenizer_dir), "trust_remote_code": True}, {}),
        ({"path": str(tokenizer_dir)}, {"format": "chat"}),
        ({"path": "org/some-model"}, {}),
    ):
        cfg = parse_config(config_dict(tmp_path, "x.jsonl", tokenizer, source=source))
        with reference.prefetch(cfg) as ref:
            assert ref is None


@pytest.mark.slow
def test_the_sample_made_during_save_is_the_checks_own_sample(tmp_path, corpus, tokenizer_dir):
    """What the process samples from save's input before save writes is what `sample_texts` reads from
    save's output (train split, validation rows taken out), and its ids are transformers' own."""
    from moai.stages.save import save
    from moai.stages.tokenize.engine import sample_texts_before_save

    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}, split={"val_fraction": 0.3}))
    result = prepare(cfg, progress=False)
    save_input = tmp_path / "cache" / "filter" / result["stages"]["filter"]["key"]
    save_output = tmp_path / "cache" / "save" / result["stages"]["save"]["key"]
    assert sample_texts_before_save(save_input, cfg.split) == sample_texts(save_output)

    again = tmp_path / "again"
    with reference.prefetch(cfg) as ref:
        assert ref is not None
        reference.sample_ahead("tag", save_input, cfg.split)
        save(cfg.split, save_input, again, max_shard_size=cfg.save.max_shard_size)
        texts, (ids, offsets) = ref.prefetched("tag")
        assert ref.prefetched("tag") is None and ref.prefetched("never asked") is None  # taken once
    assert texts == sample_texts(again) and len(texts) > 10
    want = load_tokenizer(str(tokenizer_dir))(texts)["input_ids"]
    assert engines.lists_of((ids, offsets)) == want


@pytest.mark.slow
def _off_by_one(encode_flat):
    """An engine's `encode_flat` made to differ from transformers: the last id of every text is wrong."""

    def off_by_one(self, texts, add_special_tokens=True):
        ids, offsets = encode_flat(self, texts, add_special_tokens)
        ids = ids.copy()
        ids[offsets[1:] - 1] += 1
        return ids, offsets

    return off_by_one


def test_parts_encoded_beside_the_check_with_an_engine_it_passes_over_are_encoded_again(
    tmp_path, corpus, tokenizer_dir, monkeypatch
):
    """fastokens (made to differ: the last id of every text is wrong) encodes the parts while the check
    runs; the check passes it over for gigatoken, and every part is encoded again: each stored
    document is transformers' ids + EOS, none of fastokens' wrong ones is kept."""
    monkeypatch.setattr(engines.FastokensEncoder, "encode_flat", _off_by_one(engines.FastokensEncoder.encode_flat))
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    result = prepare(cfg, progress=False)
    manifest = json.loads((Path(result["token_store"]) / "_manifest.json").read_text())["report"]
    assert manifest["check_beside_encoding"] is True and manifest["encoded_twice"] is True
    assert manifest["engine"] == "gigatoken" and manifest["engines_tried"]["fastokens"].startswith("ids differ")
    _assert_every_document_is_transformers(tmp_path, result, tokenizer_dir)


def test_gigatoken_named_is_built_ahead_and_encodes_beside_the_check(tmp_path, corpus, tokenizer_dir, monkeypatch):
    """`tokenize.engine: gigatoken`: gigatoken (not fastokens) is built while the stages before run,
    the parts are encoded with it while the check waits for transformers' ids, and every document
    is exact. Made to differ, it is refused and nothing is published."""
    built = []
    original = engines.prebuild_gigatoken
    monkeypatch.setattr(engines, "prebuild_gigatoken", lambda setup: built.append(setup.engine) or original(setup))
    monkeypatch.setattr(engines, "prebuild", lambda *a, **k: built.append("fastokens"))
    loaded_here = []
    monkeypatch.setattr(engine_module, "affixes_of", lambda backend_json: loaded_here.append(1))
    monkeypatch.setattr(engine_module, "_affixes_known", {})
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}, tokenize={"engine": "gigatoken"}))
    result = prepare(cfg, progress=False)
    manifest = json.loads((Path(result["token_store"]) / "_manifest.json").read_text())["report"]
    assert built == ["gigatoken"]
    # the post-processor's affixes came from transformers' process: `tokenizers` was not loaded here
    assert engine_module._affixes_known and not loaded_here
    assert manifest["engine"] == "gigatoken" and manifest["check_beside_encoding"] is True
    assert manifest["encoded_twice"] is False and not engines._prebuilt
    _assert_every_document_is_transformers(tmp_path, result, tokenizer_dir)

    monkeypatch.setattr(engines.GigatokenEncoder, "encode_flat", _off_by_one(engines.GigatokenEncoder.encode_flat))
    cfg = parse_config(
        config_dict(tmp_path / "again", corpus, {"path": str(tokenizer_dir)}, tokenize={"engine": "gigatoken"})
    )
    with pytest.raises(TokenizerError, match=r"tokenize\.engine gigatoken: ids differ from transformers"):
        prepare(cfg, progress=False)
    assert not list((tmp_path / "again" / "cache" / "tokenize").glob("*/tokens.json"))


def test_the_sample_depends_on_the_rows_not_their_positions():
    """Sampled by their origins' hash, rows dropped before sampling move few of the others in or out:
    the documents encoded ahead (from convert's output) are nearly all the check's own."""
    import numpy as np

    rng = np.random.default_rng(0)
    sizes = rng.integers(100, 3000, size=50_000)
    origins = np.arange(50_000, dtype=np.int64) * 7 + 3
    picked = sample_rows(sizes, origins)
    assert 600 < len(picked) <= 2000 and np.all(np.diff(picked) > 0)
    kept = np.sort(rng.choice(50_000, size=45_000, replace=False))  # 10% dropped by filter
    again = kept[sample_rows(sizes[kept], origins[kept])]
    candidates = sample_rows(sizes, origins, n=2500, max_bytes=int(2.5 * (2 << 20)))
    assert np.isin(again, candidates).all()  # a quarter more candidates cover the dropped rows' places
    # without origins, rows spread evenly by position, as before
    assert (sample_rows(sizes, np.full(50_000, -1)) == np.unique(np.linspace(0, 49_999, len(picked)).astype(int))).all()


def _prebuilt_tok(cfg, tokenizer_dir):
    """(the file build, the encoder prebuilt for the stage) of a `prefetch` block, after both are done."""
    from moai.stages.tokenize.engine import engine_setup

    with reference.prefetch(cfg) as ref:
        assert ref is not None
        info = ref.info(str(tokenizer_dir))
        encoder = engines.take_prebuilt(engine_setup("fastokens", info, 1))  # waits for the prebuild
        built = engines.file_build(Path(tokenizer_dir) / "tokenizer.json")
        return ref.file_is_pipeline, built, encoder, info


def test_a_small_run_builds_fastokens_from_the_file_and_keeps_it_only_where_it_is_the_pipeline(
    tmp_path, corpus, tokenizer_dir
):
    """A small run builds fastokens from the folder's tokenizer.json at once; the stage takes that
    build when the file, as it is, is the pipeline transformers loaded, else one built from that
    pipeline. A file written otherwise, or a tokenizer_config.json that changes what transformers
    runs, is told apart; the ids are transformers' + EOS either way."""
    hf = load_tokenizer(str(tokenizer_dir))
    texts = ["hello world", "", "한국어 문서 and code: def f(x): return x"]
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    same, built, encoder, info = _prebuilt_tok(cfg, tokenizer_dir)
    assert same and built is not None and encoder is not None and encoder.tok is built.tok
    assert engines.lists_of(encoder.encode_documents(texts, info.eos_id)) == [
        [*hf(t)["input_ids"], hf.eos_token_id] for t in texts
    ]

    rewritten = tmp_path / "rewritten"  # the same pipeline, written as one line
    shutil.copytree(tokenizer_dir, rewritten)
    (rewritten / "tokenizer.json").write_text(json.dumps(json.loads((tokenizer_dir / "tokenizer.json").read_text())))
    changed = tmp_path / "changed"  # transformers adds a token the file does not hold
    shutil.copytree(tokenizer_dir, changed)
    config = json.loads((changed / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {str(len(hf)): {"content": "<extra>", "special": True}}
    (changed / "tokenizer_config.json").write_text(json.dumps(config))
    for folder in (rewritten, changed):
        cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(folder)}))
        same, built, encoder, info = _prebuilt_tok(cfg, folder)
        assert not same and encoder is not None
        assert built is None  # the file's build is dropped: the encoder was built from transformers' pipeline
        want = load_tokenizer(str(folder))
        assert engines.lists_of(encoder.encode_documents(texts, info.eos_id)) == [
            [*want(t)["input_ids"], want.eos_token_id] for t in texts
        ]
    assert not engines._file_builds  # forgotten with the block


def test_the_preflight_counts_with_the_file_build_of_a_small_run(
    tmp_path, corpus, tokenizer_dir, bos_tokenizer_dir, monkeypatch
):
    """In a small run the preflight's folder check and token counts take the fastokens build begun
    at once (no `tokenizers` load of the file), with the post-processor's BOS counted; a large run
    begins none, and its preflight loads the file with `tokenizers` as before."""
    from moai import estimate

    texts = ["hello world", "", "한국어 문서", "def f(x):\n    return x"]
    loads = []
    original = tokenizer_stage.rust_tokenizer_file
    monkeypatch.setattr(tokenizer_stage, "rust_tokenizer_file", lambda f: loads.append(f) or original(f))
    for folder in (tokenizer_dir, bos_tokenizer_dir):
        hf = load_tokenizer(str(folder))
        want = [len(hf(t)["input_ids"]) + 1 for t in texts]  # + EOS
        cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(folder)}))
        with reference.prefetch(cfg):
            tokenizer_stage.check_folder(str(folder), folder)
            assert estimate._token_counts(texts, cfg.source, cfg).tolist() == want
        assert not loads
        monkeypatch.setattr(reference, "SMALL_RUN_BYTES", -1)
        with reference.prefetch(cfg):
            assert not engines._file_builds
            tokenizer_stage.check_folder(str(folder), folder)
            assert estimate._token_counts(texts, cfg.source, cfg).tolist() == want
        assert loads and all(f == folder / "tokenizer.json" for f in loads)
        loads.clear()
        monkeypatch.undo()
        monkeypatch.setattr(tokenizer_stage, "rust_tokenizer_file", lambda f: loads.append(f) or original(f))


def test_a_damaged_file_is_the_preflights_one_line_with_a_file_build_too(tmp_path, corpus, tokenizer_dir):
    broken = tmp_path / "broken"
    shutil.copytree(tokenizer_dir, broken)
    (broken / "tokenizer.json").write_text('{"model": {"type": "BPE"')
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(broken)}))
    with reference.prefetch(cfg), pytest.raises(TokenizerError, match="cannot be loaded by `tokenizers`"):
        tokenizer_stage.check_folder(str(broken), broken)
