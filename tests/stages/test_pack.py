import itertools

import numpy as np
from hypothesis import given, strategies as st

from moai.formats.tokens import position_ids
from moai.stages.pack import concat_chunk, documents_split, length_histogram


@given(num_tokens=st.integers(0, 5000), seq_len=st.integers(2, 700), drop=st.booleans())
def test_windows_cover_every_token_once(num_tokens, seq_len, drop):
    samples = concat_chunk(num_tokens, seq_len, drop)
    covered = np.zeros(num_tokens, dtype=np.int64)
    for start, length in samples:
        assert length == seq_len or (not drop and start + length == num_tokens)
        covered[start : start + length] += 1
    if drop:
        tail = num_tokens % seq_len
        assert (covered[: num_tokens - tail] == 1).all() and (covered[num_tokens - tail :] == 0).all()
    else:
        assert (covered == 1).all()


@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=40), seq_len=st.integers(2, 64))
def test_position_ids_restart_at_document_starts(lengths, seq_len):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    for start, length in concat_chunk(int(offsets[-1]), seq_len, False):
        pos = position_ids(int(start), int(length), offsets)
        for j, p in enumerate(pos):
            t = start + j
            doc = np.searchsorted(offsets, t, side="right") - 1
            assert p == t - max(offsets[doc], start)
    # a document is split iff it spans two windows
    expected = sum(1 for a, b in itertools.pairwise(offsets) if a // seq_len != (b - 1) // seq_len)
    assert documents_split(offsets, seq_len) == expected


def test_length_histogram_counts_every_document():
    lengths = np.array([1, 2, 3, 100, 5000])
    hist = length_histogram(lengths, 64)
    assert sum(h["documents"] for h in hist) == 5 and hist[-1]["to"] is None
