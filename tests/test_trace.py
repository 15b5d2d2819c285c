"""Origins and `moai trace`: every stored document names its file and row, and a step's samples
are the ones the training loader reads, with the documents they hold."""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import TINY_MODEL, config_dict, make_texts, write_jsonl
from moai.config import parse_config
from moai.errors import ConfigError, DataError
from moai.formats.tokens import PackedSamples, TokenStore
from moai.pipeline import prepare
from moai.trace import Tracer, step_samples, top_loss_steps

TEXTS = [t for t in make_texts(400, seed=11) if "\n" not in t and t.strip()]


def _write_source(folder: Path, kind: str) -> tuple[Path, dict]:
    """The texts as a source of `kind`, split over two files; and the source settings."""
    if kind.endswith((".zst", ".bz2", ".xz")):  # the plain files' bytes, compressed
        base, codec = kind.rsplit(".", 1)
        _write_source(folder / "plain", base)
        for n in range(2):
            (folder / f"f{n}.{kind}").write_bytes(COMPRESS[codec]((folder / "plain" / f"f{n}.{base}").read_bytes()))
        return folder / f"f*.{kind}", {}
    folder.mkdir(parents=True)
    halves = [TEXTS[: len(TEXTS) // 2], TEXTS[len(TEXTS) // 2 :]]
    for n, texts in enumerate(halves):
        rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
        if kind == "jsonl":
            write_jsonl(folder / f"f{n}.jsonl", rows)
        elif kind == "jsonl.gz":
            with gzip.open(folder / f"f{n}.jsonl.gz", "wt", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        elif kind == "json":
            (folder / f"f{n}.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
        elif kind == "csv":
            with open(folder / f"f{n}.csv", "w", newline="", encoding="utf-8") as f:
                w = csv.DictWriter(f, fieldnames=["id", "text"])
                w.writeheader()
                w.writerows(rows)
        elif kind == "parquet":
            pq.write_table(pa.Table.from_pylist(rows), folder / f"f{n}.parquet")
        elif kind == "txt":
            (folder / f"f{n}.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    return folder / f"f*.{kind}", {}


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


COMPRESS = {"zst": _zstd, "bz2": bz2.compress, "xz": lzma.compress}
DECOMPRESS = {
    "zst": lambda b: __import__("zstandard").ZstdDecompressor().decompress(b),
    "bz2": bz2.decompress,
    "xz": lzma.decompress,
}


def test_a_hub_dataset_names_each_documents_row_by_its_index(tmp_path, tokenizer_dir):
    """source.hub: `datasets.load_dataset` of a folder of Parquet files (what a hub dataset is
    once loaded; this machine has no hub): each document's origin is `<hub>[i]`, the i-th row of the
    loaded split, whose text tokenizes to its ids."""
    import datasets
    from transformers import AutoTokenizer

    folder = tmp_path / "hub-dataset"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([{"text": t} for t in TEXTS]), folder / "train-00000.parquet")
    cfg = config_dict(tmp_path, "unused", {"path": str(tokenizer_dir)}, filter={"min_chars": 30})
    cfg["source"] = {"hub": str(folder), "split": "train", "text_field": "text"}
    result = prepare(parse_config(cfg), progress=False)
    store = TokenStore(result["token_store"])
    assert store.origin_files["files"] == [str(folder)]
    loaded = datasets.load_dataset(str(folder), split="train")
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    from moai.trace import where_of

    for split in ("train", "validation"):
        tokens = store.split(split)
        assert tokens.origins is not None
        for doc, origin in enumerate(tokens.origins.tolist()):
            where, _, row = where_of(origin, store.origin_files["files"], store.origin_files.get("where", []))
            assert where == f"{folder}[{row}]"
            assert tokens.document(doc).tolist() == [*tok(loaded[row]["text"])["input_ids"], store.eos_id]


def _source_text(file: str, kind: str, row: int) -> str:
    """The text at `row` of a source file, read here independently of convert's readers: a JSON Lines
    or text line counts from 1, a JSON array item and a CSV or Parquet row from 0."""
    if kind.endswith((".zst", ".bz2", ".xz")):
        base, codec = kind.rsplit(".", 1)
        plain = Path(file).with_name(Path(file).name + ".plain")
        if not plain.exists():
            plain.write_bytes(DECOMPRESS[codec](Path(file).read_bytes()))
        return _source_text(str(plain), base, row)
    if kind == "jsonl":
        return json.loads(Path(file).read_text(encoding="utf-8").splitlines()[row - 1])["text"]
    if kind == "jsonl.gz":
        return json.loads(gzip.open(file, "rt", encoding="utf-8").read().splitlines()[row - 1])["text"]
    if kind == "json":
        return json.loads(Path(file).read_text(encoding="utf-8"))[row]["text"]
    if kind == "csv":
        with open(file, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))[row]["text"]
    if kind == "parquet":
        return pq.read_table(file).column("text")[row].as_py()
    return Path(file).read_text(encoding="utf-8").split("\n")[row - 1]


@pytest.mark.parametrize(
    "kind", ["jsonl", "jsonl.gz", "jsonl.zst", "json", "csv", "csv.bz2", "parquet", "txt", "txt.xz"]
)
def test_every_stored_document_names_the_row_whose_text_tokenizes_to_its_ids(tmp_path, tokenizer_dir, kind):
    from transformers import AutoTokenizer

    pattern, _ = _write_source(tmp_path / "data", kind)
    cfg = config_dict(tmp_path, pattern, {"path": str(tokenizer_dir)}, filter={"min_chars": 30})
    result = prepare(parse_config(cfg), progress=False)
    assert result["stages"]["filter"]["dropped"]["too_short"] > 0  # rows dropped: origins are not row numbers
    store = TokenStore(result["token_store"])
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    files = store.origin_files["files"]
    assert len(files) == 2
    seen = set()
    for split in ("train", "validation"):
        tokens = store.split(split)
        origins = tokens.origins
        assert origins is not None and len(origins) == tokens.num_documents and (origins >= 0).all()
        for doc, origin in enumerate(origins.tolist()):
            file, row = files[origin >> 40], origin & ((1 << 40) - 1)
            seen.add((file, row))
            text = _source_text(file, kind, row)
            expected = [*tok(text)["input_ids"], store.eos_id]
            assert tokens.document(doc).tolist() == expected, (split, doc, file, row)
    assert len(seen) == sum(store.split(s).num_documents for s in ("train", "validation"))  # no row twice


def test_a_cleaning_stage_keeps_origins_on_kept_and_dropped_rows(tmp_path, tokenizer_dir):
    """dedup drops copies; the kept rows' origins still name their rows and the dropped rows table
    names the dropped copy's file and row."""
    texts = TEXTS[:60] + TEXTS[:5]  # rows 61-65 repeat rows 1-5
    write_jsonl(tmp_path / "data" / "c.jsonl", [{"text": t} for t in texts])
    cfg = config_dict(
        tmp_path,
        tmp_path / "data" / "c.jsonl",
        {"path": str(tokenizer_dir)},
        dedup={"exact": True},
        keep_dropped=True,
    )
    result = prepare(parse_config(cfg), progress=False)
    store = TokenStore(result["token_store"])
    rows = sorted(
        int(o) & ((1 << 40) - 1)
        for s in ("train", "validation")
        for o in store.split(s).origins  # type: ignore[union-attr]
    )
    assert rows == list(range(1, 61))
    dedup_dir = Path(cfg["cache_dir"]) / "dedup" / result["stages"]["dedup"]["key"] / "dropped"
    dropped = pa.concat_tables(pa.ipc.open_stream(p.read_bytes()).read_all() for p in sorted(dedup_dir.glob("*.arrow")))
    assert sorted(int(o) & ((1 << 40) - 1) for o in dropped.column("origin").to_pylist()) == [61, 62, 63, 64, 65]


def _train_config(tmp_path: Path, tokenizer_dir: Path, mode: str, **train) -> dict:
    write_jsonl(tmp_path / "data" / "t.jsonl", [{"text": t} for t in TEXTS])
    return config_dict(
        tmp_path,
        tmp_path / "data" / "t.jsonl",
        {"path": str(tokenizer_dir)},
        pack={"seq_len": 32, "mode": mode},
        train={"model_config": TINY_MODEL, "micro_batch_size": 3, "grad_accum_steps": 2, "max_steps": 50, **train},
    )


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_traced_step_holds_the_loaders_samples_and_their_documents(tmp_path, tokenizer_dir, mode):
    from transformers import AutoTokenizer

    from moai.train.data import PackedDataset, StepBatches

    config = parse_config(_train_config(tmp_path, tokenizer_dir, mode))
    prepared = prepare(config, progress=False)
    data = PackedDataset(prepared["sample_index"], "train")
    t = config.train
    assert t is not None
    world = 2
    tracer = Tracer(config, prepared, world)
    store = TokenStore(prepared["token_store"])
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for step in (1, 7, 40):  # 40 steps x 12 samples pass an epoch: the next epoch's order
        traced = tracer.step(step)
        loader = [
            ids
            for rank in range(world)
            for ids in list(StepBatches(t, len(data), rank, world, step - 1, data.lengths, data.order))[
                : t.grad_accum_steps
            ]
        ]
        assert [s.index for s in traced] == [i for ids in loader for i in ids]
        for s in traced:
            ids = data[s.index]["input_ids"]
            covered = 0
            for p in s.pieces:
                doc = store.split("train").document(p.document)
                assert ids[p.span[0] : p.span[1]].tolist() == doc[p.doc_tokens[0] : p.doc_tokens[1]].tolist()
                covered += p.span[1] - p.span[0]
                row = json.loads((tmp_path / "data" / "t.jsonl").read_text().splitlines()[p.row - 1])  # type: ignore[operator]
                assert p.where == f"{tmp_path / 'data' / 't.jsonl'}:{p.row}"
                assert doc.tolist() == [*tok(row["text"])["input_ids"], store.eos_id]
            assert covered == int(data.samples.lengths[s.index])  # the pieces fill the sample (padding aside)
    one = tracer.step(7, rank=1, micro=1)
    assert [s.index for s in one] == list(StepBatches(t, len(data), 1, world, 6, data.lengths, data.order))[1]


def test_tracing_is_the_same_for_world_sizes_with_the_same_global_batch(tmp_path, tokenizer_dir):
    """A step's samples, all ranks together, do not depend on how the global batch is split."""
    cfg = _train_config(tmp_path, tokenizer_dir, "concat", micro_batch_size=4, grad_accum_steps=1)
    one = Tracer(parse_config(cfg), prepare(parse_config(cfg), progress=False), world=1, preview=False)
    two_cfg = {**cfg, "train": {**cfg["train"], "micro_batch_size": 2}}
    two = Tracer(parse_config(two_cfg), prepare(parse_config(two_cfg), progress=False), world=2, preview=False)
    for step in (1, 5, 33):
        assert sorted(s.index for s in one.step(step)) == sorted(s.index for s in two.step(step))


def test_step_samples_refuses_a_step_or_rank_outside_the_run(tmp_path):
    from moai.config import ConfigError

    t = parse_config({"source": {"path": "x"}, "tokenizer": {"path": "t"}, "train": {"model_config": TINY_MODEL}}).train
    assert t is not None
    with pytest.raises(ConfigError, match="steps count from 1"):
        step_samples(t, 100, 0, world=1)
    with pytest.raises(ConfigError, match="--rank 2"):
        step_samples(t, 100, 1, world=2, rank=2)


def test_top_loss_picks_the_highest_logged_losses(tmp_path):
    lines = [{"step": s, "loss": 3.0 - s * 0.01} for s in range(1, 40)]
    lines[20]["loss"] = 9.5  # step 21
    lines[30]["loss"] = 7.0  # step 31
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(json.dumps(x) for x in [*lines[:5], {"step": 5, "eval_loss": 99.0}, *lines[5:]]) + "\n"
    )
    top = top_loss_steps(tmp_path / "metrics.jsonl", 2)
    assert [r["step"] for r in top] == [21, 31]
    assert [r["step"] for r in top_loss_steps(tmp_path / "metrics.jsonl", 1, by="jump")] == [21]
    assert top_loss_steps(tmp_path / "metrics.jsonl", 1)[0]["step"] == 21
    assert top[0]["jump"] == pytest.approx(9.5 - np.mean([3.0 - s * 0.01 for s in range(11, 21)]), abs=1e-6)


def test_cli_trace_prints_a_steps_documents_as_json(tmp_path, tokenizer_dir, capsys, monkeypatch):
    import yaml

    from moai.cli import main

    cfg = _train_config(tmp_path, tokenizer_dir, "concat")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    assert main(["trace", str(tmp_path / "c.yaml"), "--step", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out[0]["step"] == 3 and out[0]["world_size"] == 1
    assert len(out[0]["samples"]) == 6  # micro_batch_size 3 x grad_accum_steps 2 x 1 rank
    piece = out[0]["samples"][0]["pieces"][0]
    assert piece["source"] == "default" and piece["where"].startswith(str(tmp_path / "data" / "t.jsonl") + ":")
    assert piece["preview"]
    assert main(["trace", str(tmp_path / "c.yaml"), "--step", "3", "--rank", "0", "--micro-batch", "1"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "step 3: 3 samples, world size 1" and text[1].startswith("  sample ")
    assert f"{tmp_path / 'data' / 't.jsonl'}:" in text[2]
    assert main(["trace", str(tmp_path / "c.yaml"), "--step", "0"]) == 2
    assert "steps count from 1" in capsys.readouterr().err
    assert main(["trace", str(tmp_path / "c.yaml"), "--document", piece["where"]]) == 0
    history = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert history["token_document"] == piece["document"] and history["read_by"]["num_samples"] >= 1


def test_pack_samples_still_open(tmp_path, tokenizer_dir):
    """The sample index reads as before over a store with origins (windows inside its token split)."""
    prepared = prepare(parse_config(_train_config(tmp_path, tokenizer_dir, "concat")), progress=False)
    samples = PackedSamples(prepared["sample_index"], "train")
    assert len(samples) > 0 and samples[0]["input_ids"].shape == (32,)


def test_a_documents_history_names_the_stage_and_reason_that_dropped_it_or_the_steps_that_read_it(
    tmp_path, tokenizer_dir
):
    from moai.trace import Tracer, document_history

    texts = [*TEXTS[:80], "short", TEXTS[3], "x" * 40]  # line 81 too short, 82 a copy of line 4, 83 kept
    data = tmp_path / "data" / "d.jsonl"
    write_jsonl(data, [{"text": t} for t in texts])
    cfg = config_dict(
        tmp_path,
        data,
        {"path": str(tokenizer_dir)},
        filter={"min_chars": 10},
        dedup={"exact": True},
        keep_dropped=True,
        pack={"seq_len": 32},
        split={"val_fraction": 0.0},
        train={"model_config": TINY_MODEL, "micro_batch_size": 2, "grad_accum_steps": 2, "max_steps": 100},
    )
    config = parse_config(cfg)
    prepared = prepare(config, progress=False)
    short = document_history(config, prepared, f"{data}:81", world=1)
    assert short["dropped_by"] == "filter" and short["reason"] == "too_short"
    copy = document_history(config, prepared, "d.jsonl:82", world=1)  # a unique end of the path is enough
    dedup_report = prepared["stages"]["dedup"]["dropped"]
    assert copy["dropped_by"] == "dedup" and copy["reason"] in dedup_report and copy["detail"]
    assert copy["kept_copy"] == f"{data}:4"  # the first copy, line 4, by file and line
    kept = document_history(config, prepared, f"{data}:83", world=1)
    assert [k["stage"] for k in kept["kept_by"]] == ["convert", "filter", "dedup", "save"]
    assert kept["split"] == "train" and kept["read_by"]["num_samples"] >= 1
    tracer = Tracer(config, prepared, world=1, preview=False)
    for read in kept["read_by"]["reads"]:  # each step named reads the document, traced the other way
        traced = tracer.step(read["step"], read["rank"], read["micro_batch"])
        assert any(p.where == f"{data}:83" for s in traced for p in s.pieces)
    assert {r["epoch"] for r in kept["read_by"]["reads"]} == set(
        range(len({r["epoch"] for r in kept["read_by"]["reads"]}))
    )
    with pytest.raises(DataError, match="no source of this config reads a file named"):
        document_history(config, prepared, "other.jsonl:3", world=1)


def test_a_chat_store_has_an_origin_for_every_conversation(tmp_path):
    """Chat data is tokenized its own way (one part per split, with loss masks): its documents
    name their lines too, each line once, and each line's conversation rendered with the template
    tokenizes to its document's ids."""
    import yaml

    from conftest import ROOT

    data = yaml.safe_load((ROOT / "examples" / "chat.yaml").read_text())
    source = ROOT / data["source"]["path"]
    data["source"]["path"] = str(source)
    data["source"]["chat_template"] = str(ROOT / data["source"]["chat_template"])
    data["tokenizer"]["path"] = str(ROOT / data["tokenizer"]["path"])
    data["cache_dir"] = str(tmp_path / "cache")
    del data["train"]
    store = TokenStore(prepare(parse_config(data), progress=False)["token_store"])
    assert store.origin_files["files"] == [str(source)]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(data["tokenizer"]["path"])
    template = Path(data["source"]["chat_template"]).read_text()
    lines = source.read_text().splitlines()
    rows = []
    for split in ("train", "validation"):
        origins = store.split(split).origins
        assert origins is not None and len(origins) == store.split(split).num_documents
        rows += [int(o) & ((1 << 40) - 1) for o in origins]
        for doc, origin in enumerate(origins.tolist()):  # the line's conversation, rendered, is its ids
            messages = json.loads(lines[(origin & ((1 << 40) - 1)) - 1])["messages"]
            text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
            expected = [*tok(text, add_special_tokens=False)["input_ids"], store.eos_id]
            assert store.split(split).document(doc).tolist() == expected, (split, doc)
    assert sorted(rows) == sorted(set(rows)) and all(1 <= r <= len(lines) for r in rows)
    assert len(rows) == sum(1 for line in lines if line.strip())  # every conversation kept, none twice


def test_loss_spikes_trace_the_biggest_jumps_from_metrics(tmp_path, tokenizer_dir):
    from moai.trace import loss_spikes

    cfg = _train_config(tmp_path, tokenizer_dir, "concat", output_dir=str(tmp_path / "run"))
    config = parse_config(cfg)
    prepared = prepare(config, progress=False)
    assert loss_spikes(config, prepared) == []  # not trained yet
    (tmp_path / "run").mkdir()
    lines = [{"step": s, "loss": 2.0} for s in range(1, 30)]
    lines[16]["loss"] = 6.0  # step 17
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    spikes = loss_spikes(config, prepared, k=1)
    assert [s["step"] for s in spikes] == [17] and spikes[0]["jump"] == pytest.approx(4.0)
    traced = Tracer(config, prepared, world=1).step(17)
    total = sum(p.span[1] - p.span[0] for s in traced for p in s.pieces)
    assert spikes[0]["num_documents"] == len({p.document for s in traced for p in s.pieces})
    assert sum(d["tokens"] for d in spikes[0]["documents"]) <= total and spikes[0]["documents"][0]["where"]


def test_unpacked_training_is_traced_document_by_document(tmp_path, tokenizer_dir):
    """pack.enabled false: a sample is a document or a seq_len piece of one, in the loader's
    length-grouped order; each traced piece is the sample's ids and names its line."""
    from moai.train.data import StepBatches

    cfg = _train_config(tmp_path, tokenizer_dir, "concat")
    cfg["pack"]["enabled"] = False
    config = parse_config(cfg)
    prepared = prepare(config, progress=False)
    assert prepared["sample_index"] is None
    tracer = Tracer(config, prepared, world=1, preview=False)
    data = tracer.data
    t = config.train
    assert t is not None
    traced = tracer.step(5)
    loader = list(StepBatches(t, len(data), 0, 1, 4, data.lengths, data.order))[: t.grad_accum_steps]
    assert [s.index for s in traced] == [i for ids in loader for i in ids]
    store = TokenStore(prepared["token_store"])
    for s in traced:
        ids = data[s.index]["input_ids"].tolist()
        assert len(s.pieces) == 1
        p = s.pieces[0]
        assert ids == store.split("train").document(p.document)[p.doc_tokens[0] : p.doc_tokens[1]].tolist()
        assert p.where == f"{tmp_path / 'data' / 't.jsonl'}:{p.row}"


def test_a_resumed_run_is_traced_with_each_launchs_split_of_the_global_batch(tmp_path, tokenizer_dir):
    """Steps 1-10 trained on 1 process (micro-batch 3 x 2 accumulation), steps 11- resumed on 2
    (3 x 1): the same samples per step; each step's ranks and micro-batches are its launch's."""
    from moai.trace import document_history
    from moai.train.data import StepBatches

    cfg = _train_config(tmp_path, tokenizer_dir, "concat", output_dir=str(tmp_path / "run"))
    config = parse_config(cfg)
    prepared = prepare(config, progress=False)
    t = config.train
    assert t is not None
    (tmp_path / "run").mkdir()
    starts = [
        {"event": "start", "step": 0, "world_size": 1, "micro_batch_size": 3, "grad_accum_steps": 2},
        {"event": "start", "step": 10, "world_size": 2, "micro_batch_size": 3, "grad_accum_steps": 1, "resumed": True},
    ]
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in starts))
    tracer = Tracer(config, prepared, preview=False)
    n = len(tracer.data)
    second = t.model_copy(update={"grad_accum_steps": 1})
    for step, world, tc in ((5, 1, t), (10, 1, t), (11, 2, second), (30, 2, second)):
        assert tracer.split_of(step).world == world
        for rank in range(world):
            loader = list(StepBatches(tc, n, rank, world, step - 1))[: tc.grad_accum_steps]
            for micro, ids in enumerate(loader):
                assert [s.index for s in tracer.step(step, rank, micro)] == ids, (step, rank, micro)
        # whatever the split, the step holds the same samples as on one process
        whole = Tracer(config, prepared, world=1, preview=False)
        assert sorted(s.index for s in tracer.step(step)) == sorted(s.index for s in whole.step(step))
    with pytest.raises(ConfigError, match="--rank 1"):
        tracer.step(5, rank=1)  # step 5 ran on one process
    # the other way: each read of a document names a (step, rank, micro-batch) whose samples hold it
    data = tmp_path / "data" / "t.jsonl"
    doc = tracer.step(12)[0].pieces[0]
    history = document_history(config, prepared, f"{data}:{doc.row}")
    assert history["read_by"]["reads"]
    for read in history["read_by"]["reads"]:
        assert any(
            p.row == doc.row for s in tracer.step(read["step"], read["rank"], read["micro_batch"]) for p in s.pieces
        )
        assert read["rank"] < tracer.split_of(read["step"]).world


def test_a_contaminated_rows_history_names_the_evaluation_item_it_shares_ngrams_with(tmp_path, tokenizer_dir):
    from moai.trace import document_history

    leaked = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches"
    evals = tmp_path / "evals" / "e.jsonl"
    write_jsonl(evals, [{"text": "an unrelated question about prime numbers and their gaps"}, {"text": leaked}])
    data = tmp_path / "data" / "d.jsonl"
    write_jsonl(data, [{"text": t} for t in [*TEXTS[:40], f"Intro. {leaked.upper()}! More words here.", TEXTS[41]]])
    cfg = config_dict(
        tmp_path,
        data,
        {"path": str(tokenizer_dir)},
        decontaminate={"path": str(evals), "ngram": 8},
        keep_dropped=True,
        train={"model_config": TINY_MODEL, "max_steps": 10},
    )
    config = parse_config(cfg)
    prepared = prepare(config, progress=False)
    assert prepared["stages"]["decontaminate"]["dropped"] == {"contaminated": 1}  # the stage report
    history = document_history(config, prepared, f"{data}:41")
    assert history["dropped_by"] == "decontaminate" and history["reason"] == "contaminated"
    assert history["eval_item"] == f"{evals}:2" and history["eval_item"] in history["detail"]
    assert document_history(config, prepared, f"{data}:42")["split"] in ("train", "validation")


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_every_piece_of_a_giant_document_names_its_row(tmp_path, tokenizer_dir, monkeypatch, mode):
    """A document over the giant-document size (lowered here to 4 KB) is encoded in pieces and cut
    across many samples (concat windows; best_fit's seq_len pieces): every sample piece of it names
    its line, and its pieces cover its tokens once."""
    from moai.stages.tokenize import parts, pieces

    monkeypatch.setattr(pieces, "LARGE_DOCUMENT_BYTES", 4096)
    large = []
    encode_large = parts.encode_large
    monkeypatch.setattr(parts, "encode_large", lambda *a: large.append(1) or encode_large(*a))
    giant = "\n".join(" ".join(TEXTS[i : i + 3]) for i in range(0, 150, 3))  # ~15 KB with newlines
    assert len(giant.encode()) > 4 * 4096
    data = tmp_path / "data" / "g.jsonl"
    write_jsonl(data, [{"text": t} for t in [*TEXTS[:20], giant, *TEXTS[20:40]]])  # the giant one is line 21
    cfg = config_dict(
        tmp_path,
        data,
        {"path": str(tokenizer_dir)},
        tokenize={"num_proc": 1},  # in this process: the lowered size applies
        pack={"seq_len": 32, "mode": mode},
        split={"val_fraction": 0.0},
        train={"model_config": TINY_MODEL, "max_steps": 10},
    )
    config = parse_config(cfg)
    prepared = prepare(config, progress=False)
    assert large == [1]  # encoded as a giant document
    tracer = Tracer(config, prepared, world=1, preview=False)
    store = TokenStore(prepared["token_store"])
    giant_doc = [i for i, o in enumerate(store.split("train").origins.tolist()) if o & ((1 << 40) - 1) == 21]  # type: ignore[union-attr]
    assert len(giant_doc) == 1
    length = store.split("train").document(giant_doc[0]).size
    assert length > 10 * 32
    covered, holders = [], []
    for i in range(len(tracer.data)):
        for p in tracer.sample(i, preview=False).pieces:
            if p.document == giant_doc[0]:
                assert p.where == f"{data}:21" and p.row == 21
                covered.append(p.doc_tokens)
                holders.append(i)
    assert len(covered) > 10 and sorted(covered)[0][0] == 0
    assert sum(b - a for a, b in covered) == length and len(set(covered)) == len(covered)  # each token once
    # the other way: --document finds exactly the samples that hold a piece of it
    from moai.trace import document_history

    read_by = document_history(config, prepared, f"{data}:21")["read_by"]
    assert read_by["num_samples"] == len(set(holders)) and read_by["samples"] == sorted(set(holders))[:20]


def test_a_copy_of_an_earlier_sources_row_names_that_sources_file_and_row(tmp_path, tokenizer_dir):
    """With several sources dedup keeps the earlier source's copy ("copy of ko row 2"): --document
    on the dropped row names the kept copy by the earlier source's file and line."""
    from moai.trace import document_history

    ko, en = TEXTS[:40], [*TEXTS[100:140], TEXTS[2]]  # en's line 41 is ko's line 3
    paths = {
        n: write_jsonl(tmp_path / n / "c.jsonl", [{"text": t} for t in texts]) for n, texts in (("ko", ko), ("en", en))
    }
    cfg = config_dict(tmp_path, paths["ko"], {"path": str(tokenizer_dir)}, dedup={"exact": True}, keep_dropped=True)
    del cfg["source"]
    cfg["sources"] = [{"name": n, "path": str(p), "weight": 1} for n, p in paths.items()]
    cfg["train"] = {"model_config": TINY_MODEL, "max_steps": 10}
    cfg["mix"] = {"total_tokens": 1024}
    config = parse_config(cfg)
    prepared = prepare(config, progress=False)
    assert prepared["stages"]["dedup[en]"]["dropped"] == {"exact_duplicate": 1}
    copy = document_history(config, prepared, f"{paths['en']}:41")
    assert copy["source"] == "en" and copy["dropped_by"] == "dedup" and copy["reason"] == "exact_duplicate"
    assert copy["detail"] == "copy of ko row 2" and copy["kept_copy_source"] == "ko"
    assert copy["kept_copy"] == f"{paths['ko']}:3"
    kept = document_history(config, prepared, copy["kept_copy"])
    assert kept["source"] == "ko" and "dropped_by" not in kept
