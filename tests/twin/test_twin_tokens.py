"""Chained block keys: equal keys exactly when prefixes are equal; growth and cuts keep earlier keys."""

from twin.tokens import ROOT_KEY, SourceTable, TokenSequence


def test_keys_chain_and_depend_on_the_whole_prefix():
    src = SourceTable()
    sys_id, a, b = src.get("sys"), src.get("a"), src.get("b")
    x = TokenSequence([(sys_id, 0, 6), (a, 0, 10)])
    y = TokenSequence([(sys_id, 0, 6), (b, 0, 10)])
    kx, ky = x.block_keys(4), y.block_keys(4)
    assert len(kx) == 4
    assert kx[0] == ky[0] == hash((ROOT_KEY, sys_id, 0))
    # Block 1 mixes 2 system tokens with 2 of each stream: different content, different keys from then on.
    assert kx[1] == hash((kx[0], sys_id, 4, 2, a, 0, 2))
    assert all(p != q for p, q in zip(kx[1:], ky[1:]))


def test_extending_keeps_keys_and_cuts_drop_only_later_blocks():
    src = SourceTable()
    s = src.get("s")
    seq = TokenSequence([(s, 0, 10)])
    first = list(seq.block_keys(4))
    seq.extend(s, 10, 7)  # contiguous: merged into one segment
    assert seq.segments == ((s, 0, 17),)
    grown = seq.block_keys(4)
    assert grown[:2] == first and len(grown) == 4
    fresh = TokenSequence([(s, 0, 17)]).block_keys(4)
    assert grown == fresh
    seq.truncate(9)
    assert seq.block_keys(4) == first
    seq.extend(src.get("s2"), 9, 8)
    assert seq.block_keys(4)[:2] == first and seq.block_keys(4)[2] != fresh[2]


def test_source_ids_are_handed_out_in_first_use_order():
    src = SourceTable()
    assert [src.get(n) for n in ("x", ("g", 1), "x", "y")] == [1, 2, 1, 3]
