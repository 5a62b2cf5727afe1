"""TurboQuant: random rotation + Lloyd-Max codebook vector quantization.

Python bindings of the turboquant C++ library (nanobind): the codec (``Codebook``,
``Rotation``, ``Quantizer``), a compressed flat vector-search ``Index`` with a FAISS-like
surface, a quantized ``KVCache`` with fused attention, and a GGUF ``Model`` runner for
scripted evaluations (perplexity on any cache, generation). ``ShardedIndex`` splits an Index
into shards held by Ray actors (``pip install ray``; imported only when one is made) and returns
exactly the single Index's results.

Arrays go in as C-contiguous NumPy arrays of the documented dtype (float32 vectors, uint8
codes, int64 ids) and are read in place; a wrong dtype raises ``TypeError``, a wrong shape,
non-contiguous layout, NaN/Inf or any error of the library raises ``turboquant.Error`` (a
``ValueError``) carrying the library's message. Results are new NumPy arrays. Long calls
release the GIL.
"""

from ._turboquant import (  # noqa: F401
    Codebook,
    Error,
    Index,
    KVCache,
    Model,
    Quantizer,
    Rotation,
    __version__,
    exact_search,
    kv_types,
    read_ivecs,
    read_vectors,
    simd_level,
)
from .sharded import ShardedIndex  # noqa: F401  (imports Ray only when one is made)

__all__ = [
    "Codebook",
    "Error",
    "Index",
    "KVCache",
    "Model",
    "Quantizer",
    "Rotation",
    "ShardedIndex",
    "__version__",
    "exact_search",
    "kv_types",
    "read_ivecs",
    "read_vectors",
    "simd_level",
]
