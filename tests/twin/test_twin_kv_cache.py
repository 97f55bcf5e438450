"""Block pool and KV manager: exact block ids, reference counts, eviction order (vLLM v1 semantics)."""

import pytest
from twin_testkit import make_request

from twin.core.errors import InvariantError
from twin.core.kv_cache import BlockPool, KVCacheManager, PyBlockPool

POOLS = [PyBlockPool] if BlockPool is PyBlockPool else [PyBlockPool, BlockPool]
"""The Python pool, and the compiled one where it is built: the pool-level tests run on each."""


@pytest.fixture(params=POOLS, ids=lambda cls: cls.__module__)
def pool_cls(request: pytest.FixtureRequest) -> type[PyBlockPool]:
    return request.param


def free_list(pool: PyBlockPool) -> list[int]:
    return pool.free_order()


def test_pool_allocates_from_head_and_frees_to_tail(pool_cls: type[PyBlockPool]) -> None:
    pool = pool_cls(5)
    assert pool.allocate(2) == [0, 1]
    assert free_list(pool) == [2, 3, 4]
    pool.release([1, 0])
    assert free_list(pool) == [2, 3, 4, 1, 0]
    assert pool.allocate(4) == [2, 3, 4, 1]
    with pytest.raises(InvariantError):
        pool.allocate(2)
    assert pool.allocate_one() == 0
    with pytest.raises(InvariantError):
        pool.allocate_one()


def test_scripted_sequence_block_ids_and_eviction_order():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    pool = kv.pool
    # A: 10-token prompt -> 3 blocks, the two full ones cached.
    a = make_request(1, prompt=10, output=2, shared=("sys", 4), stream="a")
    assert kv.get_computed_blocks(a) == []
    assert kv.allocate_slots(a, 10)
    assert kv.blocks_of(a) == [0, 1, 2]
    assert pool.cached == {a.block_keys[0]: 0, a.block_keys[1]: 1}
    a.num_computed_tokens = 10

    # B shares A's first block (the 4-token system prompt), then differs.
    b = make_request(2, prompt=9, output=2, shared=("sys", 4), stream="b")
    assert b.block_keys[0] == a.block_keys[0] and b.block_keys[1] != a.block_keys[1]
    hits = kv.get_computed_blocks(b)
    assert hits == [0]
    assert kv.allocate_slots(b, 9 - 4, hits)
    assert kv.blocks_of(b) == [0, 3, 4]
    assert pool.ref_cnt[:5] == [2, 1, 1, 1, 1]
    assert pool.cached == {a.block_keys[0]: 0, a.block_keys[1]: 1, b.block_keys[1]: 3}

    # Freeing releases tail first: A's blocks join the free queue as 2, 1 (0 is still B's).
    kv.free(a)
    assert free_list(pool) == [5, 6, 7, 8, 9, 2, 1]
    kv.free(b)
    assert free_list(pool) == [5, 6, 7, 8, 9, 2, 1, 4, 3, 0]
    assert pool.num_used == 0 and pool.num_cached == 3

    # C takes 7 blocks: the empty ones first, then A's tail (2, unhashed) and A's second block (1, evicted).
    c = make_request(3, prompt=28, output=1, stream="c")
    assert kv.allocate_slots(c, 28)
    assert kv.blocks_of(c) == [5, 6, 7, 8, 9, 2, 1]
    assert pool.evictions == 1
    assert a.block_keys[1] not in pool.cached
    assert free_list(pool) == [4, 3, 0]
    # The shared system-prompt block survived: a new request sharing it still hits.
    d = make_request(4, prompt=8, output=1, shared=("sys", 4), stream="d")
    assert kv.get_computed_blocks(d) == [0]
    pool.check()


def test_allocation_is_all_or_nothing_and_counts_free_hits():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a = make_request(1, prompt=8, output=1, stream="x")
    assert kv.allocate_slots(a, 8)
    kv.free(a)  # blocks 1, 0 are cached and free
    assert kv.pool.free_order() == [2, 1, 0]
    # Same prefix, 13-token prompt: 2 hit blocks (both free) + 2 new blocks; only 1 truly free -> refused.
    b = make_request(2, prompt=13, output=1, stream="x")
    hits = kv.get_computed_blocks(b)
    assert hits == [0, 1]
    assert not kv.allocate_slots(b, 5, hits)
    assert kv.pool.free_order() == [2, 1, 0] and kv.blocks_of(b) == ()
    # 12-token prompt: 2 hits + 1 new block -> fits exactly.
    c = make_request(3, prompt=12, output=1, stream="x")
    hits = kv.get_computed_blocks(c)
    assert hits == [0, 1]
    assert kv.allocate_slots(c, 4, hits)
    assert kv.blocks_of(c) == [0, 1, 2]
    assert kv.pool.num_free == 0


def test_hit_is_capped_one_token_short_of_the_prompt():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = make_request(1, prompt=8, output=4, stream="y")
    kv.allocate_slots(a, 8)
    kv.free(a)
    same = make_request(2, prompt=8, output=4, stream="y")
    # 8 prompt tokens are cached, but the last one must be recomputed to sample: only block 0 counts.
    assert kv.get_computed_blocks(same) == [0]


def test_prefix_caching_off_never_hits():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = make_request(1, prompt=8, output=1, stream="z")
    kv.allocate_slots(a, 8)
    kv.free(a)
    assert kv.pool.cached == {}
    assert kv.get_computed_blocks(make_request(2, prompt=9, output=1, stream="z")) == []


class _ReferencePool:
    """The block pool as first written (an OrderedDict free queue, one block at a time): the specification
    the optimised :class:`BlockPool` must match block for block. With ``keep_duplicates`` its cache is
    vLLM's BlockHashToBlockMap written out: a key maps to every block registered under it, in insertion
    order, a lookup finds the first, an eviction removes just that block."""

    def __init__(self, num_blocks: int, keep_duplicates: bool = False) -> None:
        from collections import OrderedDict

        self.ref_cnt = [0] * num_blocks
        self.block_key: list[int | None] = [None] * num_blocks
        self.by_key: dict[int, dict[int, None]] = {}
        self.keep_duplicates = keep_duplicates
        self.free_queue = OrderedDict.fromkeys(range(num_blocks))
        self.evicted: list[tuple[int, int]] = []
        self.evictions = 0

    @property
    def cached(self) -> dict[int, int]:
        return {key: next(iter(blocks)) for key, blocks in self.by_key.items()}

    @property
    def dups(self) -> dict[int, list[int]]:
        return {key: list(blocks)[1:] for key, blocks in self.by_key.items() if len(blocks) > 1}

    def allocate(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            block, _unused = self.free_queue.popitem(last=False)
            key = self.block_key[block]
            if key is not None:
                self.block_key[block] = None
                self.evictions += 1
                del self.by_key[key][block]
                if not self.by_key[key]:  # the last copy: the key leaves the GPU (host-tier hook)
                    del self.by_key[key]
                    self.evicted.append((block, key))
            self.ref_cnt[block] = 1
            out.append(block)
        return out

    def touch(self, blocks: list[int]) -> None:
        for block in blocks:
            if self.ref_cnt[block] == 0:
                del self.free_queue[block]
            self.ref_cnt[block] += 1

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                self.free_queue[block] = None

    def cache(self, block: int, key: int) -> None:
        if self.block_key[block] is None and (key not in self.by_key or self.keep_duplicates):
            self.by_key.setdefault(key, {})[block] = None
            self.block_key[block] = key


@pytest.mark.parametrize("keep_duplicates", [False, True])
@pytest.mark.parametrize("seed,slack", [(0, 1024), (1, 1024), (2, 0), (3, 1)])
def test_pool_matches_reference_block_for_block(seed: int, slack: int, keep_duplicates: bool,
                                                pool_cls: type[PyBlockPool]) -> None:
    """Random allocate (and allocate_one) / touch / release / cache sequences: same ids, free order, cache
    and evictions as the one-block-at-a-time ordered-dictionary pool (small ``slack`` exercises free-queue
    compaction); blocks are also registered under keys already cached (kept as further copies, or left
    uncached), and a lookup finds the oldest copy left."""
    import random

    rng = random.Random(seed)
    n = 48
    evicted: list[tuple[int, int]] = []
    pool = pool_cls(n, on_evict=lambda b, k: evicted.append((b, k)), keep_duplicates=keep_duplicates)
    pool.compact_slack = slack
    ref = _ReferencePool(n, keep_duplicates)
    held: list[list[int]] = []  # block tables of live "requests"
    next_key = 1
    for _ in range(3000):
        op = rng.random()
        if op < 0.35 and pool.num_free:
            k = rng.randint(1, min(pool.num_free, 12))
            got = [pool.allocate_one()] if k == 1 and len(held) % 2 else pool.allocate(k)  # both paths
            assert got == ref.allocate(k)
            held.append(got)
        elif op < 0.55 and held:
            table = held.pop(rng.randrange(len(held)))
            pool.release(reversed(table))
            ref.release(list(reversed(table)))
        elif op < 0.75 and pool.cached:
            keys = rng.sample(sorted(pool.cached), rng.randint(1, min(6, len(pool.cached))))
            hits = [pool.cached[k] for k in keys]
            pool.touch(hits)
            ref.touch(hits)
            held.append(hits)
        elif held:
            table = rng.choice(held)
            for block in table:
                if pool.cached and rng.random() < 0.3:  # the content of a block already cached
                    key = rng.choice(sorted(pool.cached))
                else:
                    key, next_key = next_key, next_key + 1
                pool.cache(block, key)
                ref.cache(block, key)
        assert pool.free_order() == list(ref.free_queue)
        assert pool.ref_cnt == ref.ref_cnt and pool.block_key == ref.block_key and pool.cached == ref.cached
        assert pool.dups == ref.dups
        assert evicted == ref.evicted and pool.evictions == ref.evictions
        assert pool.num_free == len(ref.free_queue)
        assert pool.num_cached == n - pool.block_key.count(None)
        pool.check()
    assert not keep_duplicates or pool.evictions > len(evicted), "no copy was evicted"


@pytest.mark.parametrize("caching", [True, False])
def test_append_one_is_allocate_slots_for_one_token(caching: bool) -> None:
    """Decoding through ``append_one`` (room in the last block, else one new block) leaves the same block
    tables, free queue and cache as ``allocate_slots(req, 1)``; both refuse when no block is free."""
    fast = KVCacheManager(num_blocks=12, block_size=4, enable_prefix_caching=caching)
    slow = KVCacheManager(num_blocks=12, block_size=4, enable_prefix_caching=caching)
    reqs = [make_request(i, prompt=5 + 3 * i, output=30, shared=("sys", 4), stream=f"d{i}") for i in range(3)]
    for kv in (fast, slow):
        for r in reqs:
            r.num_computed_tokens = 0
            assert kv.allocate_slots(r, r.prompt_tokens, kv.get_computed_blocks(r))
    computed = {r.id: r.prompt_tokens for r in reqs}
    refused = 0
    for step in range(30):
        for r in reqs:
            r.num_output_tokens = computed[r.id] - r.prompt_tokens + 1  # one new token to compute
            r.num_computed_tokens = computed[r.id]
            ok_fast = fast.append_one(r) or fast.allocate_slots(r, 1)
            ok_slow = slow.allocate_slots(r, 1)
            assert ok_fast == ok_slow
            refused += not ok_fast
            if ok_fast:
                computed[r.id] += 1
            assert fast.blocks_of(r) == slow.blocks_of(r)
        assert fast.pool.free_order() == slow.pool.free_order() and fast.pool.cached == slow.pool.cached
    assert refused  # the pool ran dry on the way


@pytest.mark.parametrize("keep_duplicates", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_match_prefix_is_lookup_key_by_key(seed: int, keep_duplicates: bool, pool_cls: type[PyBlockPool]) -> None:
    """``match_prefix`` (successor hints, dictionary only where a hint fails) returns the blocks that looking
    every key up in ``cached`` until the first miss returns, while chains are cached, evicted and re-cached;
    keys equal in value but distinct objects match too."""
    import random

    rng = random.Random(seed)
    pool = pool_cls(40, keep_duplicates=keep_duplicates)
    # Chains over a tree of prefixes: chain c shares its first blocks with chain c // 3.
    base = 1 << 62  # large ints, so equal keys built twice are distinct objects
    chains: list[list[int]] = []
    for c in range(24):
        parent = chains[c // 3][: rng.randint(0, 6)] if c else []
        chains.append(parent + [base + 1000 * c + i for i in range(rng.randint(1, 12))])
    held: list[list[int]] = []

    def lookup(keys: list[int], limit: int) -> list[int]:
        found = []
        for key in keys[:limit]:
            block = pool.cached.get(key)
            if block is None:
                break
            found.append(block)
        return found

    for _ in range(2000):
        chain = rng.choice(chains)
        probe = [int(str(k)) if rng.random() < 0.3 else k for k in chain]
        limit = rng.randint(0, len(chain))
        assert pool.match_prefix(probe, limit) == lookup(probe, limit)
        op = rng.random()
        if op < 0.5:
            hits = pool.match_prefix(chain, len(chain))
            need = len(chain) - len(hits)
            if need > pool.num_free - sum(1 for b in hits if pool.ref_cnt[b] == 0):
                continue
            pool.touch(hits)
            blocks = hits + pool.allocate(need)
            for block, key in zip(blocks[len(hits):], chain[len(hits):]):
                pool.cache(block, key)  # (a key after a missed one may be cached: a further copy)
            held.append(blocks)
        elif held:
            pool.release(reversed(held.pop(rng.randrange(len(held)))))
        pool.check()
    assert not keep_duplicates or pool.dups or pool.evictions, "no copy was made"


@pytest.mark.parametrize("keep_duplicates", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_compiled_pool_is_the_python_pool(seed: int, keep_duplicates: bool) -> None:
    """The compiled pool (twin/core/_blockpool.pyx) against :class:`PyBlockPool` on one random sequence of every
    operation (allocate, allocate_one, touch, release, cache, cache_run, match_prefix, refused calls): the
    same return values, errors, evictions in the same order, and the same state after every operation."""
    compiled = pytest.importorskip("twin.core._blockpool").BlockPool
    import random

    rng = random.Random(seed)
    n = 64
    log_py: list[tuple[int, int]] = []
    log_c: list[tuple[int, int]] = []
    py = PyBlockPool(n, on_evict=lambda b, k: log_py.append((b, k)), keep_duplicates=keep_duplicates)
    c = compiled(n, on_evict=lambda b, k: log_c.append((b, k)), keep_duplicates=keep_duplicates)
    py.compact_slack = c.compact_slack = rng.choice([0, 3, 1024])
    chains = [[(1 << 62) + 100 * ch + i for i in range(rng.randint(2, 14))] for ch in range(20)]
    held: list[list[int]] = []

    def same(call):  # the same result, or the same error, from both pools
        outcome = []
        for pool in (py, c):
            try:
                outcome.append(("ok", call(pool)))
            except (InvariantError, IndexError) as err:
                outcome.append((type(err).__name__, str(err)))
        assert outcome[0] == outcome[1]
        return outcome[0][1]

    for _ in range(2500):
        op = rng.random()
        chain = rng.choice(chains)
        if op < 0.3:  # a request: prefix hits, then new blocks registered in one run
            limit = rng.randint(0, len(chain))
            hits = same(lambda p: p.match_prefix(chain, limit))
            need = len(chain) - len(hits)
            free_hits = same(lambda p: p.unreferenced(hits))
            if need > py.num_free - free_hits:
                same(lambda p: p.allocate(p.num_free + 1))  # refused, changes nothing
                continue
            same(lambda p: p.touch(hits))
            new = same(lambda p: p.allocate(need)) if need != 1 else [same(lambda p: p.allocate_one())]
            same(lambda p: p.cache_run(chain[len(hits):], new))
            held.append(hits + new)
        elif op < 0.5 and held:
            table = held.pop(rng.randrange(len(held)))
            same(lambda p: p.release(reversed(table)))
        elif op < 0.6 and held:  # one block at a time, keys possibly taken by another block already
            table = rng.choice(held)
            block = rng.choice(table)
            key = rng.choice(chain)
            same(lambda p: p.cache(block, key))
        assert py.free_order() == c.free_order()
        assert py.ref_cnt == c.ref_cnt and py.block_key == c.block_key and py.cached == c.cached
        assert py.dups == c.dups and py.copies() == c.copies()
        assert (py.num_free, py.num_used, py.num_cached, py.evictions) == (c.num_free, c.num_used, c.num_cached,
                                                                         c.evictions)
        assert log_py == log_c
        py.check()
        c.check()
    assert log_py, "the sequence never evicted"


def test_compiled_pool_refuses_as_the_python_pool_does() -> None:
    """Errors name the same thing in both pools: too many blocks asked for, a block released twice."""
    compiled = pytest.importorskip("twin.core._blockpool").BlockPool
    for cls in (PyBlockPool, compiled):
        pool = cls(3)
        with pytest.raises(InvariantError, match=r"allocate\(4\) with only 3 free blocks"):
            pool.allocate(4)
        pool.allocate(3)
        with pytest.raises(InvariantError, match="allocate\\(1\\) with no free block"):
            pool.allocate_one()
        pool.release([2])
        with pytest.raises(InvariantError, match="block 2 released more often than referenced"):
            pool.release([2])


def test_per_request_state_blocks_by_id() -> None:
    """A model with constant per-request state (state_blocks 2): a request's first allocation takes its state
    blocks before its token blocks, they are never cached, and freeing releases the state first (reused
    first), then the token blocks tail first. Allocation is all or nothing with the state counted."""
    kv = KVCacheManager(num_blocks=8, block_size=4, state_blocks=2)
    pool = kv.pool
    a = make_request(1, prompt=10, output=2, stream="a")
    assert kv.blocks_needed(a, 10) == 3 + 2
    assert kv.allocate_slots(a, 10)
    assert kv.req_state[1] == [0, 1] and kv.blocks_of(a) == [2, 3, 4]
    assert set(pool.cached.values()) == {2, 3}          # the two full token blocks; no state block
    a.num_computed_tokens = 10
    assert kv.blocks_needed(a, 2) == 0                   # its state is held already
    b = make_request(2, prompt=5, output=1, stream="b")
    assert kv.blocks_needed(b, 5) == 2 + 2 and pool.num_free == 3
    assert not kv.allocate_slots(b, 5)                   # 4 needed, 3 free: nothing taken
    assert pool.num_free == 3 and 2 not in kv.req_state
    kv.free(a)
    assert free_list(pool) == [5, 6, 7, 0, 1, 4, 3, 2] and 1 not in kv.req_state
    assert kv.allocate_slots(b, 5)
    assert kv.req_state[2] == [5, 6] and kv.blocks_of(b) == [7, 0]


def test_state_blocks_count_in_admission_and_servability() -> None:
    """The scheduler admits a request only with room for its state too, and a request whose tokens and
    state together exceed the pool is unservable with the state named."""
    from twin_testkit import make_scheduler
    sched = make_scheduler(num_blocks=6, block_size=4, state_blocks=3)
    big = make_request(1, prompt=9, output=4)             # 4 token blocks + 3 state > 6
    assert "and 3 for its per-request state" in (sched.unservable(big) or "")
    ok = make_request(2, prompt=5, output=3)              # 2 token blocks + 3 state <= 6
    assert sched.unservable(ok) is None


def test_state_blocks_limit_how_many_run() -> None:
    """8 blocks of 4 tokens, 3 state blocks a request: three 3-token prompts would take 3 token blocks, but
    with their state only two fit (2 x (1 + 3) = 8); the third is admitted when the first finishes."""
    from twin_testkit import make_scheduler, step
    sched = make_scheduler(num_blocks=8, block_size=4, state_blocks=3)
    for i in (1, 2, 3):
        sched.add_request(make_request(i, prompt=3, output=1), 0)
    scheduled, preempted, finished = step(sched, 0)
    assert [rid for rid, _ in scheduled] == [1, 2] and preempted == [] and sorted(finished) == [1, 2]
    assert sched.kv.pool.num_free == 8 and not sched.kv.req_state
    scheduled, _, _ = step(sched, 10)
    assert [rid for rid, _ in scheduled] == [3]


def _pool_with_copies(pool_cls: type[PyBlockPool]) -> PyBlockPool:
    """Blocks 0-3 held; 0 and 1 cached as keys 11 and 12, 2 a further copy of 11; 4-5 freed with 13 cached
    on 4; 6-7 never allocated."""
    pool = pool_cls(8, keep_duplicates=True)
    pool.allocate(6)
    pool.cache_run([11, 12], [0, 1])
    pool.cache(2, 11)
    pool.cache(4, 13)
    pool.release([5, 4])
    pool.check()
    return pool


@pytest.mark.parametrize("fault, message", [
    (lambda p: p.block_key.__setitem__(7, 16), "a never-allocated block is referenced or cached"),
    (lambda p: p.cached.__setitem__(12, 3), "cached key 12 points at block 3 holding None"),
    (lambda p: p.cached.__setitem__(14, 1), "cached key 14 points at block 1 holding 12"),
    (lambda p: p.block_key.__setitem__(3, 15),
     r"5 blocks hold a key, but 3 keys are cached with 1 further copies \(num_cached 4\)"),
    (lambda p: p.dups.__setitem__(12, [3]), r"the further copies \[2, 3\] are not the blocks flagged \[2\]"),
    (lambda p: p.dups.__setitem__(11, [2, 2]), r"the further copies \[2, 2\] are not the blocks flagged \[2\]"),
    (lambda p: p.dups.__setitem__(13, []), "key 13: further copies"),
    (lambda p: p.dups.pop(11), r"the further copies \[\] are not the blocks flagged \[2\]"),
])
def test_check_names_the_fault_in_either_pool(pool_cls: type[PyBlockPool], fault, message) -> None:
    """A corrupted pool fails its end-of-run check with check_pool's message, in the Python pool and in the
    compiled one (whose own C check decides, then check_pool names the fault)."""
    pool = _pool_with_copies(pool_cls)
    fault(pool)
    with pytest.raises(InvariantError, match=message):
        pool.check()


def test_check_finds_a_free_queue_fault_in_the_python_pool() -> None:
    """The reference counts against the free queue (the compiled pool keeps both in C arrays, out of reach):
    a freed block referenced again, and a held block whose count dropped to zero."""
    pool = _pool_with_copies(PyBlockPool)
    pool.ref_cnt[4] = 1
    with pytest.raises(InvariantError, match="block 4: ref_cnt=1 but in_free_queue=True"):
        pool.check()
    pool = _pool_with_copies(PyBlockPool)
    pool.ref_cnt[3] = 0
    with pytest.raises(InvariantError, match="block 3: ref_cnt=0 but in_free_queue=False"):
        pool.check()
