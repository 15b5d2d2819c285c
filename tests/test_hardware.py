import pytest

from moai.config import parse_config
from moai.hardware import Hardware, detect, plan


def cfg(**extra):
    data = {"source": {"path": "x"}, "tokenizer": {"path": "t"}}
    data.update(extra)
    return parse_config(data)


def hw(cores=2, mem=16.0, gpus=()):
    return Hardware(cores=cores, mem_available_gb=mem, disk_type="ssd", disk_free_gb=100.0, gpus=gpus)


@pytest.mark.parametrize(
    "cores, mem, procs, threads",
    [
        (1, 8.0, 1, 1),
        (2, 16.0, 2, 1),  # small machines: one process a core (benchmarks/tokenize_breakdown.py)
        (4, 16.0, 4, 1),
        (2, 0.8, 1, 2),  # memory budget 0.4 GB: one worker's worth
        (16, 128.0, 4, 4),
        (64, 512.0, 16, 4),
        (16, 1.0, 1, 16),  # memory budget 0.5 GB caps the workers
        (16, 0.8, 1, 16),
        (32, 2.0, 2, 16),
    ],
)
def test_processes_and_threads(cores, mem, procs, threads):
    p = plan(hw(cores, mem), cfg())
    assert (p.num_proc.value, p.threads_per_proc.value) == (procs, threads)
    assert p.num_proc.reason and p.threads_per_proc.reason


def test_config_beats_environment_beats_heuristic():
    env = {"num_proc": 3, "batch_size": 77, "writer_batch_size": 99}
    p = plan(hw(16, 64), cfg(), env)
    assert (p.num_proc.value, p.batch_size.value, p.writer_batch_size.value) == (3, 77, 99)
    assert "DATASET_NUM_PROC" in p.num_proc.reason
    p = plan(hw(16, 64), cfg(tokenize={"num_proc": 5, "batch_size": 11}, resources={"writer_batch_size": 12}), env)
    assert (p.num_proc.value, p.batch_size.value, p.writer_batch_size.value) == (5, 11, 12)
    assert "config" in p.num_proc.reason


def test_fast_engines_take_calls_by_text_unless_a_batch_size_is_set():
    from moai.hardware import FAST_BATCH_DOCUMENTS

    p = plan(hw(2, 16), cfg())
    assert (p.batch_size.value, p.fast_batch_size.value) == (1000, FAST_BATCH_DOCUMENTS)
    assert "4 MB" in p.fast_batch_size.reason
    for p in (plan(hw(2, 16), cfg(tokenize={"batch_size": 64})), plan(hw(2, 16), cfg(), {"batch_size": 64})):
        assert p.fast_batch_size == p.batch_size and p.batch_size.value == 64


def test_memory_mode_and_loader_workers():
    assert plan(hw(2, 1.0), cfg()).memory_mode.value == "lean"
    assert plan(hw(2, 16.0), cfg()).memory_mode.value == "stream"
    assert plan(hw(16, 64, gpus=("H100",) * 8), cfg()).loader_workers.value == 1
    assert plan(hw(16, 64, gpus=("H100",)), cfg()).loader_workers.value == 4
    assert plan(hw(16, 64), cfg(resources={"loader_workers": 0})).loader_workers.value == 0


def test_rows_cover_every_decision():
    rows = plan(hw(), cfg()).rows()
    assert [r["setting"] for r in rows] == [
        "num_proc",
        "threads_per_proc",
        "batch_size",
        "writer_batch_size",
        "memory_mode",
        "loader_workers",
        "fast_engines",
        "fast_batch_size",
        "convert_workers",
    ]
    assert all(r["reason"] for r in rows)


@pytest.mark.parametrize(
    "cores,settings,want",
    [
        (2, {}, (1, 2)),  # small machines: one process, every core a thread of the engine
        (4, {}, (1, 4)),
        (16, {}, (1, 16)),
        (64, {}, (4, 16)),
        (16, {"num_proc": 4}, (4, 4)),  # explicit settings win
        (16, {"threads_per_proc": 2}, (8, 2)),
    ],
)
def test_fast_engines_split_processes_and_threads(cores, settings, want):
    p = plan(hw(cores=cores), cfg(tokenize=settings))
    assert p.fast_engines.value == want and p.fast_engines.reason


@pytest.mark.parametrize(
    "cores,resources,want",
    [
        (2, {}, 1),  # measured slower on 2 cores: convert parses in its own thread
        (4, {}, 3),  # one worker a core, but the one convert's thread reads and writes on
        (16, {}, 15),
        (2, {"convert_workers": 3}, 3),  # explicit settings win
    ],
)
def test_convert_workers(cores, resources, want):
    p = plan(hw(cores=cores), cfg(resources=resources))
    assert p.convert_workers.value == want and p.convert_workers.reason


def test_detect_reads_this_machine(tmp_path):
    h = detect(tmp_path, with_gpus=False)
    assert h.cores >= 1 and h.mem_available_gb > 0 and h.disk_free_gb > 0
    assert h.disk_type in {"ssd", "hdd", "virtual", "network", "unknown"}


@pytest.mark.parametrize(
    "rotational, driver, name, kind",
    [
        ("1", "virtio_blk", "vda", "virtual"),  # virtio says rotational 1 whatever stores it
        ("1", "", "xvda", "virtual"),
        ("1", "sd", "sda", "hdd"),
        ("0", "nvme", "nvme0n1", "ssd"),
    ],
)
def test_a_virtual_disk_is_not_called_hdd(rotational, driver, name, kind):
    from moai.hardware import disk_kind

    assert disk_kind(rotational, driver, name) == kind
