"""A turboquant Index split into shards held by Ray actors (https://www.ray.io, ``pip install
ray``): rows are dealt round-robin to the shards and encoded by the actors in parallel; a search
fans the queries out to every shard and merges what they return into the top-k.

The result is exactly the one ``turboquant.Index`` holding every row in the same order gives (same
ids, same float scores), for every option of a flat index: the shards encode with the same
rotation seed and the same center (fitted once, by ``Index.train``, on the first batch as one
index fits it), and each returns every candidate its scan kept with the score of every stage
(``Index.search_candidates``), which the driver merges stage by stage in the single index's order
of ties (insertion position). docs/design.md "Sharding" has the argument.

Ray is imported when a ShardedIndex is made, not with turboquant. Without ``ray.init()`` Ray
starts a local cluster on first use (its own default); to run on a cluster, call ``ray.init``
first. Shard files are written and read by the actors, so on several machines ``save`` / ``load``
need a directory every node sees.
"""

import json
import os
import pathlib

import numpy as np

from ._turboquant import Error, Index

MANIFEST = "manifest.json"
FORMAT = "turboquant-sharded-index"
VERSION = 1


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("turboquant.ShardedIndex needs Ray: pip install ray") from None
    return ray


def _shard_file(s):
    return f"shard-{s:04d}.tqi"


class _Shard:
    """The Ray actor holding one shard (a turboquant.Index)."""

    def __init__(self, dim, bits, metric, options, path=None):
        self.index = Index.load(path) if path else Index(dim, bits, metric, **options)

    def set_center(self, mean):
        self.index.set_center(mean)

    def add(self, x, ids):
        self.index.add(x, ids)
        return len(self.index)

    def candidates(self, q, k, kw):
        return self.index.search_candidates(q, k, **kw)

    def save(self, path):
        self.index.save(path)
        return len(self.index)

    def info(self):
        i = self.index
        try:
            next_id = i.next_id
        except Error:  # the shard holds id INT64_MAX
            next_id = None
        return {"ntotal": len(i), "dim": i.dim, "describe": i.describe(), "center": i.center, "next_id": next_id}


def _check_rows(x, dim, what, name="x"):
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise TypeError(f"{what}: {name} must be a float32 NumPy array, got "
                        f"{type(x).__name__ if not isinstance(x, np.ndarray) else x.dtype}")
    if x.ndim != 2 or x.shape[1] != dim:
        raise Error(f"{what}: {name} has shape {x.shape}, the index has dim {dim} (expected (n, {dim}))")
    if not np.isfinite(x).all():
        bad = int(np.argwhere(~np.isfinite(x))[0][0])
        raise Error(f"{what}: {name} row {bad} has a NaN or Inf component")


class ShardedIndex:
    """A flat turboquant Index split into n_shards Ray actors; the same search results as one Index.

    ``ShardedIndex(dim, n_shards=2, bits=4.0, metric="cosine", **options)``: options are those of
    ``turboquant.Index`` (codec, scale, norm, rotation, law, seed, keep_vectors, fit_scale, center;
    same defaults). ``actor_options``: a dict passed to Ray's ``.options()`` for each shard actor
    (e.g. ``{"num_cpus": 2}``: Ray then also sets the actor's OMP_NUM_THREADS to 2; without
    num_cpus Ray runs each actor's OpenMP with 1 thread). Errors: ``turboquant.Error`` (a ValueError), TypeError for a wrong
    dtype, ImportError when Ray is not installed.
    """

    def __init__(self, dim, n_shards=2, bits=4.0, metric="cosine", *, actor_options=None, **options):
        if not isinstance(n_shards, (int, np.integer)) or isinstance(n_shards, bool) or n_shards < 1:
            raise Error(f"ShardedIndex: n_shards must be an integer >= 1, got {n_shards!r}")
        # The template: checks every option here, then fits the center (train) on the first batch.
        self._template = Index(dim, bits, metric, **options)
        if self._template.nlist > 0:
            raise Error("ShardedIndex: shards are flat indexes (nlist 0); an IVF index is one process's")
        self._init(int(n_shards), dim, bits, metric, options, actor_options)
        self._actors = [self._new_actor() for _ in range(self.n_shards)]

    def _init(self, n_shards, dim, bits, metric, options, actor_options):
        self._ray = _ray()
        self.n_shards = n_shards
        self._dim = int(dim)
        self._bits = float(bits)
        self._metric = metric
        self._options = dict(options)
        self._actor_options = dict(actor_options or {})
        self._ntotal = 0
        self._next_id = 0  # what Index.next_id would be on one index of every row (None: no next id)
        self._broken = None
        self._cls = self._ray.remote(_Shard)

    def _new_actor(self, path=None):
        cls = self._cls.options(**self._actor_options) if self._actor_options else self._cls
        return cls.remote(self._dim, self._bits, self._metric, self._options, path)

    def _get(self, refs, what):
        """ray.get, with an actor's error turned into turboquant.Error carrying its message."""
        try:
            return self._ray.get(refs)
        except self._ray.exceptions.RayTaskError as e:
            cause = e.cause if getattr(e, "cause", None) is not None else e
            raise Error(f"{what}: {cause}") from None

    def _check_usable(self):
        if self._broken:
            raise Error(f"ShardedIndex: unusable after a failed add ({self._broken}); build it again")
        if self._actors is None:
            raise Error("ShardedIndex: closed")

    # ---- properties
    @property
    def dim(self):
        return self._dim

    @property
    def d(self):
        """FAISS's name for dim."""
        return self._dim

    @property
    def ntotal(self):
        """Number of vectors (FAISS's name; also len())."""
        return self._ntotal

    @property
    def next_id(self):
        """The first id add() gives without ids: one past the largest id held (0 when empty), as
        Index.next_id of one index holding every row."""
        if self._next_id is None:
            raise Error("index add: the index holds id INT64_MAX, so there is no next id; pass ids")
        return self._next_id

    @property
    def bits(self):
        return self._bits

    @property
    def metric(self):
        return self._template.metric

    def __len__(self):
        return self._ntotal

    def __repr__(self):
        return (f"turboquant.ShardedIndex(dim={self._dim}, n_shards={self.n_shards}, bits={self._bits:g}, "
                f"metric='{self.metric}', ntotal={self._ntotal}, '{self._template.describe()}')")

    def shard_sizes(self):
        """Vectors held by each shard (asks every actor, so it also waits for them to start)."""
        self._check_usable()
        return [int(i["ntotal"]) for i in self._get([a.info.remote() for a in self._actors], "ShardedIndex")]

    def describe(self):
        return f"{self._template.describe()} sharded {self.n_shards}"

    # ---- build
    def add(self, x, ids=None):
        """Add the rows of x ((n, dim) float32, finite; n >= 1); ids: (n,) int64 or None (next_id,
        next_id + 1, ...). Row g of the whole sequence (g = ntotal + i) goes to shard g % n_shards;
        the shards encode their rows in parallel."""
        self._check_usable()
        _check_rows(x, self._dim, "ShardedIndex.add")
        n = x.shape[0]
        if n == 0:
            raise Error("ShardedIndex.add: x has no rows")
        if ids is None:
            first = self.next_id
            if first > np.iinfo(np.int64).max - (n - 1):
                raise Error(f"index add: default ids from {first} for {n} vectors pass INT64_MAX; pass ids")
            ids = np.arange(first, first + n, dtype=np.int64)
        else:
            if not isinstance(ids, np.ndarray) or ids.dtype != np.int64:
                raise TypeError("ShardedIndex.add: ids must be an int64 NumPy array")
            if ids.shape != (n,):
                raise Error(f"ShardedIndex.add: ids has shape {ids.shape} for {n} vectors")
        if self._ntotal == 0 and self._template.center is None:
            # The first batch fits the center as one Index's first add() would; every shard gets it.
            self._template.train(np.ascontiguousarray(x))
            c = self._template.center
            if c is not None:
                self._get([a.set_center.remote(c) for a in self._actors], "ShardedIndex.add")
        S = self.n_shards
        refs = []
        for s, a in enumerate(self._actors):
            first = (s - self._ntotal) % S
            if first >= n:
                continue
            refs.append(a.add.remote(np.ascontiguousarray(x[first::S]), np.ascontiguousarray(ids[first::S])))
        try:
            self._get(refs, "ShardedIndex.add")
        except Error as e:
            # Some shards may hold their rows and others not: no consistent state to go back to.
            self._broken = str(e)
            raise
        self._ntotal += n
        top = int(ids.max())
        if self._next_id is not None:
            self._next_id = None if top == np.iinfo(np.int64).max else max(self._next_id, top + 1)

    # ---- search
    def search(self, q, k=10, *, threads=0, rerank=-1, rerank_full=0, fast_scan=True):
        """Top-k of each row of q ((nq, dim) float32): (scores (nq, k) float32, ids (nq, k) int64),
        best first, missing results id -1: what Index.search with the same arguments returns on one
        index holding every row. threads: OpenMP threads of each shard's search (0: its default)."""
        self._check_usable()
        _check_rows(q, self._dim, "ShardedIndex.search", "q")
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= (1 << 20):
            raise Error(f"ShardedIndex.search: k = {k!r} outside [1, 2^20]")
        k = int(k)
        if rerank_full > 0 and not self._options.get("keep_vectors", False):
            raise Error("ShardedIndex.search: rerank_full needs an index built with keep_vectors")
        kw = dict(threads=threads, rerank=rerank, rerank_full=rerank_full, fast_scan=fast_scan)
        qc = np.ascontiguousarray(q)
        parts = self._get([a.candidates.remote(qc, k, kw) for a in self._actors], "ShardedIndex.search")
        return merge_candidates(parts, k, rerank_full)

    # ---- persistence
    def save(self, path):
        """Write the directory path: one index file per shard (the CLI's format) and manifest.json
        (written last). The shards write their own files, so path must be visible to every node."""
        self._check_usable()
        d = pathlib.Path(path)
        d.mkdir(parents=True, exist_ok=True)
        files = [_shard_file(s) for s in range(self.n_shards)]
        counts = self._get([a.save.remote(str((d / f).resolve())) for a, f in zip(self._actors, files)],
                           "ShardedIndex.save")
        c = self._template.center
        manifest = {
            "format": FORMAT, "version": VERSION, "dim": self._dim, "n_shards": self.n_shards,
            "bits": self._bits, "metric": self._metric, "options": self._options, "ntotal": self._ntotal,
            "center": None if c is None else [float(v) for v in c],
            "shards": [{"file": f, "ntotal": int(n)} for f, n in zip(files, counts)],
        }
        tmp = d / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, d / MANIFEST)

    @classmethod
    def load(cls, path, *, actor_options=None):
        """Read a directory written by save(): the manifest, then one actor per shard loading its
        file (every field validated); the shard sizes must be those of the round-robin deal."""
        d = pathlib.Path(path)
        try:
            m = json.loads((d / MANIFEST).read_text())
        except FileNotFoundError:
            raise Error(f"ShardedIndex.load: no {MANIFEST} in {d}") from None
        except (OSError, ValueError) as e:
            raise Error(f"ShardedIndex.load: {d / MANIFEST}: {e}") from None
        try:
            if m.get("format") != FORMAT or m.get("version") != VERSION:
                raise Error(f"not a {FORMAT} version {VERSION} manifest")
            S, N = int(m["n_shards"]), int(m["ntotal"])
            shards = m["shards"]
            if S < 1 or N < 0 or len(shards) != S:
                raise Error(f"{S} shards, {len(shards)} listed")
            for s, sh in enumerate(shards):
                want = (N - s + S - 1) // S if N > s else 0
                if int(sh["ntotal"]) != want or os.sep in sh["file"] or sh["file"] in ("", ".", ".."):
                    raise Error(f"shard {s}: {sh['ntotal']} vectors, the round-robin deal of {N} gives {want}")
            self = cls.__new__(cls)
            self._template = Index(m["dim"], m["bits"], m["metric"], **m["options"])
            center = None if m["center"] is None else np.asarray(m["center"], dtype=np.float32)
        except Error as e:
            raise Error(f"ShardedIndex.load: {d / MANIFEST}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise Error(f"ShardedIndex.load: {d / MANIFEST}: bad or missing field ({e})") from None
        self._init(S, m["dim"], m["bits"], m["metric"], m["options"], actor_options)
        if center is not None:
            self._template.set_center(center)
        self._actors = [self._new_actor(str((d / sh["file"]).resolve())) for sh in shards]
        infos = self._get([a.info.remote() for a in self._actors], f"ShardedIndex.load: {d}")
        for s, (sh, info) in enumerate(zip(shards, infos)):
            if info["ntotal"] != int(sh["ntotal"]) or info["dim"] != self._dim:
                self.close()
                raise Error(f"ShardedIndex.load: {d / sh['file']}: {info['ntotal']} vectors of dim {info['dim']}, "
                            f"the manifest says {sh['ntotal']} of dim {self._dim}")
            if info["ntotal"] == 0 and center is not None:
                self._get(self._actors[s].set_center.remote(center), "ShardedIndex.load")
            elif center is not None and not np.array_equal(info["center"], center):
                self.close()
                raise Error(f"ShardedIndex.load: {d / sh['file']}: its center is not the manifest's")
        self._ntotal = N
        nexts = [info["next_id"] for info in infos]
        self._next_id = None if None in nexts else max(nexts)
        return self

    # ---- lifetime
    def close(self):
        """Stop the shard actors (also on garbage collection, through Ray)."""
        if getattr(self, "_actors", None):
            for a in self._actors:
                self._ray.kill(a)
        self._actors = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def merge_candidates(parts, k, rerank_full=0):
    """Merge the Index.search_candidates results of the shards (parts[s], shard s holding rows
    g = slot * S + s) into search()'s (scores, ids): the best r by (scan score, position), of
    those the best max(k, rerank_full) by (re-rank score, position), of those the best k by
    (full score, position); higher internal scores are better, ties go to the earlier row."""
    S = len(parts)
    r = parts[0][0].shape[1]
    scan, rer, full, out, ids = (np.concatenate([p[i] for p in parts], axis=1) for i in range(5))
    big = np.iinfo(np.int64).max
    pos = np.concatenate([np.where(p[5] >= 0, p[5] * S + s, big) for s, p in enumerate(parts)], axis=1)
    cols = [scan, rer, full, out, ids, pos]

    def stage(key_index, keep):
        nonlocal cols
        order = np.lexsort((cols[5], -cols[key_index]), axis=1)[:, :keep]
        cols = [np.take_along_axis(c, order, axis=1) for c in cols]

    stage(0, r)
    stage(1, max(k, rerank_full))
    stage(2, k)
    return np.ascontiguousarray(cols[3]), np.ascontiguousarray(cols[4])
