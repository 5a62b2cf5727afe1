"""turboquant.Index: the same results as the CLI (`tq index build` / `tq index search`) on the
same data, files shared both ways, pickling, FAISS-like surface, and bad input."""
import pickle

import numpy as np
import pytest

import turboquant as tq
from conftest import run_cli


def clustered(rng, n, d, centres=20):
    c = rng.normal(size=(centres, d))
    return (c[rng.integers(0, centres, n)] + 0.3 * rng.normal(size=(n, d))).astype(np.float32)


def cli_build_search(tq_cli, tmp_path, x, q, build_args, search_args):
    """`tq index build` of x into tmp_path/cli.tqi, then its `tq index search` of q at k = 10 and
    1 thread (JSON). x and q are saved as base.npy and q.npy."""
    np.save(tmp_path / "base.npy", x)
    np.save(tmp_path / "q.npy", q)
    run_cli(tq_cli, "index", "build", "--input", tmp_path / "base.npy", "-o", tmp_path / "cli.tqi", *build_args)
    return run_cli(tq_cli, "index", "search", "--index", tmp_path / "cli.tqi", "--queries", tmp_path / "q.npy",
                   "-k", 10, "--threads", 1, *search_args)


@pytest.mark.parametrize("metric,bits,trellis", [("cosine", 4, False), ("ip", 2, False), ("l2", 3.5, False),
                                                 ("cosine", 8, False), ("cosine", 4, True), ("l2", 2, True)])
def test_index_equals_cli(tq_cli, tmp_path, rng, metric, bits, trellis):
    d = 48
    x = clustered(rng, 3000, d)
    q = clustered(rng, 40, d)
    cli = cli_build_search(tq_cli, tmp_path, x, q, ["--bits", bits, "--metric", metric, "--threads", 1,
                                                    *(["--trellis"] if trellis else [])], [])
    idx = tq.Index(d, bits=bits, metric=metric, trellis=trellis)
    idx.add(x)
    assert len(idx) == 3000 and idx.ntotal == 3000 and idx.d == d
    assert idx.describe_search() == cli["index"]
    scores, ids = idx.search(q, 10, threads=1)
    assert scores.dtype == np.float32 and ids.dtype == np.int64 and ids.shape == (40, 10)
    np.testing.assert_array_equal(ids, np.array(cli["ids"]))
    np.testing.assert_allclose(scores, np.array(cli["scores"], dtype=np.float64), rtol=1e-6, atol=1e-6)
    # files go both ways: the CLI's file loaded here, ours searched by the CLI
    s2, i2 = tq.Index.load(str(tmp_path / "cli.tqi")).search(q, 10)
    np.testing.assert_array_equal(i2, ids)
    np.testing.assert_array_equal(s2, scores)
    idx.save(str(tmp_path / "py.tqi"))
    cli2 = run_cli(tq_cli, "index", "search", "--index", tmp_path / "py.tqi", "--queries",
                   tmp_path / "q.npy", "-k", 10)
    np.testing.assert_array_equal(np.array(cli2["ids"]), ids)


def test_index_equals_cli_past_one_add_batch(tq_cli, tmp_path, rng):
    """The CLI adds a flat index's vectors in batches of 65,536; its --center mean (a default)
    must still come from every vector, as Index.add(x) of the whole matrix fits it."""
    d = 16
    x = clustered(rng, 70000, d)
    x[65536:] += 0.5  # the rows past the first batch move the mean
    q = clustered(rng, 40, d)
    cli = cli_build_search(tq_cli, tmp_path, x, q, ["--threads", 2], [])
    idx = tq.Index(d)
    idx.add(x)
    np.testing.assert_array_equal(tq.Index.load(str(tmp_path / "cli.tqi")).center, idx.center)
    scores, ids = idx.search(q, 10, threads=1)
    np.testing.assert_array_equal(ids, np.array(cli["ids"]))
    np.testing.assert_allclose(scores, np.array(cli["scores"], dtype=np.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("metric,rerank_bits", [("cosine", 0), ("l2", 4)])
def test_ivf_index_equals_cli(tq_cli, tmp_path, rng, metric, rerank_bits):
    """nlist / rerank_bits / nprobe are the CLI's --ivf / --rerank-bits / --nprobe: the same lists,
    the same results, files shared both ways; nprobe outside [1, nlist] is an error."""
    d = 32
    x = clustered(rng, 4000, d)
    q = clustered(rng, 40, d)
    cli = cli_build_search(tq_cli, tmp_path, x, q, ["--metric", metric, "--ivf", 16, "--rerank-bits", rerank_bits,
                                                    "--threads", 2], ["--nprobe", 4])
    idx = tq.Index(d, metric=metric, nlist=16, rerank_bits=rerank_bits)
    idx.add(x)
    assert idx.nlist == 16 and tq.Index(d).nlist == 0
    assert idx.describe_search(nprobe=4) == cli["index"] and "nprobe 4" in cli["index"]
    scores, ids = idx.search(q, 10, threads=1, nprobe=4)
    np.testing.assert_array_equal(ids, np.array(cli["ids"]))
    np.testing.assert_allclose(scores, np.array(cli["scores"], dtype=np.float64), rtol=1e-6, atol=1e-6)
    s2, i2 = tq.Index.load(str(tmp_path / "cli.tqi")).search(q, 10, nprobe=4)
    np.testing.assert_array_equal(i2, ids)
    np.testing.assert_array_equal(s2, scores)
    idx.save(str(tmp_path / "py.tqi"))
    cli2 = run_cli(tq_cli, "index", "search", "--index", tmp_path / "py.tqi", "--queries",
                   tmp_path / "q.npy", "-k", 10, "--nprobe", 4)
    np.testing.assert_array_equal(np.array(cli2["ids"]), ids)
    # more lists probed can only find more of the exact neighbours (all 16: every code scored)
    _, gt = tq.exact_search(x, q, 10, metric=metric)
    recall = [np.mean([len(set(gt[i]) & set(r[i])) / 10 for i in range(len(q))])
              for r in (idx.search(q, 10, nprobe=1)[1], ids, idx.search(q, 10, nprobe=16)[1])]
    assert recall[0] <= recall[1] + 0.02 and recall[1] <= recall[2] + 0.02 and recall[2] >= 0.8, recall
    for bad in (0, 17):
        with pytest.raises(tq.Error, match="nprobe"):
            idx.search(q, 10, nprobe=bad)
    with pytest.raises(tq.Error, match="IVF"):
        tq.Index(d).search(q, 10, nprobe=2)
    with pytest.raises(tq.Error, match="flat"):
        idx.search_candidates(q, 10)
    with pytest.raises(tq.Error, match="trellis"):
        tq.Index(d, trellis=True, nlist=16)
    with pytest.raises(tq.Error, match="rerank_bits"):
        tq.Index(d, rerank_bits=4)


def test_index_recall_against_exact(rng):
    d = 64
    x = clustered(rng, 5000, d)
    q = clustered(rng, 100, d)
    idx = tq.Index(d, bits=4, metric="cosine")
    idx.add(x)
    _, ids = idx.search(q, 10)
    _, gt = tq.exact_search(x, q, 10, metric="cosine")
    # top-1 of the exact search found among the first 10: 4-bit codes lose little
    assert np.mean([gt[i, 0] in ids[i] for i in range(len(q))]) >= 0.95


def test_ids_pickle_repr_and_threads(rng):
    d = 32
    x = clustered(rng, 500, d)
    idx = tq.Index(d, bits=4, metric="l2", seed=3)
    idx.add(x[:200], ids=np.arange(1000, 1200, dtype=np.int64))
    assert idx.next_id == 1200
    idx.add(x[200:])  # default ids continue after the largest id held: 1200, 1201, ...
    s, i = idx.search(x[[5, 300]], 3)
    assert i[0, 0] == 1005 and i[1, 0] == 1300
    assert np.all(np.diff(s, axis=1) >= 0)  # l2: ascending distances
    r = repr(idx)
    assert "Index" in r and "dim=32" in r and "l2" in r and "ntotal=500" in r
    clone = pickle.loads(pickle.dumps(idx))
    assert len(clone) == 500 and repr(clone) == r
    s2, i2 = clone.search(x[[5, 300]], 3)
    np.testing.assert_array_equal(i2, i)
    np.testing.assert_array_equal(s2, s)
    s1, i1 = idx.search(x[:50], 5, threads=1)
    s3, i3 = idx.search(x[:50], 5, threads=2)
    np.testing.assert_array_equal(i1, i3)
    # k > ntotal: the missing results get id -1
    small = tq.Index(d)
    small.add(x[:3])
    _, ik = small.search(x[:1], 5)
    assert list(ik[0, 3:]) == [-1, -1]


@pytest.mark.parametrize("kwargs", [dict(metric="cosine"), dict(metric="l2", bits=2.5, keep_vectors=True),
                                    dict(metric="ip", trellis=True, bits=3), dict(metric="cosine", nlist=8, rerank_bits=4)])
def test_remove_ids_equals_an_index_of_the_rest(tq_cli, tmp_path, rng, kwargs):
    """remove_ids leaves what an index given only the other vectors (and the same fit) holds; the
    CLI's `tq index remove` of the same ids writes the same file."""
    d = 32
    x = clustered(rng, 1000, d)
    q = clustered(rng, 30, d)
    ids = np.arange(5000, 6000, dtype=np.int64)
    idx = tq.Index(d, seed=9, **kwargs)
    idx.add(x, ids)
    idx.save(str(tmp_path / "all.tqi"))
    gone = np.concatenate([ids[::4], np.array([ids[1], 77], dtype=np.int64)])  # a repeat, an id not held
    assert idx.remove_ids(gone) == 251
    assert len(idx) == 749 and idx.next_id == 6000
    keep = ~np.isin(ids, gone)
    held = idx.ids
    assert held.dtype == np.int64 and held.shape == (749,)
    if "nlist" in kwargs:  # list by list
        np.testing.assert_array_equal(np.sort(held), ids[keep])
    else:  # insertion order
        np.testing.assert_array_equal(held, ids[keep])
    nprobe = 8 if "nlist" in kwargs else 1
    s, i = idx.search(q, 10, nprobe=nprobe)
    assert not np.isin(i, gone).any()
    if "nlist" not in kwargs:  # the same fit: an IVF index would train new lists on the rest
        rest = tq.Index(d, seed=9, **kwargs)
        if idx.center is not None:
            rest.set_center(idx.center)
        rest.add(x[keep], ids[keep])
        s2, i2 = rest.search(q, 10)
        np.testing.assert_array_equal(i2, i)
        np.testing.assert_array_equal(s2, s)
    idx.save(str(tmp_path / "py.tqi"))
    np.savetxt(tmp_path / "gone.txt", gone, fmt="%d")
    out = run_cli(tq_cli, "index", "remove", "--index", tmp_path / "all.tqi", "--ids-file", tmp_path / "gone.txt",
                  "-o", tmp_path / "cli.tqi")
    assert out["removed"] == 251 and out["n"] == 749
    assert (tmp_path / "cli.tqi").read_bytes() == (tmp_path / "py.tqi").read_bytes()
    assert idx.remove_ids(np.array([], dtype=np.int64)) == 0
    with pytest.raises(TypeError, match="int64"):
        idx.remove_ids(np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        idx.remove_ids(ids.reshape(10, 100))


@pytest.mark.parametrize("nlist", [0, 8])
def test_add_progress_and_cancel(rng, nlist):
    """add(progress=...) reports each stage; an exception from progress stops the add and
    leaves the index as it was."""
    d = 32
    x = clustered(rng, 4000, d)
    idx = tq.Index(d, nlist=nlist)
    calls = []
    idx.add(x[:2000], progress=lambda stage, done, total: calls.append((stage, done, total)))
    stages = [c[0] for c in calls]
    assert stages[-1] == "encode" and calls[-1][1:] == (2000, 2000)
    assert ("k-means" in stages) == (nlist > 0) and ("assign" in stages) == (nlist > 0)
    before = idx.search(x[:20], 5, nprobe=max(1, nlist))

    def stop(stage, done, total):
        if stage == "encode" and done > 0:
            raise KeyboardInterrupt  # what Ctrl-C raises from the signal check
    with pytest.raises(KeyboardInterrupt):
        idx.add(x[2000:], progress=stop)
    assert len(idx) == 2000
    after = idx.search(x[:20], 5, nprobe=max(1, nlist))
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_array_equal(after[0], before[0])
    idx.add(x[2000:])
    assert len(idx) == 4000 and idx.next_id == 4000


def test_a_signal_stops_a_long_add(rng):
    """A signal whose handler raises (SIGINT raises KeyboardInterrupt) stops an add in
    progress, with no progress callback: the add checks for signals as it goes."""
    import signal
    import threading
    import time

    class Stopped(Exception):
        pass

    def handler(signum, frame):
        raise Stopped

    d = 64
    x = rng.normal(size=(100000, d)).astype(np.float32)
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        idx = tq.Index(d, bits=4, trellis=True)  # about 3 s on 2 cores
        timer = threading.Timer(0.3, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1))
        t0 = time.monotonic()
        timer.start()
        with pytest.raises(Stopped):
            idx.add(x)
        elapsed = time.monotonic() - t0
        timer.join()
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert len(idx) == 0 and idx.center is None
    full = tq.Index(d, bits=4, trellis=True)
    t1 = time.monotonic()
    full.add(x)
    assert elapsed < 0.5 * (time.monotonic() - t1), (elapsed, time.monotonic() - t1)  # stopped, not finished


def test_index_bad_input(tmp_path):
    d = 16
    idx = tq.Index(d)
    x = np.ones((4, d), np.float32)
    with pytest.raises(TypeError, match="float32"):
        idx.add(x.astype(np.float64))
    with pytest.raises(tq.Error, match="16 columns"):
        idx.add(np.ones((4, d + 1), np.float32))
    with pytest.raises(tq.Error, match="2 dimensions"):
        idx.add(np.ones(d, np.float32))
    with pytest.raises(tq.Error, match="C-contiguous"):
        idx.add(np.ones((4, 2 * d), np.float32)[:, ::2])
    with pytest.raises(tq.Error, match="C-contiguous"):
        idx.add(np.ones((8, d), np.float32)[::2])
    bad = x.copy()
    bad[1, 3] = np.nan
    with pytest.raises(tq.Error, match="(?i)finite|nan"):
        idx.add(bad)
    assert len(idx) == 0  # nothing added by a failed call
    with pytest.raises(TypeError, match="int64"):
        idx.add(x, ids=np.arange(4, dtype=np.int32))
    with pytest.raises(tq.Error, match="ids has 3 entries"):
        idx.add(x, ids=np.arange(3, dtype=np.int64))
    idx.add(x)
    with pytest.raises(tq.Error, match="k = 0"):
        idx.search(x, 0)
    with pytest.raises(tq.Error, match="(?i)finite|nan"):
        idx.search(bad, 1)
    with pytest.raises(tq.Error, match="16 columns"):
        idx.search(np.ones((2, 8), np.float32), 1)
    with pytest.raises(tq.Error, match="euclid"):
        tq.Index(d, metric="euclid")
    with pytest.raises(tq.Error):
        tq.Index(d, bits=9)
    with pytest.raises(tq.Error, match="nonexistent"):
        tq.Index.load(str(tmp_path / "nonexistent.tqi"))
    p = tmp_path / "ok.tqi"
    idx.save(str(p))
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "corrupt.tqi").write_bytes(bytes(data))
    with pytest.raises(tq.Error):
        tq.Index.load(str(tmp_path / "corrupt.tqi"))
    (state,) = idx.__getstate__()
    bad_state = bytearray(state)
    bad_state[len(bad_state) // 2] ^= 0xFF
    clone = tq.Index.__new__(tq.Index)
    with pytest.raises(tq.Error, match="pickle"):
        clone.__setstate__((bytes(bad_state),))


def test_concurrent_searches_from_python_threads(rng):
    """search releases the GIL: several Python threads search one index at once, each
    result equal to the same search run alone."""
    from concurrent.futures import ThreadPoolExecutor

    d = 32
    x = clustered(rng, 4000, d)
    q = clustered(rng, 64, d)
    idx = tq.Index(d, bits=4)
    idx.add(x)
    alone = [idx.search(q[i::4].copy(), 5, threads=1) for i in range(4)]
    with ThreadPoolExecutor(4) as ex:
        together = list(ex.map(lambda i: idx.search(q[i::4].copy(), 5, threads=1), range(4)))
    for (s1, i1), (s2, i2) in zip(alone, together):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(s1, s2)


def test_train_center_and_candidates_merge_without_ray(rng):
    """The pieces of ShardedIndex without Ray: one center fit (train) shared by set_center, and
    the candidates of two round-robin shards merged into exactly one index's search."""
    from turboquant.sharded import candidate_positions, merge_candidates

    d = 48
    x = clustered(rng, 3000, d)
    q = clustered(rng, 40, d)
    single = tq.Index(d, bits=2)
    single.add(x)
    tpl = tq.Index(d, bits=2)
    assert tpl.center is None
    tpl.train(x)
    assert tpl.center.shape == (d,) and tpl.center.dtype == np.float32 and len(tpl) == 0
    np.testing.assert_array_equal(tpl.center, single.center)
    shards = [tq.Index(d, bits=2) for _ in range(2)]
    for s, sh in enumerate(shards):
        sh.set_center(tpl.center)
        sh.add(np.ascontiguousarray(x[s::2]), np.arange(s, len(x), 2, dtype=np.int64))
    for k, kw in ((10, {}), (10, {"rerank": 10}), (1, {"fast_scan": False})):
        parts = [sh.search_candidates(q, k, **kw) for sh in shards]
        assert len(parts[0]) == 6 and parts[0][0].shape[0] == len(q)
        parts = [candidate_positions(p, np.arange(s, len(x), 2, dtype=np.int64)) for s, p in enumerate(parts)]
        s_ref, i_ref = single.search(q, k, **kw)
        s_m, i_m = merge_candidates(parts, k)
        np.testing.assert_array_equal(i_ref, i_m)
        assert s_ref.tobytes() == s_m.tobytes()
    with pytest.raises(tq.Error, match="already trained"):
        tpl.train(x)
    with pytest.raises(tq.Error, match="already holds"):
        single.set_center(tpl.center)
    with pytest.raises(tq.Error, match="dim 48"):
        tq.Index(d).set_center(tpl.center[:10].copy())
    with pytest.raises(tq.Error, match="without the center option"):
        tq.Index(d, center=False).set_center(tpl.center)


def test_two_level_search(tq_cli, tmp_path, rng):
    """two_level: None (auto) scans in two levels at d >= 320 (IVF: 192) with 3-4 bits, as True
    does and as `tq index search` does by default; False is the single-level scan, which sharded
    candidates merge into; True on an index without the sign plane is an error."""
    from turboquant.sharded import candidate_positions, merge_candidates

    d = 400
    x = clustered(rng, 2000, d)
    q = clustered(rng, 20, d)
    idx = tq.Index(d, bits=4, metric="l2")
    idx.add(x)
    s_auto, i_auto = idx.search(q, 10)
    s_on, i_on = idx.search(q, 10, two_level=True)
    s_off, i_off = idx.search(q, 10, two_level=False)
    np.testing.assert_array_equal(i_auto, i_on)
    assert s_auto.tobytes() == s_on.tobytes()
    # Both levels find (nearly) the same neighbours; the single-level scores are the same float
    # LUT scores after its re-rank.
    same = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(i_on, i_off)])
    assert same >= 0.95
    # The CLI searches the saved index the same way.
    path = tmp_path / "i.tqi"
    idx.save(str(path))
    qp = tmp_path / "q.npy"
    np.save(qp, q)
    out = run_cli(tq_cli, "index", "search", "--index", str(path), "-q", str(qp), "-k", "10")
    np.testing.assert_array_equal(np.array(out["ids"]), i_auto)
    out = run_cli(tq_cli, "index", "search", "--index", str(path), "-q", str(qp), "-k", "10",
                  "--two-level", "off")
    np.testing.assert_array_equal(np.array(out["ids"]), i_off)
    # Sharded candidates merge into the single-level result.
    shards = [tq.Index(d, bits=4, metric="l2") for _ in range(2)]
    for s, sh in enumerate(shards):
        sh.set_center(idx.center)
        sh.add(np.ascontiguousarray(x[s::2]), np.arange(s, len(x), 2, dtype=np.int64))
    parts = [candidate_positions(sh.search_candidates(q, 10), np.arange(s, len(x), 2, dtype=np.int64))
             for s, sh in enumerate(shards)]
    s_m, i_m = merge_candidates(parts, 10)
    np.testing.assert_array_equal(i_m, i_off)
    assert s_m.tobytes() == s_off.tobytes()
    # ShardedIndex's shards free the sign plane (never read by search_candidates): the same
    # candidates, in less memory; two_level=True is then an error.
    assert shards[0].has_sign_plane
    before = shards[0].memory_bytes_per_vector
    shards[0].release_sign_plane()
    assert not shards[0].has_sign_plane
    assert before - shards[0].memory_bytes_per_vector == pytest.approx(400 / 8 + 8)  # the plane and 2 floats
    parts = [candidate_positions(sh.search_candidates(q, 10), np.arange(s, len(x), 2, dtype=np.int64))
             for s, sh in enumerate(shards)]
    s_m, i_m = merge_candidates(parts, 10)
    np.testing.assert_array_equal(i_m, i_off)
    assert s_m.tobytes() == s_off.tobytes()
    with pytest.raises(tq.Error, match="two_level 1 needs"):
        shards[0].search(q, 5, two_level=True)
    # An IVF index keeps the plane too: auto is on, at any nprobe, and the CLI agrees.
    ivf = tq.Index(d, bits=4, metric="l2", nlist=8)
    ivf.add(x)
    s_auto, i_auto = ivf.search(q, 10, nprobe=3)
    s_on, i_on = ivf.search(q, 10, nprobe=3, two_level=True)
    np.testing.assert_array_equal(i_auto, i_on)
    assert s_auto.tobytes() == s_on.tobytes()
    i_off = ivf.search(q, 10, nprobe=3, two_level=False)[1]
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(i_on, i_off)]) >= 0.95
    ivf.save(str(path))
    out = run_cli(tq_cli, "index", "search", "--index", str(path), "-q", str(qp), "-k", "10", "--nprobe", "3")
    np.testing.assert_array_equal(np.array(out["ids"]), i_auto)
    small = tq.Index(64, bits=4)
    small.add(clustered(rng, 100, 64))
    with pytest.raises(tq.Error, match="two_level 1 needs"):
        small.search(clustered(rng, 2, 64), 5, two_level=True)
    with pytest.raises(tq.Error, match="two_level 1 needs"):
        tq.Index(d, bits=2).search(q, 5, two_level=True)
