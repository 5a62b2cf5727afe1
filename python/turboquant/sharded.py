"""A turboquant Index split into shards held by Ray actors (https://www.ray.io, ``pip install
ray``): rows are dealt round-robin to the shards and encoded by the actors in parallel; a search
fans the queries out to every shard and merges what they return into the top-k.

The result is exactly the one ``turboquant.Index`` holding every row in the same order gives (same
ids, same float scores), for every option of a flat index, also after ``remove_ids``: the shards
encode with the same rotation seed and the same center (fitted once, by ``Index.train``, on the
first batch as one index fits it), and each returns every candidate its scan kept with the score of
every stage (``Index.search_candidates``) and the row's position in the whole sequence of added
rows, which the driver merges stage by stage in the single index's order of ties (that position).
docs/design.md "Sharding" has the argument.

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
VERSION = 2  # 2: positions files (after removals); version 1 directories (no removals) still load


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("turboquant.ShardedIndex needs Ray: pip install ray") from None
    return ray


def _shard_file(s):
    return f"shard-{s:04d}.tqi"


def _positions_file(s):
    return f"shard-{s:04d}.pos.npy"


def candidate_positions(part, positions):
    """Index.search_candidates' result of a shard with its slots (last entry) replaced by the
    rows' positions in the whole sequence (positions[slot]; -1 stays -1): merge_candidates' input."""
    slots = part[5]
    pos = np.full(slots.shape, -1, dtype=np.int64)
    if len(positions):
        pos = np.where(slots >= 0, positions[np.clip(slots, 0, None)], -1)
    return (*part[:5], pos)


def _read_positions(path, n, shard, n_shards, next_position):
    """A shard's positions file: n int64 positions, rising, each p with p % n_shards == shard and
    0 <= p < next_position (so no two shards share one)."""
    try:
        p = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise Error(f"{path}: not a positions file ({e})") from None
    if p.dtype != np.int64 or p.shape != (n,):
        raise Error(f"{path}: {p.dtype} array of shape {p.shape}, the shard holds {n} rows (int64 expected)")
    if n and (p[0] < 0 or p[-1] >= next_position or (np.diff(p) <= 0).any() or (p % n_shards != shard).any()):
        raise Error(f"{path}: positions not rising within [0, {next_position}) or not of shard {shard} of {n_shards}")
    return p


def _max_id(ids):
    """The largest of a shard's ids, None when it holds none."""
    return int(ids.max()) if len(ids) else None


class _Shard:
    """The Ray actor holding one shard (a turboquant.Index) and each row's position in the whole
    sequence of added rows (the single index's order, kept by removals)."""

    def __init__(self, dim, bits, metric, options, path=None):
        self.index = Index.load(path) if path else Index(dim, bits, metric, **options)
        # A shard searches in one level (search_candidates): the two-level scan's sign plane
        # would be memory never read, and its codes' layout a transpose per scan.
        self.index.release_sign_plane()
        self.pos = np.zeros(0, dtype=np.int64)

    def set_positions(self, path, shard, n_shards, next_position):
        """Positions of a loaded shard: from its file, or (path None: a version 1 directory) the
        round-robin deal's, slot j at j * n_shards + shard."""
        n = len(self.index)
        if path is None:
            self.pos = np.arange(n, dtype=np.int64) * n_shards + shard
        else:
            self.pos = _read_positions(path, n, shard, n_shards, next_position)

    def set_center(self, mean):
        self.index.set_center(mean)

    def add(self, x, ids, pos):
        self.index.add(x, ids)
        self.pos = np.concatenate([self.pos, pos])
        return len(self.index)

    def remove(self, ids):
        """Removes the rows of these ids and their positions: how many went and the largest id left."""
        held = self.index.ids
        gone = np.isin(held, ids)
        n = self.index.remove_ids(ids)
        if n != int(gone.sum()):
            raise Error(f"shard removed {n} rows, its ids say {int(gone.sum())}")
        self.pos = self.pos[~gone]
        return {"removed": n, "max_id": _max_id(held[~gone])}

    def candidates(self, q, k, kw):
        return candidate_positions(self.index.search_candidates(q, k, **kw), self.pos)

    def save(self, path, pos_path):
        self.index.save(path)
        tmp = pos_path + ".tmp"
        with open(tmp, "wb") as f:
            np.save(f, self.pos, allow_pickle=False)
        os.replace(tmp, pos_path)
        return len(self.index)

    def info(self):
        i = self.index
        return {"ntotal": len(i), "dim": i.dim, "describe": i.describe(), "center": i.center,
                "max_id": _max_id(i.ids)}


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
        self._seq = 0  # rows ever added: the next row's position in the whole sequence
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
        next_id + 1, ...). Row g of the whole sequence of added rows (g = rows added before + i,
        removed ones included) goes to shard g % n_shards; the shards encode their rows in parallel."""
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
        pos = np.arange(self._seq, self._seq + n, dtype=np.int64)
        refs = []
        for s, a in enumerate(self._actors):
            first = (s - self._seq) % S
            if first >= n:
                continue
            refs.append(a.add.remote(np.ascontiguousarray(x[first::S]), np.ascontiguousarray(ids[first::S]),
                                     pos[first::S]))
        try:
            self._get(refs, "ShardedIndex.add")
        except Error as e:
            # Some shards may hold their rows and others not: no consistent state to go back to.
            self._broken = str(e)
            raise
        self._ntotal += n
        self._seq += n
        top = int(ids.max())
        if self._next_id is not None:
            self._next_id = None if top == np.iinfo(np.int64).max else max(self._next_id, top + 1)

    def remove_ids(self, ids):
        """Remove every row whose id is in ids ((n,) int64; ids not held are skipped) from every
        shard and return how many went; what Index.remove_ids does on one index holding every row:
        the rest search (and save) as before, ties still in insertion order."""
        self._check_usable()
        if not isinstance(ids, np.ndarray) or ids.dtype != np.int64:
            raise TypeError("ShardedIndex.remove_ids: ids must be an int64 NumPy array")
        if ids.ndim != 1:
            raise Error(f"ShardedIndex.remove_ids: ids has shape {ids.shape}, expected (n,)")
        if len(ids) == 0:
            return 0
        ids = np.ascontiguousarray(ids)
        try:
            done = self._get([a.remove.remote(ids) for a in self._actors], "ShardedIndex.remove_ids")
        except Error as e:
            self._broken = str(e)
            raise
        removed = sum(r["removed"] for r in done)
        self._ntotal -= removed
        self._next_id = _next_id_of(done)
        return removed

    # ---- search
    def search(self, q, k=10, *, threads=0, rerank=-1, rerank_full=0, fast_scan=True):
        """Top-k of each row of q ((nq, dim) float32): (scores (nq, k) float32, ids (nq, k) int64),
        best first, missing results id -1: what Index.search with the same arguments and
        two_level=False returns on one index holding every row (the shards' candidates come from the
        single-level scan, whose stages merge exactly). threads: OpenMP threads of each shard's
        search (0: its default)."""
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
        pfiles = [_positions_file(s) for s in range(self.n_shards)]
        counts = self._get([a.save.remote(str((d / f).resolve()), str((d / pf).resolve()))
                            for a, f, pf in zip(self._actors, files, pfiles)], "ShardedIndex.save")
        c = self._template.center
        manifest = {
            "format": FORMAT, "version": VERSION, "dim": self._dim, "n_shards": self.n_shards,
            "bits": self._bits, "metric": self._metric, "options": self._options, "ntotal": self._ntotal,
            "next_position": self._seq, "center": None if c is None else [float(v) for v in c],
            "shards": [{"file": f, "positions": pf, "ntotal": int(n)} for f, pf, n in zip(files, pfiles, counts)],
        }
        tmp = d / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, d / MANIFEST)

    @classmethod
    def load(cls, path, *, actor_options=None):
        """Read a directory written by save(): the manifest, then one actor per shard loading its
        index file and its positions file (every field validated). A version 1 directory (written
        before removals existed) has no positions files: its shard sizes must be those of the
        round-robin deal."""
        d = pathlib.Path(path)
        try:
            m = json.loads((d / MANIFEST).read_text())
        except FileNotFoundError:
            raise Error(f"ShardedIndex.load: no {MANIFEST} in {d}") from None
        except (OSError, ValueError) as e:
            raise Error(f"ShardedIndex.load: {d / MANIFEST}: {e}") from None
        try:
            version = m.get("version")
            if m.get("format") != FORMAT or version not in (1, VERSION):
                raise Error(f"not a {FORMAT} version 1 or {VERSION} manifest")
            S, N = int(m["n_shards"]), int(m["ntotal"])
            seq = N if version == 1 else int(m["next_position"])
            shards = m["shards"]
            if S < 1 or len(shards) != S:
                raise Error(f"{S} shards, {len(shards)} listed")
            if N < 0 or seq < N:
                raise Error(f"{N} vectors, {seq} ever added")
            names = [sh["file"] for sh in shards] + ([sh["positions"] for sh in shards] if version > 1 else [])
            for f in names:
                if not isinstance(f, str) or os.sep in f or f in ("", ".", ".."):
                    raise Error(f"shard file name {f!r} is not a file of the directory")
            for s, sh in enumerate(shards):
                want = (N - s + S - 1) // S if N > s else 0
                if version == 1 and int(sh["ntotal"]) != want:
                    raise Error(f"shard {s}: {sh['ntotal']} vectors, the round-robin deal of {N} gives {want}")
            if sum(int(sh["ntotal"]) for sh in shards) != N:
                raise Error(f"the shards hold {sum(int(sh['ntotal']) for sh in shards)} vectors, not {N}")
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
        refs = [a.set_positions.remote(None if version == 1 else str((d / sh["positions"]).resolve()), s, S, seq)
                for s, (a, sh) in enumerate(zip(self._actors, shards))]
        try:
            self._get(refs, "ShardedIndex.load")
        except Error:
            self.close()
            raise
        self._ntotal = N
        self._seq = seq
        self._next_id = _next_id_of(infos)
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


def _next_id_of(infos):
    """next_id of one index holding the shards' rows, from each shard's "max_id": one past the
    largest id (0 when empty; None when that is INT64_MAX)."""
    top = [i["max_id"] for i in infos if i["max_id"] is not None]
    if not top:
        return 0
    return None if max(top) == np.iinfo(np.int64).max else max(top) + 1


def merge_candidates(parts, k, rerank_full=0):
    """Merge the shards' candidates (parts[s]: Index.search_candidates' result with each slot
    replaced by the row's position in the whole sequence, candidate_positions) into search()'s
    (scores, ids): the best r by (scan score, position), of those the best max(k, rerank_full)
    by (re-rank score, position), of those the best k by (full score, position); higher internal
    scores are better, ties go to the earlier row."""
    r = parts[0][0].shape[1]
    scan, rer, full, out, ids = (np.concatenate([p[i] for p in parts], axis=1) for i in range(5))
    big = np.iinfo(np.int64).max
    pos = np.concatenate([np.where(p[5] >= 0, p[5], big) for p in parts], axis=1)
    cols = [scan, rer, full, out, ids, pos]

    def stage(key_index, keep):
        nonlocal cols
        order = np.lexsort((cols[5], -cols[key_index]), axis=1)[:, :keep]
        cols = [np.take_along_axis(c, order, axis=1) for c in cols]

    stage(0, r)
    stage(1, max(k, rerank_full))
    stage(2, k)
    return np.ascontiguousarray(cols[3]), np.ascontiguousarray(cols[4])
