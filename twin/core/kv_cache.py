"""Paged KV memory of one worker: a block pool with a prefix cache, and per-request block tables.

Semantics follow vLLM v1's ``BlockPool`` / ``KVCacheManager``:

* blocks carry reference counts; a block with no reference sits in the free queue, in LRU order (O(1)
  pop from the head, append at the tail, removal from the middle on a cache hit);
* a full block whose tokens are computed gets its key registered in the cache; it keeps the key while in
  the free queue and loses it only when it is reused for new content (lazy eviction);
* a request frees its blocks in reverse order, so the tail of its chain sits nearer the head of the free
  queue and is evicted before the shared head of the chain;
* allocation is all or nothing: :meth:`KVCacheManager.allocate_slots` returns ``False`` and changes nothing
  when the blocks are not there; the scheduler then preempts and retries.
"""

from __future__ import annotations

import itertools
import operator
from collections import OrderedDict
from typing import AbstractSet, Callable, Iterable, Protocol, Sequence

from twin.core.errors import InvariantError
from twin.core.compiled import compiled
from twin.core.request import Request

NO_PLACEHOLDERS: AbstractSet[int] = frozenset()
"""No request waits for its last token (KVCacheManager.placeholders)."""


class PyBlockPool:
    """Blocks ``0 .. num_blocks-1`` with reference counts, an LRU free queue and a key -> block map.

    The specification of the pool. Where the compiled module ``twin.core._blockpool`` is built (setup.py), the
    run uses its :class:`BlockPool` instead: the same operations on the same state, with the per-block
    loops in C (tests run both on the same sequences of operations).

    The free queue is a list of block ids read from ``_head`` on, with lazy removal: taking a free block
    out of the middle (a cache hit) only counts its entry as dead (``_dead``); ``allocate`` drops dead
    entries as it meets them at the head. A block's live entry, if any, is its newest one, so its dead
    entries all lie ahead of it: the first entry met with a zero dead count is live. The order of live entries is the LRU order
    an ordered dictionary would keep (vLLM's doubly linked free list), at a fraction of the cost per block.
    """

    compact_slack = 1024
    """Dead entries tolerated in the free queue beyond the live ones before it is compacted."""

    def __init__(self, num_blocks: int, on_evict: Callable[[int, int], None] | None = None,
                 keep_duplicates: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_key: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        """Key -> the block a lookup finds."""
        self.keep_duplicates = keep_duplicates
        """Whether a block computed with the content of a key already cached is registered too (vLLM's
        BlockHashToBlockMap keeps every copy, v1/core/block_pool.py: a block's id never changes once handed
        out, so two requests that computed the same block keep theirs, and a lookup finds the oldest copy
        left), or left uncached (a tree of blocks: SGLang's radix cache, TensorRT-LLM's storeBlocks, which
        keep the block first stored)."""
        self.dups: dict[int, list[int]] = {}
        """Key -> its further copies, oldest first (only with ``keep_duplicates``); when the copy a lookup
        finds is evicted, the oldest of these takes its place."""
        self._dup = bytearray(num_blocks)
        """Per block: 1 when it is one of ``dups`` (it holds its key, but a lookup finds another block)."""
        self._num_dups = 0
        self._fresh = 0
        """Blocks from here on were never allocated: they head the free queue, in id order (kept implicit,
        so a pool of a million blocks costs nothing until it is used)."""
        self._queue: list[int] = []
        """Entries of blocks freed after use, oldest first from ``_head`` on (behind the never-used ones);
        some are dead. Entries before ``_head`` were taken; they are cut off once they are the larger part
        (a list read by slices costs less per block than a deque popped one entry at a time)."""
        self._head = 0
        self._dead = [0] * num_blocks
        """Per block: how many of its entries in ``_queue`` are dead (it left the queue after they were
        pushed)."""
        self._num_queued = 0
        """Live entries in ``_queue``: free blocks that were used before."""
        self.on_evict = on_evict
        """Called with (block id, key) when a cached block is reused for new content (host-tier hook)."""
        self.evictions = 0
        self._next = [0] * num_blocks
        """Per block: the block that followed it in the last prefix matched through it (a hint only:
        :meth:`match_prefix` checks that it holds the key asked for)."""

    @property
    def num_free(self) -> int:
        """Blocks with no reference: truly empty or cached-but-evictable."""
        return self.num_blocks - self._fresh + self._num_queued

    @property
    def num_used(self) -> int:
        return self._fresh - self._num_queued

    def _live_queue(self) -> list[int]:
        """The live entries of the free queue, head first."""
        dead = self._dead.copy()
        live = []
        for block in itertools.islice(self._queue, self._head, None):
            if dead[block]:
                dead[block] -= 1
            else:
                live.append(block)
        return live

    def free_order(self) -> list[int]:
        """The whole free queue, head first (for tests and debugging)."""
        return list(range(self._fresh, self.num_blocks)) + self._live_queue()

    @property
    def num_cached(self) -> int:
        """Blocks holding a key (every copy)."""
        return len(self.cached) + self._num_dups

    def unreferenced(self, blocks: Iterable[int]) -> int:
        """How many of ``blocks`` have no reference (free blocks a cache hit would take out of the queue)."""
        ref = self.ref_cnt
        return [ref[b] for b in blocks].count(0)

    def lookup(self, key: int) -> int | None:
        return self.cached.get(key)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, evicting their cached keys."""
        if n > self.num_free:
            raise InvariantError(f"allocate({n}) with only {self.num_free} free blocks")
        out: list[int] = []
        fresh = min(n, self.num_blocks - self._fresh)
        if fresh:
            first = self._fresh
            self._fresh += fresh
            self.ref_cnt[first:first + fresh] = [1] * fresh
            out.extend(range(first, first + fresh))
        need = n - fresh
        if not need:
            return out
        self._num_queued -= need
        queue = self._queue
        head = self._head
        dead = self._dead
        ref = self.ref_cnt
        block_key = self.block_key
        cached = self.cached
        on_evict = self.on_evict
        append = out.append
        evicted = 0
        while need:
            # The next `need` entries at once; dead ones among them leave as many to take in another round.
            chunk = queue[head:head + need]
            head += need
            for block in chunk:
                if dead[block]:
                    dead[block] -= 1
                    continue
                key = block_key[block]
                if key is not None:
                    block_key[block] = None
                    evicted += 1
                    if self._num_dups and key in self.dups:
                        self._drop_copy(block, key)
                    else:
                        del cached[key]
                        if on_evict is not None:
                            on_evict(block, key)
                ref[block] = 1
                append(block)
            need = n - len(out)
        self._advance(head)
        self.evictions += evicted
        return out

    def allocate_one(self) -> int:
        """``allocate(1)[0]`` without building a list: most allocations are a decode's next block."""
        if self._fresh < self.num_blocks:
            block = self._fresh
            self._fresh += 1
            self.ref_cnt[block] = 1
            return block
        if not self._num_queued:
            raise InvariantError("allocate(1) with no free block")
        self._num_queued -= 1
        queue = self._queue
        head = self._head
        dead = self._dead
        block = queue[head]
        while dead[block]:
            dead[block] -= 1
            head += 1
            block = queue[head]
        self._advance(head + 1)
        key = self.block_key[block]
        if key is not None:  # evicted as in allocate
            self.block_key[block] = None
            self.evictions += 1
            if self._num_dups and key in self.dups:
                self._drop_copy(block, key)
            else:
                del self.cached[key]
                if self.on_evict is not None:
                    self.on_evict(block, key)
        self.ref_cnt[block] = 1
        return block

    def _drop_copy(self, block: int, key: int) -> None:
        """``block`` is evicted from a key with copies: the key stays cached (its content is still on the
        GPU, so nothing is demoted); if a lookup found ``block``, the oldest other copy takes its place."""
        copies = self.dups[key]
        if self._dup[block]:
            self._dup[block] = 0
            copies.remove(block)
        else:
            first = self.cached[key] = copies.pop(0)
            self._dup[first] = 0
        self._num_dups -= 1
        if not copies:
            del self.dups[key]

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cache-hit blocks, pulling free ones out of the free queue."""
        ref = self.ref_cnt
        dead = self._dead
        left = 0
        for block in blocks:
            if ref[block] == 0:
                dead[block] += 1
                left += 1
            ref[block] += 1
        if left:
            self._num_queued -= left
            if len(self._queue) - self._head > 2 * self._num_queued + self.compact_slack:
                self._compact()

    def _advance(self, head: int) -> None:
        """The free queue's entries before ``head`` are taken; cut them off once they are the larger part."""
        if head > 4096 and 2 * head > len(self._queue):
            del self._queue[:head]
            head = 0
        self._head = head

    def _compact(self) -> None:
        """Drop the dead entries of the free queue (bounds its length when hits outnumber allocations)."""
        self._queue = self._live_queue()
        self._head = 0
        self._dead = [0] * self.num_blocks

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one reference per block; blocks reaching zero join the tail of the free queue in order."""
        ref = self.ref_cnt
        freed = []
        for block in blocks:
            left = ref[block] - 1
            ref[block] = left
            if left == 0:
                freed.append(block)
            elif left < 0:
                raise InvariantError(f"block {block} released more often than referenced")
        self._queue.extend(freed)
        self._num_queued += len(freed)

    def cache(self, block: int, key: int) -> None:
        """Register a computed full block under its key. Where another block holds the key already, that
        one stays the block a lookup finds, and ``block`` is kept as a further copy (``keep_duplicates``)
        or left uncached.

        One dictionary access for "not cached yet, so cache it": setdefault stores ``block`` and returns it
        when ``key`` was absent, or else the block that holds ``key``, which is not ``block`` (``block``
        holds no key). Compared by value: the compiled core keeps ints unboxed, so identity says nothing."""
        if self.block_key[block] is None:
            if self.cached.setdefault(key, block) == block:
                self.block_key[block] = key
            elif self.keep_duplicates:
                self._add_copy(block, key)

    def cache_run(self, keys: Iterable[int], blocks: Iterable[int]) -> None:
        """:meth:`cache` for each (key, block) pair in turn, inlined: a request registers its full blocks in
        runs, once per prompt block."""
        block_key = self.block_key
        setdefault = self.cached.setdefault
        keep = self.keep_duplicates
        for key, block in zip(keys, blocks):
            if block_key[block] is None:
                if setdefault(key, block) == block:
                    block_key[block] = key
                elif keep:
                    self._add_copy(block, key)

    def _add_copy(self, block: int, key: int) -> None:
        self.block_key[block] = key
        copies = self.dups.get(key)
        if copies is None:
            self.dups[key] = [block]
        else:
            copies.append(block)
        self._dup[block] = 1
        self._num_dups += 1

    def match_prefix(self, keys: Sequence[int], limit: int) -> list[int]:
        """Blocks holding ``keys[0]``, ``keys[1]`` ... for as long as every key is cached (at most ``limit``).

        The same blocks as looking every key up in ``cached``, at a fraction of the cost: lookups in a
        large dictionary miss the CPU caches, so each block remembers the block that followed it in the
        last match through it (``_next``), and the dictionary is consulted only where that successor does
        not hold the next key or is not the copy a lookup finds. Since ``cached[key] == block`` exactly
        when ``block_key[block] == key`` and ``block`` is no further copy, such a successor is the block the
        dictionary would return.
        """
        if limit <= 0:
            return []
        get = self.cached.get
        block = get(keys[0])
        if block is None:
            return []
        block_key = self.block_key
        hint = self._next
        dup = self._dup
        found = [block]
        for key in itertools.islice(keys, 1, limit):
            nxt = hint[block]
            held = block_key[nxt]
            if (held is not key and held != key) or dup[nxt]:
                looked = get(key)
                if looked is None:
                    break
                nxt = hint[block] = looked
            found.append(nxt)
            block = nxt
        return found

    def check(self) -> None:
        """Every block is either referenced or free, never both; cached keys point at blocks holding them."""
        check_pool(self, self._fresh, self._num_queued, self._live_queue())

    def copies(self) -> list[int]:
        """The blocks flagged as further copies of a cached key (for :func:`check_pool`)."""
        return list(itertools.compress(range(self.num_blocks), self._dup))


def check_pool(pool: Pool, fresh: int, num_queued: int, live: list[int]) -> None:
    """The end-of-run consistency check of a pool, Python or compiled: ``fresh`` is where its never-used
    blocks start, ``num_queued`` its count of live free-queue entries and ``live`` those entries.

    The sets and lists are built by C loops (map, compress): the check at the end of a long run walks
    every block of every worker."""
    ref_cnt, block_key, cached = pool.ref_cnt, pool.block_key, pool.cached
    never = pool.num_blocks - fresh
    if ref_cnt[fresh:].count(0) != never or block_key[fresh:].count(None) != never:
        raise InvariantError("a never-allocated block is referenced or cached")
    queued = set(live)
    if len(queued) != len(live) or len(live) != num_queued:
        raise InvariantError(f"free queue holds {len(live)} live entries ({len(queued)} distinct), "
                             f"counted {num_queued}")
    unreferenced = set(itertools.compress(range(fresh), map(operator.not_, ref_cnt[:fresh])))
    if unreferenced != queued:  # name the first block in the wrong place
        block = min(unreferenced ^ queued)
        raise InvariantError(f"block {block}: ref_cnt={ref_cnt[block]} but in_free_queue={block in queued}")
    if list(map(block_key.__getitem__, cached.values())) != list(cached):
        for key, block in cached.items():
            if block_key[block] != key:
                raise InvariantError(f"cached key {key} points at block {block} holding {block_key[block]}")
    dups = pool.dups
    copies = [b for blocks in dups.values() for b in blocks]
    if sorted(copies) != pool.copies() or (copies and not pool.keep_duplicates):
        raise InvariantError(f"the further copies {sorted(copies)} are not the blocks flagged {pool.copies()}")
    for key, blocks in dups.items():
        if key not in cached or not blocks or any(block_key[b] != key for b in blocks):
            raise InvariantError(f"key {key}: further copies {blocks} without it cached or holding another key")
    holding = len(block_key) - block_key.count(None)
    if holding != len(cached) + len(copies) or pool.num_cached != holding:
        raise InvariantError(f"{holding} blocks hold a key, but {len(cached)} keys are cached with "
                             f"{len(copies)} further copies (num_cached {pool.num_cached})")


class Pool(Protocol):
    """What the rest of the twin uses of a block pool, :class:`PyBlockPool` or the compiled ``BlockPool``.
    (Typed by this protocol rather than by PyBlockPool, which the compiled pool does not subclass: the
    mypyc-compiled core checks an attribute's class at run time.)"""

    num_blocks: int
    keep_duplicates: bool
    evictions: int
    ref_cnt: list[int]
    block_key: list[int | None]
    cached: dict[int, int]
    dups: dict[int, list[int]]

    @property
    def num_free(self) -> int: ...
    @property
    def num_used(self) -> int: ...
    @property
    def num_cached(self) -> int: ...
    def lookup(self, key: int) -> int | None: ...
    def allocate(self, n: int) -> list[int]: ...
    def allocate_one(self) -> int: ...
    def touch(self, blocks: Iterable[int]) -> None: ...
    def release(self, blocks: Iterable[int]) -> None: ...
    def cache(self, block: int, key: int) -> None: ...
    def cache_run(self, keys: Iterable[int], blocks: Iterable[int]) -> None: ...
    def match_prefix(self, keys: Sequence[int], limit: int) -> list[int]: ...
    def unreferenced(self, blocks: Iterable[int]) -> int: ...
    def free_order(self) -> list[int]: ...
    def copies(self) -> list[int]: ...
    def check(self) -> None: ...


BlockPool: Callable[..., Pool] = compiled("BlockPool") or PyBlockPool
"""The block pool class :class:`KVCacheManager` uses: the compiled one where ``twin.core._blockpool`` is built
(:func:`twin.core.compiled.compiled`), else :class:`PyBlockPool` (same results)."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class HostTier:
    """Host-memory KV tier: cached GPU blocks evicted by reuse are demoted here; a prefix hit promotes them.

    An LRU set of block keys with a capacity in blocks. Inclusive, like LMCache's CPU backend: a promoted
    block stays in host memory. Demotion is a write-back that overlaps compute (not timed); promotion is a
    synchronous load before the step that needs it, timed by the host link (``load_s_per_block``).
    """

    def __init__(self, capacity_blocks: int, load_s_per_block: float) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"a host tier needs at least one block, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.load_s_per_block = load_s_per_block
        self.keys: OrderedDict[int, None] = OrderedDict()
        self.demotions = 0
        self.evictions = 0
        self.promotions = 0

    def demote(self, block: int, key: int) -> None:
        keys = self.keys
        if key in keys:
            keys.move_to_end(key)
            return
        keys[key] = None
        self.demotions += 1
        if len(keys) > self.capacity_blocks:
            keys.popitem(last=False)
            self.evictions += 1

    def match(self, keys: Sequence[int], start: int, limit: int) -> int:
        """How many of ``keys[start:limit]`` are held here, consecutively from ``start``."""
        held = self.keys
        n = 0
        for key in keys[start:limit]:
            if key not in held:
                break
            n += 1
        return n

    def promote(self, keys: Sequence[int]) -> None:
        """Refresh promoted keys (one the same allocation pushed out is already back on the GPU)."""
        held = self.keys
        for key in keys:
            if key in held:
                held.move_to_end(key)
        self.promotions += len(keys)


class KVCacheManager:
    """Block tables of the requests on one worker, allocated from a :class:`BlockPool`."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 host: HostTier | None = None, keep_duplicates: bool = False, state_blocks: int = 0) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if state_blocks < 0:
            raise ValueError(f"state_blocks must be >= 0, got {state_blocks}")
        self.block_size = block_size
        self.state_blocks = state_blocks
        """Blocks each request holds from its first allocation to its release whatever its length: the
        model's constant per-request state (Mamba / GDN / KDA recurrent and conv state, sliding-window KV,
        DeepSeek-V4's windows and compressor rows: hardware Deployment.state_blocks_per_request), taken from
        the same pool as vLLM's hybrid allocator takes it. Never hashed or cached."""
        self.req_state: dict[int, list[int]] = {}
        self.enable_prefix_caching = enable_prefix_caching
        self.decode_cached_at_finish = False
        """SGLang's radix tree: a running request's blocks past what its admission prefilled
        (``Request.prefill_tokens``) enter the prefix cache only when it finishes (cache_finished_req), not as
        they fill (vLLM registers every full block at once). Set by the scheduler from its preemption rule
        (twin.core.scheduler.SchedulerLimits.preemption), only with prefix caching on."""
        self.host = host if enable_prefix_caching else None
        self.pool: Pool = BlockPool(num_blocks, on_evict=self.host.demote if self.host is not None else None,
                              keep_duplicates=keep_duplicates)
        self.req_blocks: dict[int, list[int]] = {}
        self._num_hashed: dict[int, int] = {}
        self.placeholders: AbstractSet[int] = NO_PLACEHOLDERS
        """Requests whose last token is not known yet (vLLM's async scheduling: it was sampled by the step
        still running when this one is formed): a block it would fill is not registered
        (twin.core.scheduler.SchedulerLimits.async_output)."""

    def host_hits(self, req: Request, num_gpu_hits: int) -> int:
        """Blocks after the GPU hits that the host tier holds (same one-token-short cap)."""
        if self.host is None:
            return 0
        limit = min((req.num_tokens - 1) // self.block_size, len(req.block_keys))
        return self.host.match(req.block_keys, num_gpu_hits, limit)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def usage(self) -> float:
        """Fraction of blocks referenced by requests (cached-but-free blocks count as free, as in vLLM)."""
        return self.pool.num_used / self.pool.num_blocks

    def blocks_of(self, req: Request) -> Sequence[int]:
        return self.req_blocks.get(req.id, ())

    def life_blocks(self, tokens: int) -> int:
        """Blocks a request of ``tokens`` tokens holds at its largest: its tokens' and its state's."""
        return cdiv(tokens, self.block_size) + self.state_blocks

    @property
    def state_tokens(self) -> int:
        """A request's state in tokens of the pool (SGLang's admission counts tokens)."""
        return self.state_blocks * self.block_size

    def get_computed_blocks(self, req: Request) -> list[int]:
        """Cached blocks matching the longest prefix of ``req`` (at most ``num_tokens - 1`` tokens)."""
        if not self.enable_prefix_caching:
            return []
        limit = min((req.num_tokens - 1) // self.block_size, len(req.block_keys))
        return self.pool.match_prefix(req.block_keys, limit)

    def blocks_needed(self, req: Request, num_new_tokens: int, num_computed_blocks: int = 0) -> int:
        """New blocks that scheduling ``num_new_tokens`` more tokens of ``req`` would take."""
        table = self.req_blocks.get(req.id)
        have = (len(table) if table is not None else 0) + num_computed_blocks
        computed = req.num_computed_tokens + num_computed_blocks * self.block_size
        need = max(0, cdiv(computed + num_new_tokens, self.block_size) - have)
        return need if table is not None else need + self.state_blocks

    def allocate_slots(self, req: Request, num_new_tokens: int, computed_blocks: Sequence[int] = (),
                       cache: bool = True) -> bool:
        """Give ``req`` room for ``num_new_tokens`` more tokens (after ``computed_blocks``), or nothing.

        With ``cache=False`` the new blocks are not registered in the prefix cache yet (a KV pull reserves
        blocks whose content has not arrived; :meth:`cache_computed` registers them on arrival).
        """
        pool = self.pool
        need = self.blocks_needed(req, num_new_tokens, len(computed_blocks))
        # Hit blocks with no reference sit in the free queue; taking them shrinks what is allocatable (they
        # are counted only when that could matter: room for the new blocks beside all hits is room enough).
        free = pool.num_free
        if need > free - len(computed_blocks) and need > free - pool.unreferenced(computed_blocks):
            return False
        blocks = self.req_blocks.get(req.id)
        if blocks is None:
            blocks = self.req_blocks[req.id] = []
            self._num_hashed[req.id] = 0
            if self.state_blocks:
                self.req_state[req.id] = pool.allocate(self.state_blocks)
                need -= self.state_blocks
        if computed_blocks:
            pool.touch(computed_blocks)
            blocks.extend(computed_blocks)
            self._num_hashed[req.id] = len(blocks)
        if need:
            blocks.extend(pool.allocate(need))
        if self.enable_prefix_caching and cache:
            computed = req.num_computed_tokens + len(computed_blocks) * self.block_size
            self.cache_computed(req, min(computed + num_new_tokens, req.num_tokens))
        return True

    def append_one(self, req: Request) -> bool:
        """The decode path of :meth:`allocate_slots` for one token: room in the last block, else one new
        block (False, changing nothing, when none is free or the request is not a plain decode)."""
        blocks = self.req_blocks.get(req.id)
        computed = req.num_computed_tokens
        if blocks is None:
            return False
        capacity = len(blocks) * self.block_size
        if computed >= capacity:
            # allocate_slots(req, 1) with a full last block: exactly one new block, then registration.
            if computed > capacity or self.pool.num_free < 1:
                return False
            blocks.append(self.pool.allocate_one())
            if self.enable_prefix_caching and self.registers_now(req, computed):
                self.cache_computed(req, min(computed + 1, req.num_tokens))
            return True
        if self.enable_prefix_caching and (computed + 1) % self.block_size == 0 and self.registers_now(req, computed):
            self.cache_computed(req, computed + 1)
        return True

    def registers_now(self, req: Request, position: int) -> bool:
        """Whether the block that token ``position`` fills enters the prefix cache when it is computed
        (always, unless :attr:`decode_cached_at_finish` holds it back past what the admission prefilled)."""
        return not self.decode_cached_at_finish or position < req.prefill_tokens or req.prefill_tokens < 0

    def cache_computed(self, req: Request, num_tokens: int, finished: bool = False) -> None:
        """Register the full blocks among the first ``num_tokens`` tokens of ``req`` in the prefix cache (with
        :attr:`decode_cached_at_finish`, only those its admission prefilled until it has ``finished``); a manager
        without prefix caching registers nothing."""
        if not self.enable_prefix_caching:
            return
        if self.decode_cached_at_finish and not finished and 0 <= req.prefill_tokens < num_tokens:
            num_tokens = req.prefill_tokens
        if self.placeholders and req.id in self.placeholders and num_tokens >= req.num_tokens:
            num_tokens = req.num_tokens - 1
        full = min(num_tokens // self.block_size, len(req.block_keys))
        rid = req.id
        done = self._num_hashed[rid]
        if full > done:
            if full == done + 1:  # a decode filled its last block
                self.pool.cache(self.req_blocks[rid][done], req.block_keys[done])
            else:
                self.pool.cache_run(req.block_keys[done:full], self.req_blocks[rid][done:full])
            self._num_hashed[rid] = full

    def holds_any(self, keys: Iterable[int]) -> bool:
        """Whether any of ``keys`` is in the prefix cache now."""
        return not self.pool.cached.keys().isdisjoint(keys)

    def uncached_keys(self, req: Request, num_tokens: int) -> Sequence[int]:
        """The keys :meth:`cache_computed` would register for ``req`` at ``num_tokens`` (in order)."""
        full = min(num_tokens // self.block_size, len(req.block_keys))
        return req.block_keys[self._num_hashed[req.id]:full]

    def free(self, req: Request) -> None:
        """Release all of ``req``'s blocks, tail first; cached ones stay findable until evicted (with
        :attr:`decode_cached_at_finish`, a request freed before it finishes, i.e. preempted, never cached its
        decoded blocks: SGLang frees a retracted request's decoded tokens without inserting them)."""
        blocks = self.req_blocks.pop(req.id, None)
        self._num_hashed.pop(req.id, None)
        state = self.req_state.pop(req.id, None)
        if state:   # first: the free queue hands out what it got first, and state caches nothing
            self.pool.release(state)
        if blocks:
            self.pool.release(reversed(blocks))
