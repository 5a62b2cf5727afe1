"""turboquant.ShardedIndex on a local Ray cluster of 2 worker CPUs (loopback, no dashboard): the
sharded index built by parallel actors returns exactly what one turboquant.Index returns on the
same rows (ids and float scores), on GloVe-100 when the shared copy is there (else clustered
Gaussian data); save/load; bad input raises clear errors. Skipped only when Ray is not installed.
"""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import turboquant as tq

N_BASE, N_QUERY = 4000, 200

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
from glove_search import default_dir  # noqa: E402  (the example's search for the shared GloVe copy)


@pytest.fixture(scope="module")
def data():
    g = default_dir()
    if (g / "glove100_base.fvecs").exists():
        x = tq.read_vectors(str(g / "glove100_base.fvecs"), max_rows=N_BASE)
        q = tq.read_vectors(str(g / "glove100_query.fvecs"), max_rows=N_QUERY)
    else:  # clustered Gaussian data of the same shape
        rng = np.random.default_rng(7)
        c = rng.standard_normal((32, 100)).astype(np.float32)
        x = (c[rng.integers(0, 32, N_BASE)] + 0.4 * rng.standard_normal((N_BASE, 100))).astype(np.float32)
        q = (c[rng.integers(0, 32, N_QUERY)] + 0.4 * rng.standard_normal((N_QUERY, 100))).astype(np.float32)
    # Duplicated rows: exact ties at every stage, broken by insertion order.
    x = x.copy()
    x[-50:] = x[:50]
    return x, q


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install ray): ShardedIndex not tested")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def single_and_sharded(x, n_shards, batches, ids=None, **opts):
    single = tq.Index(x.shape[1], **opts)
    sharded = tq.ShardedIndex(x.shape[1], n_shards, **opts)
    for b0, b1 in batches:
        i = None if ids is None else ids[b0:b1]
        single.add(x[b0:b1], i)
        sharded.add(x[b0:b1], i)
    return single, sharded


def assert_same(a, b):
    np.testing.assert_array_equal(a[1], b[1])
    assert a[0].tobytes() == b[0].tobytes()  # float identity, not closeness


def test_equals_single_index_on_defaults(ray_cluster, data):
    x, q = data
    n = len(x)
    single, sharded = single_and_sharded(x, 2, [(0, 1500), (1500, n - 1), (n - 1, n)])
    assert len(sharded) == n == sharded.ntotal and sharded.dim == 100
    assert "n_shards=2" in repr(sharded) and "ntotal=4000" in repr(sharded)
    assert sharded.shard_sizes() == [2000, 2000]
    for k in (1, 10, 100):
        assert_same(single.search(q, k), sharded.search(q, k))
    assert_same(single.search(q, 10, rerank=0), sharded.search(q, 10, rerank=0))
    assert_same(single.search(q, 10, fast_scan=False), sharded.search(q, 10, fast_scan=False))
    # rerank = k: merging each shard's own top-k would differ here (the re-rank would see
    # candidates the single index's scan never kept); the stage-by-stage merge does not.
    assert_same(single.search(q, 10, rerank=10), sharded.search(q, 10, rerank=10))
    sharded.close()


def test_equals_single_index_other_options(ray_cluster, data):
    x, q = data
    n = len(x)
    ids = np.arange(n, dtype=np.int64) * 7 + 3
    # l2, kept vectors, full re-rank; 3 shards (more than the cluster's CPUs); user ids.
    single, sharded = single_and_sharded(x, 3, [(0, 1000), (1000, n)], ids=ids, bits=2, metric="l2",
                                         keep_vectors=True)
    assert sharded.shard_sizes() == [1334, 1333, 1333]
    for kw in ({}, {"rerank_full": 50}):
        assert_same(single.search(q, 10, **kw), sharded.search(q, 10, **kw))
    sharded.close()
    # Inner product, no center, half-integer width, one shard; fewer rows than k.
    single, sharded = single_and_sharded(x[:30], 1, [(0, 30)], bits=3.5, metric="ip", center=False,
                                         fit_scale=False)
    assert_same(single.search(q, 40), sharded.search(q, 40))
    assert (sharded.search(q, 40)[1][:, 30:] == -1).all()
    sharded.close()


def test_save_load_round_trip(ray_cluster, data, tmp_path):
    x, q = data
    single, sharded = single_and_sharded(x, 2, [(0, len(x))])
    sharded.save(tmp_path / "idx")
    files = sorted(p.name for p in (tmp_path / "idx").iterdir())
    assert files == ["manifest.json", "shard-0000.pos.npy", "shard-0000.tqi", "shard-0001.pos.npy", "shard-0001.tqi"]
    # Each shard file is an ordinary index file.
    assert len(tq.Index.load(str(tmp_path / "idx" / "shard-0001.tqi"))) == len(x) // 2
    loaded = tq.ShardedIndex.load(tmp_path / "idx")
    assert len(loaded) == len(x) and loaded.n_shards == 2
    assert_same(single.search(q, 10), loaded.search(q, 10))
    # Adding after load continues the round-robin deal, still equal to one index; so do ids
    # given, then the default ones after the largest.
    single.add(x[:7])
    loaded.add(x[:7])
    assert_same(single.search(q, 10), loaded.search(q, 10))
    big = np.arange(3, dtype=np.int64) + 10**12
    single.add(x[7:10], big)
    loaded.add(x[7:10], big)
    single.add(x[10:12])
    loaded.add(x[10:12])
    assert loaded.next_id == single.next_id == 10**12 + 5
    assert_same(single.search(q, 10), loaded.search(q, 10))
    loaded.close()
    # A manifest that does not match its shards is rejected.
    mpath = tmp_path / "idx" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["shards"][0]["ntotal"] += 1
    mpath.write_text(json.dumps(m))
    with pytest.raises(tq.Error, match="hold 4001 vectors, not 4000"):
        tq.ShardedIndex.load(tmp_path / "idx")
    m["shards"][0]["ntotal"] -= 1
    m["ntotal"] += 1
    mpath.write_text(json.dumps(m))
    with pytest.raises(tq.Error, match="4001 vectors, 4000 ever added"):
        tq.ShardedIndex.load(tmp_path / "idx")
    m["ntotal"] -= 1
    # A version 1 directory (no positions files, from before removals) loads with the deal's.
    v1 = dict(m, version=1, shards=[{"file": sh["file"], "ntotal": sh["ntotal"]} for sh in m["shards"]])
    del v1["next_position"]
    mpath.write_text(json.dumps(v1))
    for sh in m["shards"]:
        (tmp_path / "idx" / sh["positions"]).unlink()
    single = tq.Index(x.shape[1])
    single.add(x)
    old = tq.ShardedIndex.load(tmp_path / "idx")
    assert_same(single.search(q, 10), old.search(q, 10))
    old.close()
    v1["ntotal"] += 2
    v1["shards"][0]["ntotal"] += 2
    mpath.write_text(json.dumps(v1))
    with pytest.raises(tq.Error, match="round-robin"):
        tq.ShardedIndex.load(tmp_path / "idx")
    with pytest.raises(tq.Error, match="no manifest.json"):
        tq.ShardedIndex.load(tmp_path / "nothing")
    sharded.close()


def test_remove_ids_equals_single_index(ray_cluster, data, tmp_path):
    x, q = data
    n = len(x)
    ids = np.arange(n, dtype=np.int64) * 3 + 11
    single, sharded = single_and_sharded(x, 3, [(0, 2500), (2500, n)], ids=ids)
    # Every 4th row, every other first copy of the duplicated rows (so ties stay, some with one
    # copy gone), an id not held and a repeat.
    gone = np.concatenate([ids[::4], ids[1:50:2], np.array([5, ids[7]], dtype=np.int64)])
    assert sharded.remove_ids(gone) == single.remove_ids(gone) == 1000 + 25
    assert len(sharded) == len(single) == n - 1025 and sum(sharded.shard_sizes()) == len(single)
    for kw in ({}, {"rerank": 10}, {"fast_scan": False}):
        assert_same(single.search(q, 10, **kw), sharded.search(q, 10, **kw))
    # Adds after a removal take the next positions (and default ids); remove again.
    single.add(x[:333])
    sharded.add(x[:333])
    assert sharded.next_id == single.next_id == ids[-1] + 334
    assert_same(single.search(q, 10), sharded.search(q, 10))
    gone = single.ids[1::5].copy()
    assert sharded.remove_ids(gone) == single.remove_ids(gone)
    assert_same(single.search(q, 100), sharded.search(q, 100))
    # Saved with the positions: the same after load, and after more adds.
    sharded.save(tmp_path / "idx")
    loaded = tq.ShardedIndex.load(tmp_path / "idx")
    assert_same(single.search(q, 10), loaded.search(q, 10))
    single.add(x[333:400])
    loaded.add(x[333:400])
    assert_same(single.search(q, 10), loaded.search(q, 10))
    # Removing the largest id lowers next_id, as on one index; everything removed: empty, next id 0.
    top = np.array([loaded.next_id - 1], dtype=np.int64)
    assert loaded.remove_ids(top) == single.remove_ids(top) == 1
    assert loaded.next_id == single.next_id
    assert loaded.remove_ids(single.ids) == single.remove_ids(single.ids) and len(loaded) == 0
    assert loaded.next_id == single.next_id == 0 and loaded.shard_sizes() == [0, 0, 0]
    assert (loaded.search(q, 5)[1] == -1).all()
    single.add(x[:20])
    loaded.add(x[:20])
    assert_same(single.search(q, 30), loaded.search(q, 30))
    assert loaded.remove_ids(np.array([], dtype=np.int64)) == 0
    with pytest.raises(TypeError, match="int64"):
        loaded.remove_ids(np.array([1.0]))
    with pytest.raises(tq.Error, match="shape"):
        loaded.remove_ids(np.zeros((2, 2), dtype=np.int64))
    loaded.close()
    sharded.close()
    # Only negative ids, one shard empty: next_id after load is one past the largest (-4), as
    # on one index, not the empty shard's 0.
    single, few = single_and_sharded(x[:2], 3, [(0, 2)], ids=np.array([-9, -5], dtype=np.int64))
    few.save(tmp_path / "few")
    few.close()
    few = tq.ShardedIndex.load(tmp_path / "few")
    assert few.shard_sizes() == [1, 1, 0] and few.next_id == single.next_id == -4
    few.close()
    # A positions file that does not belong to its shard, or is not one, is rejected.
    pos0 = tmp_path / "idx" / "shard-0000.pos.npy"
    good = pos0.read_bytes()
    p = np.load(pos0)
    np.save(pos0, p + 1)
    with pytest.raises(tq.Error, match="shard-0000.pos.npy: positions not rising"):
        tq.ShardedIndex.load(tmp_path / "idx")
    np.save(pos0, p[:-1])
    with pytest.raises(tq.Error, match="shard holds"):
        tq.ShardedIndex.load(tmp_path / "idx")
    pos0.write_bytes(good[:40])
    with pytest.raises(tq.Error, match="not a positions file"):
        tq.ShardedIndex.load(tmp_path / "idx")


def test_bad_input(ray_cluster, data):
    x, q = data
    with pytest.raises(tq.Error, match="n_shards must be an integer >= 1"):
        tq.ShardedIndex(100, 0)
    with pytest.raises(tq.Error):
        tq.ShardedIndex(100, 2, bits=11)
    with pytest.raises(tq.Error, match="flat"):
        tq.ShardedIndex(100, 2, nlist=8)
    s = tq.ShardedIndex(100, 2)
    with pytest.raises(tq.Error, match="no rows"):
        s.add(np.zeros((0, 100), np.float32))
    with pytest.raises(tq.Error, match="dim 100"):
        s.add(x[:, :50].copy())
    with pytest.raises(TypeError, match="float32"):
        s.add(x.astype(np.float64))
    bad = x[:10].copy()
    bad[3, 5] = np.nan
    with pytest.raises(tq.Error, match="row 3"):
        s.add(bad)
    s.add(x[:100])
    with pytest.raises(tq.Error, match="dim 100"):
        s.search(q[:, :99].copy(), 10)
    for k in (0, -1):
        with pytest.raises(tq.Error, match="outside"):
            s.search(q, k)
    with pytest.raises(tq.Error, match="keep_vectors"):
        s.search(q, 10, rerank_full=5)
    with pytest.raises(tq.Error, match="ids"):
        s.add(x[:10], np.arange(9, dtype=np.int64))
    assert len(s) == 100  # nothing half-added
    s.close()
    with pytest.raises(tq.Error, match="closed"):
        s.search(q, 10)


def test_import_does_not_need_ray():
    code = ("import sys; sys.modules['ray'] = None\n"
            "import turboquant as tq\n"
            "try:\n    tq.ShardedIndex(8, 2)\nexcept ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install ray" in r.stdout
