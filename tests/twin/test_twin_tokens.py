"""Chained block keys: equal keys exactly when prefixes are equal; growth and cuts keep earlier keys."""

from twin.core.tokens import ROOT_KEY, SourceTable, TokenSequence


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


def _reference_keys(segments: list[tuple[int, int, int]], block_size: int) -> list[int]:
    """Block keys by the definition, one block at a time: a block inside one segment hashes (parent,
    source, offset); a block across segments hashes its parent and every piece (source, offset, length)."""
    tokens = [(s, o + j) for s, o, n in segments for j in range(n)]
    keys, prev = [], ROOT_KEY
    for b in range(len(tokens) // block_size):
        block = tokens[b * block_size:(b + 1) * block_size]
        pieces: list[list[int]] = []
        for source, offset in block:
            if pieces and pieces[-1][0] == source and pieces[-1][1] + pieces[-1][2] == offset:
                pieces[-1][2] += 1
            else:
                pieces.append([source, offset, 1])
        if len(pieces) == 1:
            prev = hash((prev, pieces[0][0], pieces[0][1]))
        else:
            prev = hash((prev, *[x for piece in pieces for x in piece]))
        keys.append(prev)
    return keys


def test_block_keys_match_the_definition_on_random_sequences() -> None:
    import random

    rng = random.Random(7)
    for _ in range(500):
        seq = TokenSequence()
        block_size = rng.choice([1, 2, 4, 16])
        for _ in range(rng.randint(1, 10)):
            if rng.random() < 0.8 or not len(seq):
                seq.extend(rng.randint(1, 3), rng.randint(0, 40), rng.randint(0, 60))
            else:
                seq.truncate(rng.randint(0, len(seq)))
            if rng.random() < 0.5:  # keys filled in increments, as a session's context grows
                assert seq.block_keys(block_size) == _reference_keys(list(seq.segments), block_size)
        assert seq.block_keys(block_size) == _reference_keys(list(seq.segments), block_size)


def test_compiled_chain_is_the_python_hash_chain(monkeypatch) -> None:
    """twin.core._blockpool.chain_keys writes out CPython's tuple and int hashes: the same keys as hash((prev,
    source, piece)) for keys anywhere in the 64-bit range (negative, past 2**61 - 1, the -1 that hashes to
    -2), and sequences keyed with and without it agree."""
    import random

    import pytest

    import twin.core.tokens

    compiled = pytest.importorskip("twin.core._blockpool").chain_keys
    rng = random.Random(3)
    edges = [ROOT_KEY, 0, -1, -2, 2**61 - 2, 2**61 - 1, 2**61, -(2**61 - 1), -(2**61), 2**63 - 1, -(2**63)]
    for _ in range(3000):
        prev = rng.choice(edges + [rng.randrange(-(2**63), 2**63)])
        source = rng.choice([0, 1, 7, 2**61 - 1, 2**62])
        first, step = rng.randrange(5000), rng.choice([1, 2, 16])
        last = first + rng.randrange(120)
        got: list[int] = []
        end = compiled(got, prev, source, first, last, step)
        want, p = [], prev
        for piece in range(first, last, step):
            p = hash((p, source, piece))
            want.append(p)
        assert got == want and end == p
    seqs = [[(rng.randint(1, 3), rng.randint(0, 40), rng.randint(1, 300)) for _ in range(4)]
            for _ in range(50)]
    keyed = [TokenSequence(list(segs)).block_keys(bs) for segs in seqs for bs in (1, 16)]
    monkeypatch.setattr(twin.core.tokens, "_CHAIN_KEYS", None)
    assert [TokenSequence(list(segs)).block_keys(bs) for segs in seqs for bs in (1, 16)] == keyed


def test_block_ids_number_keys_in_first_use_order_and_follow_cuts():
    """Numbered keys are equal exactly when the keys are; sequences sharing a table share numbers, and
    a cut drops the numbers of the blocks it drops (later blocks are numbered afresh)."""
    from twin.core.tokens import KeyTable

    src, table = SourceTable(), KeyTable()
    sys_id, a, b = src.get("sys"), src.get("a"), src.get("b")
    x = TokenSequence([(sys_id, 0, 8), (a, 0, 8)])
    y = TokenSequence([(sys_id, 0, 8), (b, 0, 4)])
    assert x.block_ids(4, table) == [1, 2, 3, 4]
    assert y.block_ids(4, table) == [1, 2, 5]  # the two system blocks are the same keys
    assert len(table) == 5
    z = x.copy()
    x.truncate(9)
    assert x.block_ids(4, table) == [1, 2]
    x.extend(b, 0, 4)  # block 2 now holds a's first token and three of b's: a new key, numbered next
    assert x.block_ids(4, table)[:2] == [1, 2] and len(x.block_keys(4)) == 3
    assert x.block_keys(4)[2] != y.block_keys(4)[2] and x.block_ids(4, table)[2] == 6
    assert z.block_ids(4, table) == [1, 2, 3, 4]
    for seq in (x, y, z):
        assert table.number(seq.block_keys(4)) == seq.block_ids(4, table)


def test_a_forgotten_stream_name_lets_go_without_reusing_its_id():
    table = SourceTable()
    a, b = table.get(("session", "a", 0)), table.get(("session", "b", 0))
    table.forget(("session", "a", 0))
    table.forget(("session", "never", 0))   # (a name never used is nothing to forget)
    assert (a, b) == (1, 2) and len(table) == 1
    assert table.get(("session", "c", 0)) == 3 and table.get(("session", "a", 0)) == 4
    assert table.get(("session", "b", 0)) == 2


def test_a_run_lets_go_of_the_stream_names_of_ended_sessions():
    from twin.config import load_config
    from twin.runner import Simulation

    sim = Simulation(load_config({"model": {"name": "Qwen/Qwen3-0.6B"}, "workload": {
        "kind": "synthetic", "num_requests": 30, "arrival": {"kind": "poisson", "rate_per_s": 20.0},
        "input_tokens": {"low": 20, "high": 100}, "output_tokens": {"low": 2, "high": 9},
        "prefix_group": "system", "prefix_tokens": 16}}))
    sim.run()
    assert len(sim.sources) == 1   # the shared prefix group's stream alone
