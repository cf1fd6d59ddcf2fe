"""Manifests of millions of samples in numpy columns (issue 12, item 5): the columns hold
exactly the strings they were given, and a manifest costs a few bytes per id."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset.errors import ConfigError
from hotset.storage import columns
from hotset.storage.columns import DigestColumn, StringColumn, concat, key_column
from hotset.storage.manifest import Manifest

texts = st.lists(st.text(max_size=12), max_size=40)
digests = st.lists(st.binary(min_size=16, max_size=16).map(bytes.hex), max_size=40)


@settings(max_examples=60, deadline=None)
@given(texts, st.data())
def test_a_string_column_holds_what_it_was_given(strings, data):
    col = StringColumn(strings)
    assert len(col) == len(strings) and list(col) == strings and col == strings
    assert [col[i] for i in range(-len(strings), len(strings))] == strings + strings
    idx = data.draw(st.lists(st.integers(0, max(0, len(strings) - 1)), max_size=20))
    if strings:
        assert list(col.take(idx)) == [strings[i] for i in idx]
    query = data.draw(st.lists(st.text(max_size=12), max_size=10)) + strings[:5]
    first = {s: i for i, s in reversed(list(enumerate(strings)))}
    assert col.positions(query).tolist() == [first.get(s, -1) for s in query]


@settings(max_examples=60, deadline=None)
@given(texts, st.text(max_size=6))
def test_a_prefixed_column_holds_each_string_after_the_prefix(strings, prefix):
    col = StringColumn(strings).prefixed(prefix)
    assert list(col) == [prefix + s for s in strings] and len(col) == len(strings)


@settings(max_examples=60, deadline=None)
@given(digests, st.data())
def test_a_digest_column_holds_the_keys_and_finds_them(keys, data):
    col = key_column(keys)
    assert isinstance(col, DigestColumn) or not keys
    assert list(col) == keys and col == keys
    idx = data.draw(st.lists(st.integers(0, max(0, len(keys) - 1)), max_size=20))
    if keys:
        assert list(col.take(idx)) == [keys[i] for i in idx]
    other = data.draw(digests)
    query = other + keys + ["not a digest", keys[0].upper() if keys else "x"]
    first = {k: i for i, k in reversed(list(enumerate(keys)))}
    assert col.positions(query).tolist() == [first.get(k, -1) for k in query]
    for same in (keys, keys + keys[:3]):  # the column itself: distinct, or repeating
        col = key_column(same)
        assert col.positions(key_column(same)).tolist() == [first[k] for k in same]


@pytest.mark.parametrize("count", [0, 1, 5, 6, 23])
def test_a_digest_column_lists_its_keys_chunk_by_chunk(count, monkeypatch):
    """Listed a chunk at a time (5 here): every key once, in order, across chunks' seams."""
    monkeypatch.setattr(columns, "CHUNK", 5)
    keys = [f"{i * 2654435761:032x}" for i in range(count)]
    col = DigestColumn(keys)
    assert list(col) == keys and list(col.take(range(count)[::-2])) == keys[::-2]


nan = b"\1\0\0\0\0\0\xf0\x7f"  # a signalling NaN as a float64: its bits are kept
halves = st.sampled_from([b"\0" * 8, b"\1" * 8, b"\xff" * 8, bytes(range(8)), nan])
colliding = st.lists(st.tuples(halves, halves).map(lambda t: (t[0] + t[1]).hex()), max_size=40)


@pytest.mark.parametrize("bucket", ["buckets", "crowded: equal hashes"])
@pytest.mark.parametrize("hashed", ["mixed", "first half only"])
def test_digests_whose_hashes_collide_are_told_apart(hashed, bucket, monkeypatch):
    """The look-up searches on a 64-bit hash of each digest, then compares the whole:
    with a hash that collides for every key sharing a first half, keys (and repeated
    keys) still map to their first position, walking the hash's bucket or (a bucket
    crowded by repeats) the heads equal to it; the queries looked up 3 at a time."""
    from hotset.storage import columns

    monkeypatch.setattr(columns, "LOOKUP_BLOCK", 3)
    if bucket != "buckets":
        monkeypatch.setattr(columns, "MAX_BUCKET", 0)
    if hashed != "mixed":
        monkeypatch.setattr(columns, "_mix", lambda words: words[:, 0].copy())

    @settings(max_examples=100, deadline=None)
    @given(colliding, colliding)
    def check(keys, other):
        col = key_column(keys)
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        query = other + keys
        want = [first.get(k, -1) for k in query]
        assert col.positions(query).tolist() == want
        assert col.positions(key_column(query)).tolist() == want
        first_pos, number = col.numbered()  # registration's numbering, hashes colliding
        seen = list(dict.fromkeys(keys))
        assert [keys[i] for i in first_pos] == seen and [seen[k] for k in number] == keys

    check()


@settings(max_examples=60, deadline=None)
@given(digests, digests)
def test_columns_concatenate_and_name_their_distinct_keys(a, b):
    """What the service's key index is built of: packed look-ups of a column in a column,
    first occurrences, and concatenation, packed when both are digests."""
    ca, cb = key_column(a), key_column(b)
    both = concat(ca, cb)
    assert list(both) == a + b and isinstance(both, DigestColumn)
    first = {k: i for i, k in reversed(list(enumerate(a + b)))}
    assert both.positions(cb).tolist() == [first[k] for k in b]  # column against column
    assert both.distinct().tolist() == sorted(first.values())
    mixed = concat(ca, StringColumn(["k1", "k1"]))
    assert isinstance(mixed, StringColumn) and list(mixed) == [*a, "k1", "k1"]
    assert mixed.distinct().tolist() == sorted({k: i for i, k in reversed(list(
        enumerate(list(mixed))))}.values())  # fmt: skip
    for col, keys in ((both, a + b), (mixed, list(mixed))):  # what registration numbers by
        first, number = col.numbered()
        seen = list(dict.fromkeys(keys))  # distinct keys in order of first sight
        assert [keys[i] for i in first] == seen
        assert [seen[k] for k in number] == keys


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.text(max_size=6), max_size=5), max_size=5),
       st.lists(st.lists(st.integers(0, 2**64), max_size=4), max_size=4))
def test_many_columns_join_into_one_without_a_string_per_value(texts, numbers):
    """A tar set's manifest is its shards' columns joined (``concat(*columns)``): text
    columns into one buffer, digest columns into one array, each value in its place."""
    joined = concat(*(StringColumn(t) for t in texts))
    assert list(joined) == [v for t in texts for v in t]
    assert isinstance(joined, StringColumn) or not any(texts)
    keys = [[f"{k:032x}" for k in ks] for ks in numbers]
    packed = concat(*(DigestColumn(ks) for ks in keys))
    assert isinstance(packed, DigestColumn) and list(packed) == [k for ks in keys for k in ks]


def test_a_key_that_is_not_a_digest_is_named():
    good = [f"{i:032x}" for i in range(3)]
    for bad in ("AB" * 16, "ab" * 15, "ab" * 17, "zz" * 16, " " + "a" * 31):
        with pytest.raises(ConfigError, match=r"key 2 .* is not a hex digest"):
            DigestColumn([*good[:2], bad])
    assert isinstance(key_column(["k1", "k2"]), StringColumn)  # keys of another kind


def test_a_manifest_costs_a_few_bytes_per_id_and_survives_json():
    n = 20_000
    paths = [f"train/n{i % 1000:08d}/{i:08d}.JPEG" for i in range(n)]
    keys = [f"{i * 7919:032x}" for i in range(n)]
    sizes, labels = np.arange(n) + 1000, np.arange(n) % 1000
    tracemalloc.start()
    m = Manifest(iter(paths), iter(keys), sizes, labels)
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # 16 B key + 28 B text + 8 B offset + (sizes, labels shared): ~52, the lists ~190
    assert kept / n < 64
    back = Manifest.from_json(m.to_json())
    assert back.paths == paths and back.keys == keys and (back.sizes == sizes).all()
    sub = m.take(np.array([5, 3]))
    assert list(sub.paths) == [paths[5], paths[3]] and list(sub.keys) == [keys[5], keys[3]]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=200),
    st.sampled_from([0, 1, 20, 40, 62]),
)
def test_the_key_index_orders_hashes_as_a_stable_sort(pairs, low):
    """The key index's order of the 64-bit hashes is ``np.argsort(kind="stable")``'s:
    hashes equal, or equal only in their top bits (a few values in the top bits, others
    ``low`` bits below them), in order of the whole hash, then of position."""
    from hotset.storage.columns import _hash_order

    h = np.array([top << 62 | (x << low) for top, x in pairs], np.uint64)
    assert np.array_equal(_hash_order(h), np.argsort(h, kind="stable"))


@settings(max_examples=30, deadline=None)
@given(digests, st.integers(0, 70_000))
def test_a_datasets_namespace_is_the_same_from_packed_keys(keys, more):
    """The store's prefix for a dataset (entries cached by an earlier run stay found)
    is the same whether its keys are packed digests or strings, past a block of them."""
    from hotset.build import dataset_namespace

    raw = np.random.default_rng(more).integers(0, 256, (more, 16), np.uint8)
    keys = keys + [r.tobytes().hex() for r in raw]
    assert dataset_namespace(DigestColumn(keys)) == dataset_namespace(keys)
