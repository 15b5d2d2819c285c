"""The tokenize stage's ids files: past the page cache where the filesystem allows it, the same bytes
and the store's digests either way (`moai.stages.tokenize.idsfile`)."""

import mmap
import os
import sys

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
