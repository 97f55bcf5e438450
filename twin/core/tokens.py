"""Token identity without token ids: sequences of stream segments and their chained block keys.

A token sequence is a list of segments ``(source, offset, length)``: tokens ``offset .. offset+length`` of an
append-only stream ``source`` (a prefix group, a session's context, a Mooncake hash block). Block ``i``'s key
is a hash of block ``i-1``'s key and the pieces of streams that fill block ``i``; equal keys therefore mean
equal prefixes, which is what vLLM's block hashing (and SGLang's radix tree) rely on.

Sources are small ints handed out by a per-run :class:`SourceTable`, so keys are reproducible: Python hashes
tuples of ints the same way in every process (string hashing is salted, so strings never enter a key).
"""

from __future__ import annotations

from typing import Callable, Iterable

from twin.core.compiled import compiled

ROOT_KEY = 0x5E_57_7E_11
"""Parent key of block 0."""


_CHAIN_KEYS: Callable[[list[int], int, int, int, int, int], int] | None = compiled("chain_keys")
"""The whole-block loop of :meth:`TokenSequence._fill_keys` in C (the same keys bit for bit), or None."""


class SourceTable:
    """Per-run interning of stream names to ints, in order of first use. A name no one will use again (a
    session's own streams, once it has ended) is let go (:meth:`forget`); ids are never reused, so the
    tokens already written with it keep their identity."""

    def __init__(self) -> None:
        self._ids: dict[object, int] = {}
        self._last = 0

    def get(self, name: object) -> int:
        """The id of stream ``name``, allocating the next one on first use."""
        sid = self._ids.get(name)
        if sid is None:
            self._last = sid = self._last + 1
            self._ids[name] = sid
        return sid

    def forget(self, name: object) -> None:
        """Let go of ``name`` (a later :meth:`get` of it would allocate a new id)."""
        self._ids.pop(name, None)

    def __len__(self) -> int:
        return len(self._ids)


class KeyTable:
    """Per-run numbering of block keys, in order of first use: what requests carry as their block keys.

    Equal keys get equal numbers, so prefix identity is unchanged; what changes is where the keys land in
    the prefix-cache dictionaries of the workers. A key hash is a random 64-bit int, so each dictionary
    access misses the CPU caches; small ints handed out in order hash to themselves, so a request's blocks,
    numbered together, sit in neighbouring dictionary slots (a third less time in the block pool).
    """

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}

    def number(self, keys: Iterable[int]) -> list[int]:
        """The numbers of ``keys``, handing out the next ones to keys never seen (from 1)."""
        ids = self._ids
        setdefault = ids.setdefault
        return [setdefault(key, len(ids) + 1) for key in keys]

    def __len__(self) -> int:
        return len(self._ids)


class TokenSequence:
    """A growable token sequence with memoised block keys (one list per block size)."""

    __slots__ = ("_segments", "_length", "_keys", "_ids")

    def __init__(self, segments: list[tuple[int, int, int]] | None = None) -> None:
        self._segments: list[list[int]] = []
        self._length = 0
        self._keys: dict[int, list[int]] = {}
        self._ids: dict[int, list[int]] = {}
        """Per block size: the block keys numbered by a :class:`KeyTable` (see :meth:`block_ids`)."""
        for source, offset, length in segments or ():
            self.extend(source, offset, length)

    def __len__(self) -> int:
        return self._length

    @property
    def segments(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((s, o, n) for s, o, n in self._segments)

    def copy(self) -> TokenSequence:
        """An independent sequence with the same content and the keys computed so far."""
        other = TokenSequence()
        other._segments = [list(seg) for seg in self._segments]
        other._length = self._length
        other._keys = {bs: list(keys) for bs, keys in self._keys.items()}
        other._ids = {bs: list(ids) for bs, ids in self._ids.items()}
        return other

    def extend(self, source: int, offset: int, length: int) -> None:
        """Append ``length`` tokens of stream ``source`` starting at ``offset``."""
        if length < 0:
            raise ValueError(f"segment length must be >= 0, got {length}")
        if length == 0:
            return
        last = self._segments[-1] if self._segments else None
        if last is not None and last[0] == source and last[1] + last[2] == offset:
            last[2] += length
        else:
            self._segments.append([source, offset, length])
        self._length += length

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` tokens."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot truncate a sequence of {self._length} tokens to {length}")
        cut = self._length - length
        while cut > 0:
            seg = self._segments[-1]
            if seg[2] <= cut:
                cut -= seg[2]
                self._segments.pop()
            else:
                seg[2] -= cut
                cut = 0
        self._length = length
        for block_size, keys in self._keys.items():
            del keys[length // block_size :]
        for block_size, ids in self._ids.items():
            del ids[length // block_size :]

    def block_keys(self, block_size: int) -> list[int]:
        """Keys of every full block, computing only the ones not computed before (the list is shared)."""
        keys = self._keys.setdefault(block_size, [])
        wanted = self._length // block_size
        if len(keys) < wanted:
            self._fill_keys(keys, block_size, wanted)
        return keys

    def block_ids(self, block_size: int, table: KeyTable) -> list[int]:
        """:meth:`block_keys` numbered by ``table`` (always the same table for one sequence), numbering
        only the keys not numbered before (the list is shared)."""
        keys = self.block_keys(block_size)
        ids = self._ids.setdefault(block_size, [])
        if len(ids) < len(keys):
            ids += table.number(keys[len(ids):])
        return ids

    def _fill_keys(self, keys: list[int], block_size: int, wanted: int) -> None:
        start = len(keys) * block_size
        prev = keys[-1] if keys else ROOT_KEY
        # Find the segment holding token `start`.
        seg_index, seg_start = 0, 0
        segments = self._segments
        while seg_start + segments[seg_index][2] <= start:
            seg_start += segments[seg_index][2]
            seg_index += 1
        pos = start
        stop = wanted * block_size
        append = keys.append
        while pos < stop:
            source, offset, length = segments[seg_index]
            seg_end = seg_start + length
            inner = min(stop, seg_end) - pos  # tokens of this segment still wanted
            if inner >= block_size:  # whole blocks inside one segment: the common case, in a tight loop
                first = offset + pos - seg_start
                last = first + inner - inner % block_size
                if _CHAIN_KEYS is not None:
                    prev = _CHAIN_KEYS(keys, prev, source, first, last, block_size)
                else:
                    for piece in range(first, last, block_size):
                        prev = hash((prev, source, piece))
                        append(prev)
                pos += last - first
                if pos == seg_end:
                    seg_start = seg_end
                    seg_index += 1
                continue
            # The block straddles segments (stop is a whole number of blocks past pos): hash its pieces.
            end = pos + block_size
            pieces: list[int] = [prev]
            while pos < end:
                source, offset, length = segments[seg_index]
                take = min(end, seg_start + length) - pos
                pieces += (source, offset + pos - seg_start, take)
                pos += take
                if pos == seg_start + length:
                    seg_start += length
                    seg_index += 1
            prev = hash(tuple(pieces))
            append(prev)
