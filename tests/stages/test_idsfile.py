"""The tokenize stage's ids files: past the page cache where the filesystem allows it, the same bytes
and the store's digests either way (`moai.stages.tokenize.idsfile`)."""

import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from moai import store
from moai.errors import CacheError
from moai.stages.tokenize import idsfile

LINUX = sys.platform.startswith("linux")


def _pieces(sizes: list[int]) -> list[bytes]:
    rng = np.random.default_rng(sum(sizes))
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


def _digests(path) -> dict[str, str]:
    out = {"xxh3_128": store.file_digest(path)}
    size = path.stat().st_size
    if size > store.SMALL_FILE_BYTES:
        out[store.SAMPLED] = store.sampled_digest(path, size)
    return out


@pytest.mark.parametrize(
    "sizes",
    [
        [],
        [1],
        [4095],
        [4096],
        [3, 4093, 1],
        [idsfile.BUFFER_BYTES],
        [idsfile.BUFFER_BYTES - 1, 2],
        [5_000_003, 7_000_001, 4_999_999, 10],  # across the buffer's edge, a tail under one block
    ],
)
def test_the_file_holds_every_byte_given_and_its_digests_are_the_stores(tmp_path, sizes):
    pieces = _pieces(sizes)
    f = idsfile.IdsFile(tmp_path / "part.bin", idsfile.new_buffer())
    if LINUX:
        assert f.direct  # this filesystem (the tests' tmp) takes O_DIRECT: that path is the one tested
    for p in pieces:
        f.write(np.frombuffer(p, dtype=np.uint8).view(np.uint32) if len(p) % 4 == 0 else p)
    digests = f.close()
    assert (tmp_path / "part.bin").read_bytes() == b"".join(pieces)
    assert digests == _digests(tmp_path / "part.bin")


def test_a_write_the_filesystem_refuses_goes_on_through_the_page_cache(tmp_path):
    # memory one byte off every alignment O_DIRECT asks for: the kernel refuses the write (EINVAL)
    raw = mmap.mmap(-1, idsfile.BUFFER_BYTES + 4096)
    buffer = memoryview(raw)[1 : idsfile.BUFFER_BYTES + 1]
    pieces = _pieces([6_000_000, 6_000_000, 123])
    f = idsfile.IdsFile(tmp_path / "part.bin", buffer)
    for p in pieces:
        f.write(p)
    if LINUX:
        assert not f.direct
    digests = f.close()
    buffer.release()
    raw.close()
    assert (tmp_path / "part.bin").read_bytes() == b"".join(pieces)
    assert digests == _digests(tmp_path / "part.bin")


def test_going_to_the_page_cache_midway_keeps_every_byte(tmp_path):
    pieces = _pieces([9_000_001, 1_234_567, 3_000_000])
    f = idsfile.IdsFile(tmp_path / "part.bin", idsfile.new_buffer())
    f.write(pieces[0])
    f.to_page_cache()  # what the stage does once the disk is behind the encoder
    assert not f.direct
    for p in pieces[1:]:
        f.write(p)
    f.close()
    assert (tmp_path / "part.bin").read_bytes() == b"".join(pieces)


def test_without_a_buffer_the_file_goes_through_the_page_cache(tmp_path):
    f = idsfile.IdsFile(tmp_path / "part.bin", None)
    assert not f.direct
    f.write(b"abc")
    assert f.close() == {"xxh3_128": store.file_digest(tmp_path / "part.bin")}


def test_publishing_takes_digests_remembered_only_while_the_file_is_unchanged(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(store.SMALL_FILE_BYTES + 10))
    real = store.describe_files(tmp_path)["big.bin"]
    told = {"xxh3_128": "0" * 32, store.SAMPLED: "1" * 32}
    store.remember_digests(big, told)
    assert store.describe_files(tmp_path)["big.bin"] == {"bytes": big.stat().st_size, **told}  # not read again
    assert store.describe_files(tmp_path)["big.bin"] == real  # used once

    store.remember_digests(big, told)
    with open(big, "ab") as f:  # written after its digests were taken: they are not used
        f.write(b"x")
    assert store.describe_files(tmp_path)["big.bin"] == {**_digests(big), "bytes": big.stat().st_size}


def test_a_disk_that_fills_under_direct_writes_is_the_stores_one_line(small_disk):
    def builder(out):
        f = idsfile.IdsFile(out / "part.bin", idsfile.new_buffer())
        assert f.direct  # tmpfs takes O_DIRECT (Linux 6.6 on)
        try:
            for p in _pieces([idsfile.BUFFER_BYTES, 1000]):  # 8 MiB into 1 MiB
                f.write(p)
        finally:
            f.close()  # as the stage does (`parts._close`): the file is closed whatever happened
        return {}

    with pytest.raises(CacheError, match=r"^tokenize: the disk is full \(No space left on device\) building into "):
        store.Store(small_disk / "cache").build("tokenize", "k" * 20, builder)
    assert list((small_disk / "cache" / "tokenize").iterdir()) == []  # nothing published, nothing left


@pytest.fixture
def slow_disk_cgroup(tmp_path):
    """A cgroup v1 blkio group whose direct writes to tmp_path's disk are held to 10 MB/s (root,
    Linux with the v1 blkio controller mounted; skipped elsewhere). Throttling there applies to
    direct I/O only: the page cache's writeback is not held back, as on a slow disk it would be
    only once the dirty pages pass the kernel's limits."""
    blkio = Path("/sys/fs/cgroup/blkio")
    if os.geteuid() != 0 or not (blkio / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 blkio controller to hold a disk back")
    dev = os.stat(tmp_path).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if (sysfs / "partition").exists():  # throttling takes the whole disk
        sysfs = sysfs.resolve().parent
    group = blkio / f"moai-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "blkio.throttle.write_bps_device").write_text(f"{(sysfs / 'dev').read_text().strip()} 10000000")
        yield group
    finally:
        group.rmdir()


ENCODE_IN = """
import json, os, sys
from pathlib import Path
if sys.argv[4]:
    Path(sys.argv[4], "cgroup.procs").write_text(str(os.getpid()))  # from here on, this process only
from moai.stages import tokenize as tk
from moai.stages.tokenize import idsfile
from moai.stages.tokenizer import describe, load_tokenizer
idsfile.Pace.MIN_BYTES = 1 << 20  # a small corpus: decide after 1 MiB
info = describe(load_tokenizer(sys.argv[1]), sys.argv[1], "fp")
out = Path(sys.argv[3])
out.mkdir()
r = tk.tokenize(info, Path(sys.argv[2]), out, num_proc=1, threads_per_proc=2, batch_size=1000, engine="auto",
                fast_split=(1, 2), progress=False)
print(json.dumps(r["profile"][0]))
"""


@pytest.mark.slow
def test_a_disk_held_back_sends_the_ids_through_the_page_cache_with_the_same_bytes(
    tmp_path, tokenizer_dir, slow_disk_cgroup
):
    import json
    import subprocess

    from conftest import make_texts, saved_text

    saved = saved_text(tmp_path, [t for t in make_texts(150_000, seed=11) if t.strip()])
    profiles = {}
    for name, group in (("free", ""), ("held", str(slow_disk_cgroup))):
        run = subprocess.run(
            [sys.executable, "-c", ENCODE_IN, str(tokenizer_dir), str(saved), str(tmp_path / name), group],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        profiles[name] = json.loads(run.stdout.strip().splitlines()[-1])
    bins = sorted((tmp_path / "free").rglob("*.bin"))
    whole_blocks = sum(p.stat().st_size - p.stat().st_size % idsfile.ALIGN for p in bins)
    assert whole_blocks > 4 << 20
    # at 10 MB/s the disk is behind after the first MiB or so: the rest through the page cache
    assert 1 << 20 <= profiles["held"]["ids_direct_bytes"] < whole_blocks / 2
    for p in bins:
        assert p.read_bytes() == (tmp_path / "held" / p.relative_to(tmp_path / "free")).read_bytes(), p
