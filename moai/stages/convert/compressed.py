"""Compressed sources: which codec a file is in, and a stream of its decompressed bytes.

A codec is chosen by the name's last extension (`.gz`, `.zst`, `.bz2`, `.xz`; the one before it is
the format: `shard.jsonl.zst`) and confirmed by the file's first bytes, its magic number. A file
whose bytes are compressed under a plain name (a gzip file named `.jsonl`) is read as what its
bytes are; a name that promises a codec the bytes do not have is an error naming both. Every magic
number here but bzip2's starts with a byte that no UTF-8 text starts with, so no text file is
mistaken for a compressed one; bzip2's is checked over its first ten bytes (block or end marker).

Decompression streams: the compressed bytes pass through the caller's hashing reader (so the
fingerprint and the hash-as-read are of the compressed file, as stored) and are decompressed in
chunks; nothing is written to disk. Decompressors: `zstandard` for zstd (the reference C library;
frames one after another, a truncated file is an error); `isal` for gzip (Intel ISA-L's inflate,
faster than the standard library's zlib: see benchmarks/compressed.py; multi-member files
included); the standard library's `bz2` and `lzma`.
"""

from __future__ import annotations

import bz2
import io
import lzma
import queue
import threading
import zlib
from pathlib import Path
from typing import Any

from moai.errors import DataError
from moai.remote import RemoteObject
from moai.stages.convert.chunks import QueuedChunks

SourceFile = Path | RemoteObject  # a local file, or an object a URL names (str() is its URL)

CODECS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bzip2", ".xz": "xz"}
# the command that tests a file of each codec, for the fix in an error message
_TEST_COMMAND = {"gzip": "gzip -t", "zstd": "zstd -t", "bzip2": "bzip2 -t", "xz": "xz -t"}
HEAD_BYTES = 16


def codec_of_name(path: SourceFile) -> str | None:
    """The codec the file's name promises (`shard.jsonl.zst` → zstd), or None."""
    return CODECS.get(path.suffix.lower())


def format_suffix(path: SourceFile) -> str:
    """The extension that names the format: `.jsonl` for both `shard.jsonl` and `shard.jsonl.zst`."""
    if codec_of_name(path) is not None:
        return Path(path.stem).suffix.lower()
    return path.suffix.lower()


def sniff(head: bytes) -> str | None:
    """The codec the first bytes of a file are in, by magic number; None for anything else."""
    if head.startswith(b"\x1f\x8b\x08"):
        return "gzip"
    # a zstd frame, or a skippable frame (pzstd writes one first): 0x184D2A50-5F, little-endian
    if head.startswith(b"\x28\xb5\x2f\xfd") or (
        len(head) >= 4 and 0x50 <= head[0] <= 0x5F and head[1:4] == b"\x2a\x4d\x18"
    ):
        return "zstd"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    # "BZh", the block size 1-9, then a block's magic (pi) or the end of stream (sqrt(pi)) of an empty one
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0" and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bzip2"
    return None


# Binary formats moai does not decompress, by magic number: named, with what to do, instead of
# an "invalid UTF-8" at the first line.
OTHER_FORMATS = {
    b"PK\x03\x04": ("a zip archive", "unzip it and point source.path at the files inside"),
    b"7z\xbc\xaf\x27\x1c": ("a 7-Zip archive", "extract it and point source.path at the files inside"),
    b"\x04\x22\x4d\x18": ("lz4 data", "recompress it with zstd (lz4 -dc FILE | zstd -o FILE.zst)"),
    b"\xff\x06\x00\x00sNaPpY": ("framed snappy data", "recompress it with zstd or gzip"),
    b"PAR1": ("a parquet file", "name it .parquet"),
}


def codec_of(path: SourceFile, head: bytes) -> str | None:
    """The codec to read `path` with: its bytes' (by magic number) when they have one, checked
    against the one its name promises; an empty file is read as it is (it has no rows)."""
    named, found = codec_of_name(path), sniff(head)
    for magic, (what, fix) in OTHER_FORMATS.items():
        if found is None and head.startswith(magic):
            raise DataError(f"{path}: its bytes are {what} (first bytes {head[:6].hex(' ')}), not text: {fix}")
    if named is not None and head and found != named:
        what = f"{found} data" if found else "not compressed (or not in a format moai reads)"
        raise DataError(
            f"{path}: named {path.suffix} ({named}) but its bytes are {what}, first bytes {head[:6].hex(' ')}; "
            f"rename it to match its content{f' ({Path(path.stem).name}{_suffix(found)})' if found else ''} "
            "or recompress it"
        )
    return found


def _suffix(codec: str) -> str:
    return next(s for s, c in CODECS.items() if c == codec)


def read_head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(HEAD_BYTES)


def decompressing(raw: Any, codec: str) -> io.RawIOBase:
    """A file object of `raw`'s decompressed bytes; reading it reads `raw` front to back, in chunks.
    The caller closes `raw` (the decompressor leaves it open)."""
    if codec == "zstd":
        return _ZstdStream(raw)
    if codec == "gzip":
        from isal import igzip

        return igzip.IGzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if codec == "bzip2":
        return bz2.BZ2File(raw, "rb")  # type: ignore[return-value]
    assert codec == "xz", codec
    return lzma.LZMAFile(raw, "rb")  # type: ignore[return-value]


# compressed bytes the zstd reader takes at once: each take runs Python (the frame walker, the
# hashing reader), which a decompressing thread must wait for the GIL to do; 128 KiB by default
_ZSTD_READ_BYTES = 1 << 22


class _ZstdStream(io.RawIOBase):
    """zstd frames one after another (pzstd, concatenated shards, skippable frames) as one stream.

    `zstandard`'s `stream_reader` decompresses, straight into the caller's buffer (~1.2x the speed of
    a `decompressobj` loop here), but ends quietly where a truncated file ends, so a cut shard would
    read as a shorter one. `_ZstdFrames` walks the frame and block headers of the compressed bytes
    as the reader takes them (a few hundred headers for a 10 MB file): a file that ends inside a
    frame raises `EOFError`, as gzip, bz2 and xz do.
    """

    def __init__(self, raw: Any):
        import zstandard

        super().__init__()
        self._frames = _ZstdFrames()
        walked = _Walked(raw, self._frames)
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            walked,  # type: ignore[arg-type]
            read_size=_ZSTD_READ_BYTES,
            read_across_frames=True,
            closefd=False,
        )

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._reader.readinto(buffer)
        if n == 0 and not self._frames.complete:
            raise EOFError("the file ends inside a zstd frame")
        return n


class _Walked(io.RawIOBase):
    """The compressed bytes as the decompressor reads them, shown to the frame walker on the way."""

    def __init__(self, raw: Any, frames: _ZstdFrames):
        super().__init__()
        self._raw, self._frames = raw, frames

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)
        if n:
            self._frames.feed(memoryview(buffer)[:n])
        return n


class _ZstdFrames:
    """Where a zstd stream stands, from its headers alone (RFC 8878): whether it ends between frames.

    A frame is its magic number, a header whose length its first byte gives, blocks (a 3-byte
    header: last-block flag, type, size; an RLE block holds 1 byte) and, if flagged, a 4-byte
    checksum; a skippable frame is its magic number, a 4-byte length and that many bytes.
    """

    def __init__(self) -> None:
        self._state = "magic"  # the header being read: magic, skippable (its length), frame, block
        self._want = 4  # its length in bytes
        self._buf = bytearray()
        self._skip = 0  # bytes to pass over before the next header (block contents, frame header)
        self._checksum = False

    @property
    def complete(self) -> bool:
        return self._state == "magic" and not self._buf and not self._skip

    def feed(self, data: memoryview) -> None:
        i, n = 0, len(data)
        while i < n and self._state != "unknown":
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            take = min(self._want - len(self._buf), n - i)
            self._buf += data[i : i + take]
            i += take
            if len(self._buf) == self._want:
                self._header(bytes(self._buf))
                self._buf.clear()

    def _header(self, h: bytes) -> None:
        if self._state == "magic":
            magic = int.from_bytes(h, "little")
            if magic == 0xFD2FB528:
                self._state, self._want = "frame", 1
            elif magic & 0xFFFFFFF0 == 0x184D2A50:
                self._state, self._want = "skippable", 4
            else:
                self._state = "unknown"  # not zstd: the decompressor says so, naming the error
        elif self._state == "skippable":
            self._skip, self._state, self._want = int.from_bytes(h, "little"), "magic", 4
        elif self._state == "frame":
            d = h[0]
            single_segment = d >> 5 & 1
            content_size = (single_segment, 2, 4, 8)[d >> 6]
            self._checksum = bool(d >> 2 & 1)
            self._skip = (1 - single_segment) + (0, 1, 2, 4)[d & 3] + content_size
            self._state, self._want = "block", 3
        else:
            b = int.from_bytes(h, "little")
            last, kind, size = b & 1, b >> 1 & 3, b >> 3
            self._skip = 1 if kind == 1 else size
            if last:
                self._skip += 4 if self._checksum else 0
                self._state, self._want = "magic", 4


AHEAD_MIN_BYTES = 1 << 20  # a smaller file is decompressed by the parser: a thread costs more than it saves
AHEAD_CHUNK_BYTES = 1 << 22


class DecompressedAhead(QueuedChunks):
    """The decompressed bytes of `stream`, made by a thread of its own while the parser parses.

    zstd and gzip decompressors release the GIL while they work, so decompression runs on another
    core beside the parser instead of adding to its time. Three buffers of `AHEAD_CHUNK_BYTES` go
    round (one being filled, one ready, one being parsed): nothing is allocated per chunk, and the
    thread takes the GIL a few times per chunk only (each time it may wait the interpreter's 5 ms
    switch interval for it: smaller chunks or small reads of the compressed bytes starve it).
    An error of the thread's (a corrupt file, a lost connection) is raised by the read that reaches
    it. `close()` stops the thread and waits for its chunk in progress, before the caller closes
    `stream`.
    """

    def __init__(self, stream: Any, buffers: int = 3):
        super().__init__()
        self._free: queue.SimpleQueue[bytearray | None] = queue.SimpleQueue()
        self._ready: queue.SimpleQueue[tuple[bytearray, int] | BaseException] = queue.SimpleQueue()
        for _ in range(buffers):
            self._free.put(bytearray(AHEAD_CHUNK_BYTES))
        self._stop = threading.Event()
        self._held: bytearray | None = None  # the buffer being parsed, back to the thread once read
        self._thread = threading.Thread(target=self._run, args=(stream,), name="moai-decompress", daemon=True)
        self._thread.start()

    def _run(self, stream: Any) -> None:
        try:
            while (buf := self._free.get()) is not None and not self._stop.is_set():
                view, got = memoryview(buf), 0
                while got < len(buf) and (n := stream.readinto(view[got:])):
                    got += n
                self._ready.put((buf, got))
                if not got:
                    return
        except BaseException as err:
            self._ready.put(err)

    def _next_chunk(self) -> memoryview:
        if self._held is not None:
            self._free.put(self._held)
            self._held = None
        item = self._ready.get()
        if isinstance(item, BaseException):
            raise item
        self._held, n = item
        return memoryview(self._held)[:n]

    def close(self) -> None:
        if not self.closed:
            self._stop.set()
            self._free.put(None)
            self._thread.join()
            self._held = None
        super().close()


def decompress_errors() -> tuple[type[BaseException], ...]:
    """What the decompressors raise on truncated or corrupt data."""
    import zstandard
    from isal import igzip, isal_zlib

    isal_error: type[BaseException] = isal_zlib.error  # type: ignore[assignment]  # a class; the stubs say instance
    return (EOFError, OSError, zlib.error, lzma.LZMAError, zstandard.ZstdError, igzip.BadGzipFile, isal_error)


def corrupt(path: SourceFile, codec: str, err: BaseException) -> DataError:
    return DataError(
        f"{path}: cannot decompress its {codec} data ({type(err).__name__}: {err}): the file is truncated or "
        f"corrupt; check it with `{_TEST_COMMAND[codec]} {path}` and replace it"
    )


SAMPLE_BYTES = 1 << 20


def text_bytes(paths: list[SourceFile]) -> int:
    """The bytes of text the files hold, for plan's estimates: a compressed file counts its size
    times the ratio measured on the first MiB of the first compressed file (not every shard's
    bytes are read before the run; shards of one corpus compress alike)."""
    total, ratio = 0, None
    for p in paths:
        if isinstance(p, RemoteObject):  # its listing's size; by name only (no request per object)
            size, codec = p.size, codec_of_name(p)
        else:
            size, codec = p.stat().st_size, codec_of_name(p) or sniff(read_head(p))
        if codec is None:
            total += size
            continue
        if ratio is None:
            ratio = _ratio(p, codec)
        total += int(size * ratio)
    return total


def _ratio(path: SourceFile, codec: str) -> float:
    """Decompressed over compressed bytes of the file's first MiB (1.0 if it cannot be read)."""
    with path.open("rb") as f:
        head = io.BytesIO(f.read(SAMPLE_BYTES))
    out = 0
    errors: tuple[type[BaseException], ...] = (*decompress_errors(), ValueError)
    try:
        with decompressing(head, codec) as d:
            while chunk := d.read(1 << 20):
                out += len(chunk)
    except errors:
        pass  # the sample ends inside a block: what came out until there is the measure
    used = head.tell()
    return out / used if out and used else 1.0
