# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Compiled twin of :class:`twin.core.kv_cache.PyBlockPool`: the same pool, state for state (and, at the end,
the chained block keys of :class:`twin.core.tokens.TokenSequence`, the same numbers as its Python loop).

The Python class is the specification (its docstrings say what each operation does and why); this one
keeps reference counts, dead-entry counts, successor hints and the free queue in C arrays, so that the
per-block loops of a long run cost a few nanoseconds per block instead of a bytecode loop. Block keys
stay Python objects (any hashable int) and the key -> block map stays a Python dict, touched through its C
API. Every public method returns what the Python class returns, and leaves the pool in the state the
Python class would; tests/twin/test_twin_kv_cache.py runs both on the same operation sequences.
"""

from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memmove, memset

from twin.core.errors import InvariantError


cdef class BlockPool:
    cdef readonly Py_ssize_t num_blocks
    cdef int* _ref
    cdef int* _dead
    cdef int* _nxt
    cdef int* _queue
    cdef Py_ssize_t _qlen
    cdef Py_ssize_t _qcap
    cdef Py_ssize_t _head
    cdef Py_ssize_t _fresh
    cdef Py_ssize_t _num_queued
    cdef public list block_key
    cdef public dict cached
    cdef public dict dups
    cdef readonly bint keep_duplicates
    cdef char* _dup
    cdef Py_ssize_t _num_dups
    cdef public object on_evict
    cdef public long long evictions
    cdef public Py_ssize_t compact_slack

    def __cinit__(self, Py_ssize_t num_blocks, on_evict=None, bint keep_duplicates=False):
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        if num_blocks > 2_000_000_000:
            raise ValueError(f"a block pool holds at most 2e9 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref = <int*>malloc(num_blocks * sizeof(int))
        self._dead = <int*>malloc(num_blocks * sizeof(int))
        self._nxt = <int*>malloc(num_blocks * sizeof(int))
        self._qcap = 1024
        self._queue = <int*>malloc(self._qcap * sizeof(int))
        self._dup = <char*>malloc(num_blocks * sizeof(char))
        if not self._ref or not self._dead or not self._nxt or not self._queue or not self._dup:
            raise MemoryError()
        memset(self._dup, 0, num_blocks * sizeof(char))
        self.keep_duplicates = keep_duplicates
        self.dups = {}
        self._num_dups = 0
        memset(self._ref, 0, num_blocks * sizeof(int))
        memset(self._dead, 0, num_blocks * sizeof(int))
        memset(self._nxt, 0, num_blocks * sizeof(int))
        self._qlen = 0
        self._head = 0
        self._fresh = 0
        self._num_queued = 0
        self.block_key = [None] * num_blocks
        self.cached = {}
        self.on_evict = on_evict
        self.evictions = 0
        self.compact_slack = 1024

    def __dealloc__(self):
        free(self._ref)
        free(self._dead)
        free(self._nxt)
        free(self._queue)
        free(self._dup)

    # ------------------------------------------------------------------------------------ state
    cdef inline Py_ssize_t _num_free(self):
        return self.num_blocks - self._fresh + self._num_queued

    @property
    def num_free(self) -> int:
        return self._num_free()

    @property
    def num_used(self) -> int:
        return self._fresh - self._num_queued

    @property
    def num_cached(self) -> int:
        return len(self.cached) + self._num_dups

    def copies(self) -> list:
        """The blocks flagged as further copies of a cached key (for check_pool)."""
        return [b for b in range(self.num_blocks) if self._dup[b]]

    @property
    def ref_cnt(self) -> list:
        """A copy of the reference counts (the Python class exposes its list)."""
        return [self._ref[i] for i in range(self.num_blocks)]

    def unreferenced(self, blocks) -> int:
        """How many of ``blocks`` have no reference (free blocks a cache hit would take out of the queue)."""
        cdef Py_ssize_t n = 0
        for block in blocks:
            if self._ref[self._index(block)] == 0:
                n += 1
        return n

    def lookup(self, key):
        return self.cached.get(key)

    cdef inline Py_ssize_t _index(self, block) except -1:
        cdef Py_ssize_t b = block
        if b < 0 or b >= self.num_blocks:
            raise IndexError(f"block {block} outside the pool's 0..{self.num_blocks - 1}")
        return b

    cdef list _live_queue(self):
        cdef int* dead = <int*>malloc(self.num_blocks * sizeof(int))
        if not dead:
            raise MemoryError()
        memcpy(dead, self._dead, self.num_blocks * sizeof(int))
        cdef list live = []
        cdef Py_ssize_t i
        cdef int block
        for i in range(self._head, self._qlen):
            block = self._queue[i]
            if dead[block]:
                dead[block] -= 1
            else:
                live.append(block)
        free(dead)
        return live

    def free_order(self) -> list:
        return list(range(self._fresh, self.num_blocks)) + self._live_queue()

    # ------------------------------------------------------------------------------- free queue
    cdef int _push(self, int block) except -1:
        cdef int* grown
        if self._qlen == self._qcap:
            grown = <int*>realloc(self._queue, 2 * self._qcap * sizeof(int))
            if not grown:
                raise MemoryError()
            self._queue = grown
            self._qcap *= 2
        self._queue[self._qlen] = block
        self._qlen += 1
        return 0

    cdef void _advance(self, Py_ssize_t head):
        if head > 4096 and 2 * head > self._qlen:
            memmove(self._queue, self._queue + head, (self._qlen - head) * sizeof(int))
            self._qlen -= head
            head = 0
        self._head = head

    cdef int _compact(self) except -1:
        cdef list live = self._live_queue()
        cdef Py_ssize_t i
        for i in range(len(live)):
            self._queue[i] = live[i]
        self._qlen = len(live)
        self._head = 0
        memset(self._dead, 0, self.num_blocks * sizeof(int))
        return 0

    cdef int _evict(self, int block) except -1:
        """Drop the cached key a reused block holds, if any; 1 when there was one. A key with further
        copies stays cached (nothing is demoted); the oldest copy takes over where a lookup found ``block``."""
        key = self.block_key[block]
        if key is None:
            return 0
        self.block_key[block] = None
        cdef list copies
        if self._num_dups and key in self.dups:
            copies = self.dups[key]
            if self._dup[block]:
                self._dup[block] = 0
                copies.remove(block)
            else:
                first = copies.pop(0)
                self.cached[key] = first
                self._dup[<Py_ssize_t>first] = 0
            self._num_dups -= 1
            if not copies:
                del self.dups[key]
            return 1
        del self.cached[key]
        if self.on_evict is not None:
            self.on_evict(block, key)
        return 1

    cdef int _add_copy(self, Py_ssize_t b, block, key) except -1:
        self.block_key[b] = key
        copies = self.dups.get(key)
        if copies is None:
            self.dups[key] = [block]
        else:
            copies.append(block)
        self._dup[b] = 1
        self._num_dups += 1
        return 0

    def allocate(self, Py_ssize_t n) -> list:
        cdef Py_ssize_t num_free = self._num_free()
        if n > num_free:
            raise InvariantError(f"allocate({n}) with only {num_free} free blocks")
        cdef list out = []
        cdef Py_ssize_t fresh = min(n, self.num_blocks - self._fresh)
        cdef Py_ssize_t i, first, end, head, need, taken
        cdef int block
        if fresh > 0:
            first = self._fresh
            self._fresh += fresh
            for i in range(first, first + fresh):
                self._ref[i] = 1
                out.append(i)
        need = n - fresh
        if need <= 0:
            return out
        self._num_queued -= need
        head = self._head
        taken = fresh
        while need > 0:
            end = min(head + need, self._qlen)
            for i in range(head, end):
                block = self._queue[i]
                if self._dead[block]:
                    self._dead[block] -= 1
                    continue
                self.evictions += self._evict(block)
                self._ref[block] = 1
                out.append(block)
                taken += 1
            head = end
            need = n - taken
        self._advance(head)
        return out

    def allocate_one(self) -> int:
        cdef int block
        cdef Py_ssize_t head
        if self._fresh < self.num_blocks:
            block = <int>self._fresh
            self._fresh += 1
            self._ref[block] = 1
            return block
        if not self._num_queued:
            raise InvariantError("allocate(1) with no free block")
        self._num_queued -= 1
        head = self._head
        block = self._queue[head]
        while self._dead[block]:
            self._dead[block] -= 1
            head += 1
            block = self._queue[head]
        self._advance(head + 1)
        self.evictions += self._evict(block)
        self._ref[block] = 1
        return block

    def touch(self, blocks) -> None:
        cdef Py_ssize_t left = 0
        cdef Py_ssize_t b
        for block in blocks:
            b = self._index(block)
            if self._ref[b] == 0:
                self._dead[b] += 1
                left += 1
            self._ref[b] += 1
        if left:
            self._num_queued -= left
            if self._qlen - self._head > 2 * self._num_queued + self.compact_slack:
                self._compact()

    def release(self, blocks) -> None:
        cdef Py_ssize_t b
        cdef int left
        cdef Py_ssize_t freed = 0
        for block in blocks:
            b = self._index(block)
            left = self._ref[b] - 1
            self._ref[b] = left
            if left == 0:
                self._push(<int>b)
                freed += 1
            elif left < 0:
                self._num_queued += freed
                raise InvariantError(f"block {block} released more often than referenced")
        self._num_queued += freed

    # ----------------------------------------------------------------------------- prefix cache
    def cache(self, block, key) -> None:
        cdef Py_ssize_t b = self._index(block)
        if self.block_key[b] is None:
            if self.cached.setdefault(key, block) is block:
                self.block_key[b] = key
            elif self.keep_duplicates:
                self._add_copy(b, block, key)

    def cache_run(self, keys, blocks) -> None:
        cdef Py_ssize_t b
        cdef list block_key = self.block_key
        cdef dict cached = self.cached
        for key, block in zip(keys, blocks):
            b = self._index(block)
            if block_key[b] is None:
                if cached.setdefault(key, block) is block:
                    block_key[b] = key
                elif self.keep_duplicates:
                    self._add_copy(b, block, key)

    def match_prefix(self, keys, Py_ssize_t limit) -> list:
        if limit <= 0:
            return []
        cdef dict cached = self.cached
        first = cached.get(keys[0])
        if first is None:
            return []
        cdef list block_key = self.block_key
        cdef list found = [first]
        cdef Py_ssize_t block = first
        cdef Py_ssize_t nxt, i
        cdef Py_ssize_t n = min(limit, len(keys))
        for i in range(1, n):
            key = keys[i]
            nxt = self._nxt[block]
            held = block_key[nxt]
            if (held is not key and held != key) or self._dup[nxt]:
                looked = cached.get(key)
                if looked is None:
                    break
                nxt = looked
                self._nxt[block] = <int>nxt
            found.append(nxt)
            block = nxt
        return found

    # ---------------------------------------------------------------------------------- checks
    def check(self) -> None:
        """Every block is either referenced or free, never both; cached keys point at blocks holding them.

        :func:`twin.core.kv_cache.check_pool` states the check (and names what is wrong); it builds Python sets
        and lists as long as the pool, seconds at the end of a run on a page-size-1 pool of millions of
        blocks. The same conditions are checked here in C loops first, and check_pool runs only when one
        fails, to raise its message."""
        if self._holds():
            return
        from twin.core.kv_cache import check_pool  # the one check, shared with the Python pool

        check_pool(self, self._fresh, self._num_queued, self._live_queue())
        raise InvariantError("BlockPool.check: the compiled check found a fault that check_pool does not")

    cdef bint _holds(self) except -1:
        """check_pool's conditions, each in the same terms; False at the first that fails."""
        cdef Py_ssize_t n = self.num_blocks
        cdef Py_ssize_t fresh = self._fresh
        cdef Py_ssize_t b, i, queued = 0, flagged = 0, listed = 0, holding = 0
        cdef list block_key = self.block_key
        cdef int block
        if len(block_key) != n:
            return False
        for b in range(fresh, n):  # never allocated: no reference, no key
            if self._ref[b] != 0 or block_key[b] is not None:
                return False
        cdef char* mark = <char*>malloc(n * sizeof(char))
        cdef int* dead = <int*>malloc(n * sizeof(int))
        if not mark or not dead:
            free(mark)
            free(dead)
            raise MemoryError()
        memset(mark, 0, n * sizeof(char))
        memcpy(dead, self._dead, n * sizeof(int))
        try:
            for i in range(self._head, self._qlen):  # the live free-queue entries (_live_queue): distinct
                block = self._queue[i]
                if dead[block]:
                    dead[block] -= 1
                    continue
                if mark[block] or block >= fresh:
                    return False
                mark[block] = 1
                queued += 1
            if queued != self._num_queued:
                return False
            for b in range(fresh):  # unreferenced exactly when queued
                if (self._ref[b] == 0) != (mark[b] != 0):
                    return False
            for key, blk in self.cached.items():
                b = blk
                if b < 0 or b >= n:
                    return False
                held = block_key[b]
                if held is not key and held != key:
                    return False
            memset(mark, 0, n * sizeof(char))  # now: listed as a further copy
            for key, blocks in self.dups.items():
                if key not in self.cached or not blocks:
                    return False
                for blk in blocks:
                    b = blk
                    if b < 0 or b >= n or mark[b] or not self._dup[b]:
                        return False
                    held = block_key[b]
                    if held is not key and held != key:
                        return False
                    mark[b] = 1
                    listed += 1
            for b in range(n):
                if self._dup[b]:
                    flagged += 1
                if block_key[b] is not None:
                    holding += 1
            if listed != flagged or (listed and not self.keep_duplicates):
                return False
            return holding == len(self.cached) + listed and len(self.cached) + self._num_dups == holding
        finally:
            free(mark)
            free(dead)


# ------------------------------------------------------------------------------------ block keys
# The chained block keys of twin.core.tokens.TokenSequence, hash((prev, source, piece)) one block after another,
# computed with CPython's own hash functions written out (Objects/tupleobject.c tuplehash, the xxHash-based
# one of CPython 3.8 and later, and Objects/longobject.c long_hash for ints), so the keys are the same
# numbers the Python loop gives, bit for bit (tests/twin/test_twin_tokens.py checks them against it).

from libc.stdint cimport int64_t, uint64_t

cdef uint64_t _XXPRIME_1 = 11400714785074694791ULL
cdef uint64_t _XXPRIME_2 = 14029467366897019727ULL
cdef uint64_t _XXPRIME_5 = 2870177450012600261ULL
cdef uint64_t _MODULUS = (1ULL << 61) - 1       # _PyHASH_MODULUS


cdef inline int64_t _int_hash(int64_t v):
    """hash(v) for an int that fits in 64 bits: v mod (2**61 - 1), signed as v, -1 becoming -2."""
    cdef int64_t h
    if v >= 0:
        h = <int64_t>(<uint64_t>v % _MODULUS)
    else:
        h = -<int64_t>((<uint64_t>(-(v + 1)) + 1) % _MODULUS)
    return -2 if h == -1 else h


cdef inline uint64_t _lane(uint64_t acc, int64_t item_hash):
    acc += <uint64_t>item_hash * _XXPRIME_2
    acc = (acc << 31) | (acc >> 33)
    return acc * _XXPRIME_1


def chain_keys(list out, prev, source, Py_ssize_t first, Py_ssize_t last, Py_ssize_t step):
    """Append hash((prev, source, piece)) for piece in range(first, last, step) to ``out``, each key the
    ``prev`` of the next; returns the last key (``prev`` when the range is empty). ``prev`` and ``source``
    are ints of 64 bits at most (a key is a hash, a source an interned id)."""
    cdef int64_t p = prev
    cdef int64_t hs = _int_hash(<int64_t>source)
    cdef Py_ssize_t piece
    cdef uint64_t acc
    for piece in range(first, last, step):
        acc = _lane(_lane(_lane(_XXPRIME_5, _int_hash(p)), hs), _int_hash(piece))
        acc += 3 ^ (_XXPRIME_5 ^ 3527539ULL)
        p = 1546275796 if acc == <uint64_t>-1 else <int64_t>acc
        out.append(p)
    return p
