"""
TurboQuant: random rotation + Lloyd-Max codebook vector quantization, a quantized KV cache with fused attention, a GGUF Llama runner and a compressed vector-search index.
"""

from collections.abc import Callable, Sequence
from typing import Annotated

import numpy
from numpy.typing import NDArray


class Error(ValueError):
    pass

def simd_level() -> str:
    """The SIMD level the kernels dispatch to (e.g. 'AVX3_DL')."""

def blas_core() -> str:
    """
    The kernel set OpenBLAS picked when it was loaded (e.g. 'SkylakeX'); float GEMMs (k-means, IVF, prefill) run on it. 'Prescott' on a CPU with AVX2 means OpenBLAS did not know the CPU and the package could not set OPENBLAS_CORETYPE before it loaded (see the package docstring).
    """

def kv_types() -> list[str]:
    """Names of the KV cache element formats (f16, q8_0, tq1..tq8, ...)."""

class Codebook:
    """
    Lloyd-Max scalar codebook for one coordinate of a random unit vector in R^dim after a random rotation (cached per (dim, bits, law)).
    """

    def __init__(self, dim: int, bits: int, law: str = 'beta') -> None:
        """
        dim >= 2, bits 1..8, law 'beta' (exact) or 'gauss' (its large-d limit).
        """

    @property
    def dim(self) -> int: ...

    @property
    def bits(self) -> int: ...

    @property
    def law(self) -> str: ...

    @property
    def centroids(self) -> NDArray[numpy.float32]:
        """
        The 2^bits centroids, ascending (units of a unit vector's coordinate), a new array.
        """

    @property
    def boundaries(self) -> NDArray[numpy.float32]:
        """The 2^bits - 1 decision thresholds, ascending, a new array."""

    @property
    def mse_per_coord(self) -> float: ...

    @property
    def mse_per_vector(self) -> float: ...

    def quantize(self, y: Annotated[NDArray, dict(device='cpu', writable=False)]) -> NDArray[numpy.uint8]:
        """
        Indices (uint8) of the nearest centroid of each value of the 1-D float32 array y.
        """

    def __repr__(self) -> str: ...

class Rotation:
    """A seeded random orthogonal transform of R^dim applied to row vectors."""

    def __init__(self, dim: int, kind: str = 'hadamard', seed: int = 24301) -> None:
        """
        kind: 'hadamard' (default), 'haar', 'block32', 'block64', 'block128', 'givens', 'iso4', 'identity'.
        """

    @property
    def dim(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def seed(self) -> int: ...

    def forward(self, x: Annotated[NDArray, dict(device='cpu', writable=False)]) -> NDArray[numpy.float32]:
        """Pi x for each row of x ((n, dim) or (dim,) float32); a new array."""

    def inverse(self, x: Annotated[NDArray, dict(device='cpu', writable=False)]) -> NDArray[numpy.float32]:
        """Pi^T x for each row of x; undoes forward()."""

    def __repr__(self) -> str: ...

class Quantizer:
    """
    TurboQuant quantizer: 'mse' (rotation + Lloyd-Max codes + norm), 'prod' (unbiased inner products: (bits-1)-bit mse + 1-bit QJL of the residual) or 'qjl'.
    """

    def __init__(self, dim: int, bits: int = 4, kind: str = 'mse', rotation: str = 'hadamard', seed: int = 24301, law: str = 'beta', norm: str = 'f16', norm_correction: bool = True) -> None: ...

    @property
    def dim(self) -> int: ...

    @property
    def bits(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def code_bytes(self) -> int:
        """Bytes per encoded vector (norms included)."""

    @property
    def bits_per_value(self) -> float: ...

    @property
    def rotation(self) -> Rotation:
        """The quantizer's rotation (an equal copy: same kind, dim and seed)."""

    @property
    def codebook(self) -> Codebook | None:
        """The Lloyd-Max codebook of the mse stage (None for qjl)."""

    def encode(self, x: Annotated[NDArray, dict(device='cpu', writable=False)]) -> NDArray[numpy.uint8]:
        """
        Codes (n, code_bytes) uint8 of the rows of x ((n, dim) float32, finite).
        """

    def decode(self, codes: Annotated[NDArray, dict(device='cpu', writable=False)]) -> NDArray[numpy.float32]:
        """Reconstructions (n, dim) float32 of codes ((n, code_bytes) uint8)."""

    def score(self, q: Annotated[NDArray, dict(device='cpu', writable=False)], codes: Annotated[NDArray, dict(device='cpu', writable=False)]) -> NDArray[numpy.float32]:
        """
        Estimates of <q_i, x_j> from the codes without decoding: q (dim,) -> (n,), q (nq, dim) -> (nq, n).
        """

    def __repr__(self) -> str: ...

class Index:
    """
    Nearest-neighbour index of TurboQuant codes, flat or IVF, scored on the codes (SIMD fast scan). Scores: similarity for 'ip' / 'cosine' (higher is nearer), squared distance for 'l2'.
    """

    def __init__(self, dim: int, bits: float = 4.0, metric: str = 'cosine', *, codec: str = 'mse', scale: str = 'corrected', norm: str = 'f16', rotation: str = 'hadamard', law: str = 'beta', seed: int = 24301, keep_vectors: bool = False, fit_scale: bool | None = None, center: bool | None = None, trellis: bool = False, nlist: int = 0, kmeans_iters: int = 10, rerank_bits: int = 0) -> None:
        """
        The options of `tq index build` (same names and defaults): bits 1..8 or a half-integer 1.5..7.5; metric 'cosine' | 'ip' | 'l2'; fit_scale / center None: on for a flat mse index (the CLI's --fit-scale --center defaults), off for prod and IVF; trellis: trellis-coded channels (1-4 bits, flat, higher recall at the same bytes, slower build and search; the CLI's --trellis); nlist > 0: IVF with nlist lists (the CLI's --ivf; the k-means runs on the first add(), so add the whole set at once), kmeans_iters its Lloyd iterations, rerank_bits > 0 a second-stage re-rank code (the CLI's --rerank-bits).
        """

    @property
    def nlist(self) -> int:
        """IVF lists (0 for a flat index)."""

    @property
    def dim(self) -> int: ...

    @property
    def d(self) -> int:
        """FAISS's name for dim."""

    @property
    def ntotal(self) -> int:
        """Number of vectors (FAISS's name; also len())."""

    @property
    def bits(self) -> float: ...

    @property
    def metric(self) -> str: ...

    @property
    def code_bytes(self) -> int:
        """Bytes per vector in the file (codes + scale (+ norm))."""

    @property
    def memory_bytes_per_vector(self) -> float: ...

    def describe(self) -> str: ...

    def describe_search(self, fast_scan: bool = True, nprobe: int = 1) -> str:
        """
        describe() with the scoring a search would use (what `tq index search --json` reports as 'index').
        """

    def __len__(self) -> int: ...

    def add(self, x: Annotated[NDArray, dict(device='cpu', writable=False)], ids: Annotated[NDArray, dict(device='cpu', writable=False)] | None = None, *, progress: Callable | None = None) -> None:
        """
        Add the rows of x ((n, dim) float32, C-contiguous, finite); ids: (n,) int64 or None (next_id, next_id + 1, ...). progress: None or a callable(stage, done, total), called at the start and end of each stage ('k-means' and 'assign' for an IVF index, then 'encode') and at most every 100 ms between. An exception it raises, or Ctrl-C, stops the add and leaves the index as it was.
        """

    def remove_ids(self, ids: Annotated[NDArray, dict(device='cpu', writable=False)]) -> int:
        """
        Remove every vector whose id is in ids ((n,) int64; ids not held are skipped) and return how many went. The others keep their codes and order: the index searches and saves as one given only them. O(ntotal) per call, so pass the ids in one array.
        """

    def release_sign_plane(self) -> None:
        """
        Free the two-level scan's sign plane (indexes of dim >= 320, IVF >= 192, at 3 to 4 bits keep one) and return the codes to the fast-scan layout: the index then searches in one level only (two_level=True is an error), in less memory. For indexes that never search in two levels, as ShardedIndex shards. Adds, removes and saves work as before; a loaded index holds a plane again.
        """

    @property
    def has_sign_plane(self) -> bool:
        """Whether the index holds the two-level scan's sign plane."""

    @property
    def ids(self) -> NDArray[numpy.int64]:
        """
        The ids held ((ntotal,) int64, a new array) in slot order: a flat index's insertion order (the slots search_candidates returns index it), an IVF index's list by list.
        """

    @property
    def next_id(self) -> int:
        """
        The first id add() gives without ids: one past the largest id held (0 when empty).
        """

    def search(self, q: Annotated[NDArray, dict(device='cpu', writable=False)], k: int = 10, *, threads: int = 0, rerank: int = -1, rerank_full: int = 0, fast_scan: bool = True, nprobe: int = 1, two_level: bool | None = None) -> tuple:
        """
        Top-k of each row of q ((nq, dim) float32): (scores (nq, k) float32, ids (nq, k) int64), best first; missing results get id -1. threads 0: OpenMP default. nprobe: IVF lists scanned per query (1..nlist; 1 for a flat index). two_level: None (auto: on for fast-scan indexes of dim >= 320, IVF >= 192, with 3 to 4 bits per channel), True (an error on other indexes) or False: a first pass over 1 bit per dimension, full codes only for the vectors that can still rank (docs/design.md). An index searched only with False is faster and smaller after release_sign_plane().
        """

    def train(self, x: Annotated[NDArray, dict(device='cpu', writable=False)]) -> None:
        """
        Fit what the first add() would fit from its batch (center: the mean of the rows of x, normalised for cosine) without adding them; a no-op without the center option. For sharing one fit between indexes (set_center).
        """

    @property
    def center(self) -> NDArray[numpy.float32] | None:
        """
        The fitted center (dim,) float32 (a new array), None before the fit or without the center option.
        """

    def set_center(self, mean: Annotated[NDArray, dict(device='cpu', writable=False)]) -> None:
        """
        Set the center of an empty index built with the center option ((dim,) float32, e.g. another index's center): indexes with one center encode alike.
        """

    def search_candidates(self, q: Annotated[NDArray, dict(device='cpu', writable=False)], k: int = 10, *, threads: int = 0, rerank: int = -1, rerank_full: int = 0, fast_scan: bool = True) -> tuple:
        """
        The candidates a search(q, k, ...) keeps for each query before its cut to k, for merging shards (turboquant.ShardedIndex): (scan, rerank, full, scores, ids, slots), each (nq, r): per query, best first by scan score, the internal score of each stage (higher is better), the score search() would report, the id and the slot (insertion position); missing rows: slot -1, scores -inf.
        """

    def save(self, path: str) -> None:
        """Write the index file (atomically; `tq index search --index` reads it)."""

    @staticmethod
    def load(path: str) -> Index:
        """
        Read an index file (from save() or `tq index build`); validates every field.
        """

    def __getstate__(self) -> tuple: ...

    def __setstate__(self, arg: tuple, /) -> None: ...

    def __repr__(self) -> str: ...

def read_vectors(path: str, max_rows: int | None = None) -> NDArray[numpy.float32]:
    """
    Vectors from a .fvecs, .bvecs (bytes as floats 0..255) or .npy ('<f4', C order) file as an (n, d) float32 array; max_rows: only the leading rows. The file is validated first (whole records, one d, finite values): anything else raises Error naming the file and the record.
    """

def read_ivecs(path: str, max_rows: int | None = None) -> NDArray[numpy.int32]:
    """
    An .ivecs file (e.g. ground-truth neighbour ids) as an (n, d) int32 array, validated as read_vectors.
    """

def exact_search(x: Annotated[NDArray, dict(device='cpu', writable=False)], q: Annotated[NDArray, dict(device='cpu', writable=False)], k: int = 10, metric: str = 'cosine', threads: int = 0) -> tuple:
    """
    Brute-force float search (ground truth): (scores, ids) as Index.search.
    """

class KVCache:
    """
    Quantized KV cache of n_layers x n_kv_heads x head_dim with fused attention. The cache choice is a label as `tq perplexity --kv-config` takes it: 'f16', 'tq4/tq3' (K/V types), 'k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k', 'tq4/tq3 w128 plain', ..., or '@path' for a cache config file.
    """

    def __init__(self, label: str = 'f16', n_layers: int = 1, n_kv_heads: int = 1, head_dim: int = 128, max_tokens: int = 4096, rope_base: float = 0.0, rope_dim: int = 0, rope_neox: bool = False) -> None:
        """
        rope_base, rope_dim: the keys' RoPE, needed when the K mean rotates with RoPE ('cr', part of a tq K type's automatic protection unless the label says 'plain' or gives a centring); rope_neox: the model rotates the pairs (i, i + rope_dim / 2) (GPT-NeoX style: Qwen 2/3, Gemma) rather than (2i, 2i + 1); give K and queries as the model holds them.
        """

    @property
    def label(self) -> str: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def n_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def bytes_used(self) -> int: ...

    @property
    def bytes_per_token(self) -> float: ...

    def n_tokens(self, layer: int = 0) -> int: ...

    def clear(self) -> None: ...

    def append(self, layer: int, k: Annotated[NDArray, dict(device='cpu', writable=False)], v: Annotated[NDArray, dict(device='cpu', writable=False)], threads: int = 1) -> None:
        """
        Append tokens to one layer: k, v (n_tokens, n_kv_heads, head_dim) float32 (RoPE already applied).
        """

    def attention(self, layer: int, q: Annotated[NDArray, dict(device='cpu', writable=False)], scale: float = 0.0, threads: int = 0, reference: bool = False) -> NDArray[numpy.float32]:
        """
        Causal attention of the n_q queries q (n_q, n_heads, head_dim) float32 at the layer's last n_q positions; n_heads a multiple of n_kv_heads (GQA). scale 0: 1/sqrt(head_dim). reference=True: the test oracle (rows dequantized, exact float attention). Returns (n_q, n_heads, head_dim).
        """

    def __repr__(self) -> str: ...

class Model:
    """A GGUF Llama-family model (e.g. SmolLM2-135M) with its tokenizer."""

    @staticmethod
    def load(path: str, threads: int = 0) -> Model:
        """Load a GGUF file; threads 0: all cores."""

    @property
    def path(self) -> str: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def n_heads(self) -> int: ...

    @property
    def n_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_ctx_train(self) -> int: ...

    @property
    def threads(self) -> int: ...

    @threads.setter
    def threads(self, arg: int, /) -> None: ...

    def tokenize(self, text: str, add_bos: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text."""

    def detokenize(self, ids: Sequence[int], render_special: bool = False) -> bytes:
        """
        The bytes of the token ids (UTF-8 text split at token edges may be partial: decode with errors='replace').
        """

    def new_cache(self, label: str = 'f16', max_tokens: int = 2048) -> KVCache:
        """A KVCache with this model's shape."""

    def perplexity(self, text: object, cache: str = 'f16', n_ctx: int = 512, n_chunks: int = 0, compare: bool = False, ref: str = 'f16') -> dict:
        """
        Perplexity of text (str, or a list of token ids) on the cache label `cache`, as `tq perplexity`: windows of n_ctx tokens, the second half of each scored. compare=True also runs the `ref` cache for KL divergence and top-1 agreement. Returns a dict.
        """

    def generate(self, prompt: object, max_tokens: int = 32, cache: str = 'f16', temperature: float = 0.0, top_p: float = 0.949999988079071, top_k: int = 0, seed: int = 1, chat: bool = False) -> tuple:
        """
        Generate up to max_tokens tokens after prompt (str or token ids) on the cache label `cache` (temperature 0: greedy), as `tq generate`. Returns (text, token ids).
        """

    def __repr__(self) -> str: ...
