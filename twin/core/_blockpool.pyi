"""Type stub of the compiled module (twin/core/_blockpool.pyx): the block pool, with the interface of
twin.core.kv_cache.PyBlockPool, and the chained block keys of twin.core.tokens."""

from twin.core.kv_cache import PyBlockPool

class BlockPool(PyBlockPool): ...

def chain_keys(out: list[int], prev: int, source: int, first: int, last: int, step: int) -> int: ...
