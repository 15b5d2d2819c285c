"""XXH64 (seed 0) of many byte strings at once, vectorised with NumPy.

The strings are spans `[starts[i], ends[i])` of one byte buffer. The result equals
`xxhash.xxh64_intdigest(buffer[starts[i]:ends[i]])` for every span (tested against the xxhash
package on every length from 0 to 300 and on real text). Written from the published XXH64
algorithm: stripes of 32 bytes into four accumulators, then the tail in 8-, 4- and 1-byte steps,
then the avalanche. Every step is one NumPy pass over the spans that still have input, so a batch
of millions of short spans (word n-grams) costs a few dozen passes. Spans longer than
`LONG` bytes are few and would need one pass per 32 bytes: the xxhash package hashes those.
"""

from __future__ import annotations

import numpy as np
import xxhash

P1 = np.uint64(0x9E3779B185EBCA87)
P2 = np.uint64(0xC2B2AE3D27D4EB4F)
P3 = np.uint64(0x165667B19E3779F9)
P4 = np.uint64(0x85EBCA77C2B2AE63)
P5 = np.uint64(0x27D4EB2F165667C5)
LONG = 256
CHUNK = 65_536


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _round(acc: np.ndarray, lane: np.ndarray) -> np.ndarray:
    acc = acc + lane * P2
    return _rotl(acc, 31) * P1


def _views(buffer: bytes | bytearray | memoryview) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Little-endian u64 and u32 read at every byte offset, and the bytes (padded with zeros)."""
    raw = np.frombuffer(bytes(buffer) + bytes(8), dtype=np.uint8)
    n = len(raw) - 8
    u64 = np.ndarray(shape=(n + 1,), dtype="<u8", buffer=raw, strides=(1,))
    u32 = np.ndarray(shape=(n + 1,), dtype="<u4", buffer=raw, strides=(1,))
    return u64, u32, raw


def xxh64_spans(buffer: bytes | bytearray | memoryview, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """uint64 XXH64 (seed 0) of `buffer[starts[i]:ends[i]]` for every i."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    out = np.empty(len(starts), dtype=np.uint64)
    if not len(starts):
        return out
    lengths = ends - starts
    long = np.flatnonzero(lengths > LONG)
    if len(long):
        mv = memoryview(buffer)
        out[long] = [
            xxhash.xxh64_intdigest(mv[s:e]) for s, e in zip(starts[long].tolist(), ends[long].tolist(), strict=True)
        ]
    short = np.flatnonzero(lengths <= LONG)
    if len(short):
        views = _views(buffer)
        for lo in range(0, len(short), CHUNK):  # chunks whose passes stay in the CPU's cache
            part = short[lo : lo + CHUNK]
            out[part] = _short(views, starts[part], lengths[part])
    return out


def _short(views: tuple[np.ndarray, np.ndarray, np.ndarray], pos: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    u64, u32, raw = views
    pos = pos.copy()
    h = np.empty(len(pos), dtype=np.uint64)
    with np.errstate(over="ignore"):
        stripes = lengths // 32
        big = np.flatnonzero(stripes > 0)
        h[stripes == 0] = P5
        if len(big):
            v1 = np.full(len(big), P1 + P2, dtype=np.uint64)
            v2 = np.full(len(big), P2, dtype=np.uint64)
            v3 = np.zeros(len(big), dtype=np.uint64)
            v4 = np.full(len(big), np.uint64(0) - P1, dtype=np.uint64)
            p = pos[big]
            for s in range(int(stripes[big].max())):
                act = np.flatnonzero(stripes[big] > s)
                q = p[act] + 32 * s
                v1[act] = _round(v1[act], u64[q])
                v2[act] = _round(v2[act], u64[q + 8])
                v3[act] = _round(v3[act], u64[q + 16])
                v4[act] = _round(v4[act], u64[q + 24])
            acc = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
            for v in (v1, v2, v3, v4):
                acc = (acc ^ _round(np.zeros_like(v), v)) * P1 + P4
            h[big] = acc
            pos[big] += 32 * stripes[big]
        h += lengths.astype(np.uint64)
        rest = lengths % 32
        for k in range(3):  # 8-byte lanes
            act = np.flatnonzero(rest >= 8 * (k + 1))
            if not len(act):
                break
            lane = _round(np.zeros(len(act), dtype=np.uint64), u64[pos[act] + 8 * k])
            h[act] = _rotl(h[act] ^ lane, 27) * P1 + P4
        pos += (rest // 8) * 8
        rest %= 8
        act = np.flatnonzero(rest >= 4)
        if len(act):
            h[act] = _rotl(h[act] ^ (u32[pos[act]].astype(np.uint64) * P1), 23) * P2 + P3
            pos[act] += 4
            rest[act] -= 4
        for k in range(3):  # single bytes
            act = np.flatnonzero(rest > k)
            if not len(act):
                break
            h[act] = _rotl(h[act] ^ (raw[pos[act] + k].astype(np.uint64) * P5), 11) * P1
        h ^= h >> np.uint64(33)
        h *= P2
        h ^= h >> np.uint64(29)
        h *= P3
        h ^= h >> np.uint64(32)
    return h
