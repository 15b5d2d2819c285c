"""Pure parts of training: sample order, launch command, what launch hands the ranks (resolved.json),
FLOPs, and packed-attention masking."""

import itertools
import json
import math
import subprocess

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import PYTHON, subprocess_env
from moai.config import ConfigError, parse_config
from moai.launch import launch_command, resolve
from moai.train import flops_per_token, peak_flops, sample_ids

BASE = {"source": {"path": "x"}, "tokenizer": {"path": "t"}}


def train_cfg(**train):
    return parse_config({**BASE, "train": {"model_config": {"model_type": "llama"}, **train}}).train


@settings(deadline=None, max_examples=40)
@given(
    n=st.integers(5, 200),
    world=st.integers(1, 8),
    micro=st.integers(1, 4),
    accum=st.integers(1, 3),
    seed=st.integers(0, 3),
)
def test_ranks_see_disjoint_samples_and_every_sample_once_per_epoch(n, world, micro, accum, seed):
    per_step = world * micro * accum
    steps = math.ceil(n / per_step) + 1
    seen = []
    for step in range(steps):
        for m in range(accum):
            batches = [sample_ids(seed, n, step, m, r, world, micro, accum) for r in range(world)]
            flat = [i for b in batches for i in b]
            assert len(set(flat)) == len(flat) or len(seen) + len(flat) > n  # disjoint within an epoch
            seen.extend(flat)
    assert sorted(seen[:n]) == list(range(n))  # the first epoch covers every sample exactly once
    # pure: the same arguments give the same ids, whatever was asked before
    assert sample_ids(seed, n, 1, 0, 0, world, micro, accum) == sample_ids(seed, n, 1, 0, 0, world, micro, accum)


def test_epochs_are_reshuffled():
    n = 50
    first = [sample_ids(0, n, s, 0, 0, 1, 10, 1) for s in range(5)]
    second = [sample_ids(0, n, s, 0, 0, 1, 10, 1) for s in range(5, 10)]
    assert sorted(itertools.chain(*first)) == sorted(itertools.chain(*second)) and first != second


@pytest.mark.parametrize(
    "train, gpus, expect, env",
    [
        ({}, 0, {"--num_processes": "1", "--cpu": None, "--mixed_precision": "no"}, {}),
        ({"num_processes": 2}, 0, {"--num_processes": "2", "--multi_gpu": None}, {"ACCELERATE_USE_CPU": "1"}),
        ({}, 8, {"--num_processes": "8", "--multi_gpu": None, "--mixed_precision": "bf16"}, {}),
        ({}, 1, {"--num_processes": "1", "--mixed_precision": "bf16"}, {}),
        ({"mixed_precision": "no"}, 1, {"--mixed_precision": "no"}, {}),
        (
            {"num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.1", "main_process_port": 29500},
            8,
            {
                "--num_processes": "16",
                "--num_machines": "2",
                "--machine_rank": "1",
                "--main_process_ip": "10.0.0.1",
                "--main_process_port": "29500",
                "--multi_gpu": None,
            },
            {},
        ),
        ({"accelerate_config": "fsdp.yaml"}, 4, {"--config_file": "fsdp.yaml", "--multi_gpu": None}, {}),
    ],
)
def test_launch_command(train, gpus, expect, env):
    launch = launch_command(
        train_cfg(**train),
        "/r/resolved.json",
        num_gpus=gpus,
        port=12345,
        accelerate_config="/r/accelerate.yaml",
        python="py",
    )
    argv = launch.argv
    assert argv[:3] == ["py", "-m", "accelerate.commands.launch"]
    assert argv[-4:] == ["-m", "moai.train", "--config", "/r/resolved.json"]
    for flag, value in expect.items():
        assert flag in argv, flag
        if value is not None:
            assert argv[argv.index(flag) + 1] == value, flag
    assert not ("--cpu" in argv and "--multi_gpu" in argv)
    if "main_process_port" not in train:
        assert argv[argv.index("--main_process_port") + 1] == "12345"
    if "accelerate_config" not in train:
        assert argv[argv.index("--config_file") + 1] == "/r/accelerate.yaml"
    assert launch.env == env


def test_config_rules_for_train():
    with pytest.raises(ValueError, match=r"needs train\.model_config"):
        parse_config({**BASE, "train": {}})
    with pytest.raises(ValueError, match=r"needs train\.init_from"):
        parse_config({**BASE, "train": {"mode": "continue"}})
    with pytest.raises(ValueError, match=r"needs train\.main_process_ip"):
        parse_config({**BASE, "train": {"model_config": "c.json", "num_machines": 2}})


def test_attention_choice():
    from moai.train import attention_kind

    assert attention_kind(train_cfg(), cuda=True, packed=True) == "flex_attention"
    assert attention_kind(train_cfg(), cuda=True, packed=False) == "sdpa"
    assert attention_kind(train_cfg(), cuda=False, packed=True) == "sdpa"
    assert attention_kind(train_cfg(attn_implementation="eager"), cuda=True, packed=True) == "eager"


def test_flops_and_peak():
    from transformers import LlamaConfig

    c = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        tie_word_embeddings=False,
    )
    n = 10_000_000
    assert flops_per_token(c, n, 256) == 6 * (n - 2 * 1000 * 64) + 12 * 2 * 4 * 16 * 256
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops(None) is None and peak_flops("Some CPU") is None


def test_packed_logits_equal_per_document_logits():
    from transformers import LlamaConfig, LlamaForCausalLM

    from moai.formats.tokens import position_ids

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()
    lengths = [5, 9, 3, 7]
    docs = [torch.randint(0, 97, (n,)) for n in lengths]
    packed = torch.cat(docs)[None]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    pos = torch.from_numpy(position_ids(0, int(offsets[-1]), offsets))[None]
    with torch.no_grad():
        together = model(input_ids=packed, position_ids=pos, use_cache=False).logits[0]
        apart = torch.cat([model(input_ids=d[None], use_cache=False).logits[0] for d in docs])
    assert torch.allclose(together, apart, atol=1e-5), (together - apart).abs().max()


def test_length_grouped_order_is_a_shuffled_permutation_with_similar_neighbours():
    from moai.train import epoch_order

    lengths = np.random.default_rng(1).integers(1, 500, size=1000)
    order = epoch_order(3, 0, 1000, lengths, group=100)
    assert sorted(order) == list(range(1000))
    assert np.array_equal(order, epoch_order(3, 0, 1000, lengths, group=100))
    assert not np.array_equal(order, epoch_order(3, 1, 1000, lengths, group=100))
    spread_grouped = np.mean([np.ptp(lengths[order[i : i + 8]]) for i in range(0, 1000, 8)])
    plain = epoch_order(3, 0, 1000)
    spread_plain = np.mean([np.ptp(lengths[plain[i : i + 8]]) for i in range(0, 1000, 8)])
    assert spread_grouped < spread_plain / 4


def test_unpacked_documents_pad_to_a_multiple_of_8_with_masked_labels(tmp_path, tokenizer_dir):
    from moai.formats.text import write_text_dataset
    from moai.stages import tokenize as tk
    from moai.stages.save import save
    from moai.stages.tokenizer import describe, load_tokenizer
    from moai.train import DocumentDataset

    text = tmp_path / "text"
    text.mkdir()
    write_text_dataset([["short", "a much longer document " * 20, "mid sized text here"]], text, "1MB")
    saved = tmp_path / "saved"
    saved.mkdir()
    save(parse_config({**BASE, "split": {"val_fraction": 0.0}}).split, text, saved, max_shard_size="1MB")
    info = describe(load_tokenizer(str(tokenizer_dir)), str(tokenizer_dir), "fp")  # tokenize loads it from there
    store = tmp_path / "store"
    store.mkdir()
    tk.tokenize(info, saved, store, num_proc=1, threads_per_proc=1, batch_size=10, progress=False)
    data = DocumentDataset(str(store), "train", seq_len=16, pad_id=info.pad_id)
    split = data.tokens
    # every token once, but for one-token pieces (nothing to predict)
    assert int(data.lengths.sum()) + data.dropped_tokens == split.num_tokens and data.lengths.max() <= 16
    assert data.lengths.min() >= 2
    batch = data.collate([data[i] for i in range(3)])
    width = batch["input_ids"].shape[1]
    assert width % 8 == 0 and width >= max(int(n) for n in data.lengths[:3])
    assert ((batch["labels"] == -100) == (batch["attention_mask"] == 0)).all()
    assert (batch["input_ids"][batch["attention_mask"] == 0] == info.pad_id).all()


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_model_types_build_and_respect_document_boundaries(model_type, tokenizer_dir):
    from transformers import AutoTokenizer

    from moai.formats.tokens import position_ids
    from moai.train import build_model

    t = train_cfg(
        model_config={
            "model_type": model_type,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
        }
    )
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    model = build_model(t, len(tok), tok).eval()
    assert model.config.model_type == model_type and model.config.vocab_size == len(tok)
    docs = [torch.randint(0, len(tok), (n,)) for n in (6, 4, 9)]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    pos = torch.from_numpy(position_ids(0, int(offsets[-1]), offsets))[None]
    with torch.no_grad():
        together = model(input_ids=torch.cat(docs)[None], position_ids=pos, use_cache=False).logits[0]
        apart = torch.cat([model(input_ids=d[None], use_cache=False).logits[0] for d in docs])
    assert torch.allclose(together, apart, atol=1e-5)


def test_a_model_config_without_model_type_is_a_config_error():
    from moai.train import build_model

    with pytest.raises(ConfigError, match=r"train\.model_config needs model_type"):
        build_model(train_cfg(model_config={"hidden_size": 32}), 100, tokenizer=None)


def _metrics_lines(steps) -> list[str]:
    return [json.dumps({"step": s, "loss": 1.0 / s}) for s in steps]


def test_resume_drops_metrics_logged_after_the_checkpoint(tmp_path):
    from moai.train import kept_metrics, trim_metrics

    start = json.dumps({"event": "start", "step": 0, "resumed": False})
    lines = [start, *_metrics_lines(range(1, 11))]
    assert kept_metrics(lines, 6) == [start, *_metrics_lines(range(1, 7))]

    # stepless lines keep their place before the first dropped line, not after it; a line half
    # written by a kill goes too (the next line appended would be glued onto it)
    note = json.dumps({"event": "note"})
    mixed = [note, *_metrics_lines([5, 6, 7]), note, '{"step": 8, "lo']
    assert kept_metrics(mixed, 6) == [note, *_metrics_lines([5, 6])]

    f = tmp_path / "metrics.jsonl"
    f.write_text("\n".join(lines) + "\n")
    assert trim_metrics(f, 6) == 4
    assert f.read_text() == "\n".join([start, *_metrics_lines(range(1, 7))]) + "\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary file left
    before = f.stat().st_mtime_ns
    assert trim_metrics(f, 6) == 0 and f.stat().st_mtime_ns == before  # nothing to drop: not rewritten
    assert trim_metrics(tmp_path / "none.jsonl", 6) == 0


DATA = {"token_store": "/c/tokens", "sample_index": None, "tokenizer": "/c/tok"}


def resolved_cfg(tmp_path, **train):
    return parse_config(
        {**BASE, "train": {"model_config": {"model_type": "llama"}, "output_dir": str(tmp_path / "run"), **train}}
    )


def test_resolved_json_round_trips_and_refuses_unknown_or_missing_keys(tmp_path):
    from moai.train import ResolvedRun

    config = resolved_cfg(tmp_path, max_steps=7)
    path = resolve(config, DATA, loader_workers=3)
    run = ResolvedRun.read(path)
    assert run.config == config and run.train.max_steps == 7 and run.loader_workers == 3
    assert run.data.model_dump() == DATA and run.data.sample_index is None

    raw = json.loads(path.read_text())
    raw["config"]["train"]["max_stepz"] = 8
    raw["data"]["extra_path"] = "/x"
    del raw["loader_workers"]
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as err:
        ResolvedRun.read(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)  # one line: the failure line
    for problem in (
        "config.train.max_stepz: unknown key",
        "data.extra_path: unknown key",
        "loader_workers: Field required",
    ):
        assert problem in str(err.value)

    with pytest.raises(ValueError, match="extra"):  # what launch is handed is checked when it is written too
        resolve(config, {**DATA, "extra": "/x"}, loader_workers=0)


@pytest.mark.slow
def test_importing_moai_train_loads_no_torch():
    """moai.launch imports moai.train.resolved: the package itself stays light."""
    code = (
        "import sys, moai.train, moai.launch; print(sorted({'torch', 'transformers', 'accelerate'} & set(sys.modules)))"
    )
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=subprocess_env(), check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_bad_resolved_json_fails_the_rank_with_one_line(tmp_path):
    path = resolve(resolved_cfg(tmp_path), DATA, loader_workers=0)
    raw = json.loads(path.read_text())
    raw["surprise"] = True
    path.write_text(json.dumps(raw))
    out = subprocess.run(
        [PYTHON, "-m", "moai.train", "--config", str(path)],
        capture_output=True,
        text=True,
        env={**subprocess_env(), "RANK": "3"},
        timeout=120,
    )
    assert out.returncode != 0 and out.stdout == ""
    assert f"[rank 3] moai.train failed: ConfigError: {path}: surprise: unknown key" in out.stderr


def _checkpoint(out, step: int, run: dict | None, final: bool = False) -> None:
    """What save_checkpoint leaves for resume_plan to read: state.json (and final/ once finished)."""
    folder = out / "checkpoints" / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(
        json.dumps({"step": step, "samples_consumed": 0, "tokens_consumed": 0, "run": run})
    )
    if final:
        (out / "final").mkdir()


def _identity(**changes):
    return {
        "seed": 0,
        "micro_batch_size": 8,
        "grad_accum_steps": 1,
        "world_size": 2,
        "seq_len": 2048,
        "train_samples": 1000,
        "max_steps": 10,
        **changes,
    }


def test_resume_plan_decides_fresh_resume_and_finished_from_small_files(tmp_path):
    from moai.train.checkpoint import resume_plan

    out = tmp_path / "run"
    config = resolved_cfg(tmp_path, max_steps=10, num_processes=2)
    plan = resume_plan(config)
    assert (plan.status, plan.step) == ("fresh", 0) and str(out) in plan.detail

    _checkpoint(out, 4, _identity())
    plan = resume_plan(config, num_gpus=0, num_samples=1000)
    assert (plan.status, plan.step) == ("resume", 4) and "step-00000004" in plan.detail

    _checkpoint(out, 10, _identity())  # at max_steps without final/: the launch still evaluates and saves it
    assert resume_plan(config).status == "resume"
    (out / "final").mkdir()
    plan = resume_plan(config)
    assert (plan.status, plan.step) == ("finished", 10)
    assert plan.detail.startswith(f"already at max_steps 10 in {out}") and "\n" not in plan.detail

    # a checkpoint written before the run identity was recorded cannot be compared: it resumes
    old = tmp_path / "old"
    _checkpoint(old, 3, None)
    assert resume_plan(resolved_cfg(tmp_path, output_dir=str(old), micro_batch_size=1)).status == "resume"


@pytest.mark.parametrize(
    ("train", "kwargs", "names"),
    [
        (
            {"micro_batch_size": 4},
            {},
            ["global batch (samples per optimizer step: train.micro_batch_size", "16 in the checkpoint, 8 now"],
        ),
        ({"seed": 3, "max_steps": 20}, {}, ["train.seed 0 in the checkpoint, 3 now", "train.max_steps"]),
        ({"num_processes": 1}, {}, ["global batch", "ranks being train.num_processes", "16 in the checkpoint, 8 now"]),
        ({"num_processes": None}, {"num_gpus": 4}, ["global batch", "16 in the checkpoint, 32 now"]),
        ({}, {"num_samples": 999}, ["training samples (the prepared data) 1000 in the checkpoint, 999 now"]),
    ],
)
def test_resume_plan_refuses_other_settings_with_one_line(tmp_path, train, kwargs, names):
    from moai.train.checkpoint import resume_plan

    out = tmp_path / "run"
    _checkpoint(out, 4, _identity())
    config = parse_config(
        {
            **BASE,
            "pack": {"seq_len": 2048},
            "train": {
                "model_config": {"model_type": "llama"},
                "output_dir": str(out),
                "max_steps": 10,
                "micro_batch_size": 8,
                "num_processes": 2,
                **train,
            },
        }
    )
    with pytest.raises(ConfigError) as err:
        resume_plan(config, **kwargs)
    message = str(err.value)
    assert message.startswith(f"train.output_dir {out} holds checkpoints of a run with other settings: ")
    assert "\n" not in message and f"rm -rf {out}" in message and "another folder" in message
    for name in names:
        assert name in message


@pytest.mark.parametrize(
    "train",
    [
        {"num_processes": 1, "grad_accum_steps": 2},  # half the ranks, twice the accumulation
        {"num_processes": 4, "micro_batch_size": 4},  # twice the ranks, half the micro-batch
        {"num_processes": 1, "num_machines": 2, "main_process_ip": "10.0.0.1"},  # one process on each of two machines
        {"micro_batch_size": 2, "grad_accum_steps": 4},
    ],
)
def test_resume_plan_resumes_on_another_split_of_the_same_global_batch(tmp_path, train):
    from moai.train.checkpoint import resume_plan

    out = tmp_path / "run"
    _checkpoint(out, 4, _identity())  # 8 x 1 x 2 ranks, written before "global_batch" was recorded
    raw = {"model_config": {"model_type": "llama"}, "output_dir": str(out), "max_steps": 10, "micro_batch_size": 8}
    config = parse_config({**BASE, "pack": {"seq_len": 2048}, "train": {**raw, "num_processes": 2, **train}})
    plan = resume_plan(config, num_samples=1000)
    assert (plan.status, plan.step) == ("resume", 4)
    _checkpoint(out, 5, {"seed": 0, "global_batch": 16, "seq_len": 2048, "train_samples": 1000, "max_steps": 10})
    assert resume_plan(config, num_samples=1000).step == 5


def test_resume_plan_leaves_what_is_not_known_yet_and_names_a_damaged_state(tmp_path):
    from moai.errors import CacheError
    from moai.train.checkpoint import resume_plan

    out = tmp_path / "run"
    _checkpoint(out, 4, _identity())
    # world size (no num_processes, no GPU count) and samples (no data yet) are not compared
    config = resolved_cfg(tmp_path, max_steps=10, micro_batch_size=8)
    config = config.model_copy(update={"pack": config.pack.model_copy(update={"seq_len": 2048})})
    assert resume_plan(config).status == "resume"
    (out / "checkpoints" / "step-00000004" / "state.json").write_text("{")
    with pytest.raises(CacheError, match=r"checkpoint .*step-00000004 is damaged: state.json cannot be read"):
        resume_plan(config)


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ('{"step": 3, "loss": 2.5}', True),
        ('{"step": 3, "eval_loss": 2.5}', True),
        ('{"event": "start", "step": 0}', True),
        ('{"not": "metrics"}', False),
        ("2026-01-02 03:04:05,678 [rank 1] INFO moai.train.checkpoint: resumed from x at step 5", True),
        ("2026-01-02 03:04:05,678 [rank 0] WARNING transformers.modeling_utils: something", True),
        ("Traceback (most recent call last):", False),
        ('  File "/x/loop.py", line 3, in train', False),
        ("[rank 1] moai.train failed: ValueError: broke", False),  # the summary line says it
        ("[rank0]: ValueError: broke", False),
        ("subprocess.CalledProcessError: Command '[...]' returned non-zero exit status 1.", False),
        ("W1123 01:36:47.997000 18251 torch/distributed/run.py:792] Setting OMP_NUM_THREADS", False),
    ],
)
def test_the_terminal_shows_metrics_and_rank_records_only(line, shown):
    from moai.launch import is_progress_line

    assert is_progress_line(line) is shown


def test_failure_reason_is_one_line():
    from moai.launch import failure_reason, last_metrics

    assert failure_reason(["rank 1: ValueError: x"], [], 1) == "rank 1: ValueError: x"
    assert failure_reason(["rank 1: A: x", "rank 0: B: y"], [], 1) == "rank 1: A: x (and 1 more rank(s))"
    tail = ["Traceback (most recent call last):", "  File ...", "torch.OutOfMemoryError: no memory", "x"]
    tail += ["subprocess.CalledProcessError: Command '[...]' returned non-zero exit status 1."]
    assert failure_reason([], tail, 1) == "accelerate launch exited with code 1: torch.OutOfMemoryError: no memory"
    assert failure_reason([], ["killed"], -9) == "accelerate launch exited with code -9"
    lines = ['{"event": "start", "step": 0}', '{"step": 1, "loss": 2.0}', "noise", '{"step": 1, "eval_loss": 1.5}']
    assert last_metrics(lines) == {"event": "start", "step": 1, "loss": 2.0, "eval_loss": 1.5}
