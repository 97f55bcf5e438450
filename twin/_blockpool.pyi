"""Type stub of the compiled block pool (twin/_blockpool.pyx): the interface of twin.kv_cache.PyBlockPool."""

from twin.kv_cache import PyBlockPool

class BlockPool(PyBlockPool): ...
