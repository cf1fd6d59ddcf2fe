"""Resume at every boundary: a state taken at any point (before the first batch, between
batches, after an epoch's last batch, after ``set_epoch``, after an abandoned epoch)
resumes to exactly what an uninterrupted run would still serve; a state that does not fit
the loader is refused, naming the difference."""

from __future__ import annotations

import pytest

from hotset import ConfigError, MemoryStore, SharedStore
from hotset.storage import FileStorage
from test_truth import _loader, killed_mid_epoch, synthetic_feedback, through_torch_save

EPOCHS = 3


def run(loader, epochs, cut=None, abandon=None):
    """Served ids per epoch; ``cut = (epoch, batches)``: stop there, returning the state
    saved after that many batches of that epoch (-1: right after its ``set_epoch``;
    ``None``: after its loop ended); ``abandon = (epoch, batches)``: that epoch is left
    after that many batches."""
    served = {}

    def save():
        return through_torch_save(loader.state_dict())

    for epoch in epochs:
        loader.set_epoch(epoch)
        if cut == (epoch, -1):
            return served, save()
        served[epoch] = []
        for n, (_, y, ids) in enumerate(loader):
            synthetic_feedback(loader, ids, y, epoch)
            served[epoch] += ids.tolist()
            if cut == (epoch, n + 1):
                return served, save()
            if abandon == (epoch, n + 1):
                break
        if cut == (epoch, None):
            return served, save()
    return served, None


WHERE = ["before the first batch", "between batches", "after the last batch",
         "after set_epoch", "after an abandoned epoch"]  # fmt: skip
#: every point for one system of each kind; the two hardest points for every other
#: system; with two DataLoader workers (whose plans are made ahead, and admit), also
#: where those plans admit, substitute and load packages
CASES = [
    *[(name, where, 0) for name in ("lru", "shade", "icache") for where in WHERE],
    *[(name, where, 0) for name in ("minio", "belady", "shade+", "icache+", "spider", "spider+")
      for where in ("between batches", "after an abandoned epoch")],
    *[(name, "between batches", 2) for name in ("lru", "minio")],
    *[(name, where, 2) for name in ("shade", "icache", "spider")
      for where in ("between batches", "while the plans admit")],
]  # fmt: skip


@pytest.mark.parametrize("name,where,workers", CASES)
def test_a_state_taken_anywhere_resumes_to_what_is_left(fmnist_dir, name, where, workers):
    """The run stops at the cut with its store intact (as a killed job leaves a named
    store); a new loader on that store loads the state and serves exactly what the
    uninterrupted run served from there, epoch after epoch (SHADE's orders included,
    which depend on its scores and on what the cache holds, and iCACHE's, whose IIS
    selects from the losses its board keeps as its scores)."""
    storage = FileStorage(str(fmnist_dir / "train"))
    abandon = (1, 4) if where == "after an abandoned epoch" else None
    cut = {
        "before the first batch": (0, -1),
        "between batches": (1, 7),
        "while the plans admit": (1, 18),  # past SHADE's hits-first batches
        "after the last batch": (1, None),
        "after set_epoch": (2, -1),
        "after an abandoned epoch": (2, -1),
    }[where]
    capacity = int(0.2 * storage.manifest.total_bytes)
    # the stores outlive the loaders: the caller's (shared by the workers where they run)
    first, kept = ((MemoryStore(capacity), MemoryStore(capacity)) if not workers
                   else (SharedStore(capacity), SharedStore(capacity)))  # fmt: skip
    ref, _ = run(_loader(storage, name, workers, store=first), range(EPOCHS), abandon=abandon)
    _, state = run(_loader(storage, name, workers, store=kept), range(EPOCHS), cut, abandon)

    epoch, batches = cut
    resumed = _loader(storage, name, workers, store=kept)
    resumed.load_state_dict(state)
    if batches is None:  # after the last batch: the next epoch is due
        assert resumed.epoch == epoch + 1
        epoch, batches = epoch + 1, 0
    announced = len(resumed)  # what is left of the epoch, as a resumed loader says it
    rest, _ = run(resumed, range(epoch, EPOCHS))
    assert announced == -(-len(rest[epoch]) // 40)
    if not workers:  # (with workers, plans made ahead may have written or not: reconciled)
        assert resumed.counters()["internal"]["sync_fixes"] == 0  # it adopted the store as it was
    resumed.close()
    for store in (first, kept):
        store.close(destroy=True)
    assert rest[epoch] == ref[epoch][max(batches, 0) * 40 :]  # nothing skipped or repeated
    for e in range(epoch + 1, EPOCHS):
        assert rest[e] == ref[e]


def test_a_state_that_does_not_fit_the_loader_is_refused_naming_the_difference(fmnist_dir):
    train, test = FileStorage(str(fmnist_dir / "train")), FileStorage(str(fmnist_dir / "test"))
    loader = _loader(train, "lru", 0, store="memory")
    _, state = run(loader, [0], cut=(0, 3))
    loader.close()
    from hotset import make_loader

    others = {
        "batch_size": dict(storage=train, batch_size=50),
        "dataset": dict(storage=test, batch_size=40),
        "policy": dict(storage=train, batch_size=40, policy="minio"),
        "seed": dict(storage=train, batch_size=40, seed=4),
        "sampler": dict(storage=train, batch_size=40, sampler="shade"),
    }
    for field, kwargs in others.items():
        kwargs.setdefault("seed", 3)
        other = make_loader(kwargs.pop("storage"), cache_fraction=0.2, store="memory",
                            num_workers=0, **kwargs)  # fmt: skip
        with pytest.raises(ConfigError, match=f"{field}: saved"):
            other.load_state_dict(state)
        other.close()
    old = dict(state, fits={**state["fits"], "hotset": "0.0.1"})
    same = _loader(train, "lru", 0, store="memory")
    with pytest.raises(ConfigError, match="hotset: saved '0.0.1'"):
        same.load_state_dict(old)
    same.load_state_dict(state)  # the same arguments: accepted
    same.close()


def test_a_job_killed_on_a_named_redis_namespace_resumes_warm(fmnist_dir, redis_server, tmp_path):
    """The README's promise: a store that survives the crash (here a named Redis
    namespace) gives the resumed job its cache back: it adopts what its plan holds."""
    storage = FileStorage(str(fmnist_dir / "train"))
    spec = redis_server.url + "?namespace=resume-test"
    state = killed_mid_epoch(fmnist_dir / "train", "minio", spec, tmp_path, 5, 5)
    resumed = _loader(storage, "minio", 0, store=spec)
    resumed.load_state_dict(state)
    rest, _ = run(resumed, [1])
    c = resumed.counters()
    assert len(rest[1]) == len(storage) - 6 * 40 and c["hits"] > 0.15 * len(rest[1])  # warm
    resumed.close()


def test_a_state_is_plain_data_and_names_no_class_but_hotsets():
    """The state a loader saves is built of containers, scalars, strings and tensors
    (torch's ``weights_only=True`` loads it, as the resume tests above do); a value of
    another type is refused at save, naming where it is, and a tag naming a class hotset
    does not write is refused at load."""
    import random
    from array import array
    from collections import OrderedDict, deque

    import numpy as np

    from hotset.checkpoint import from_safe, to_safe
    from hotset.policy.keyed_heap import KeyedHeap

    heap = KeyedHeap(8)
    heap.push(3, 5)
    state = {
        "a": np.arange(6, dtype=np.uint32).reshape(2, 3), "b": array("q", [1, -2]),
        "c": {1, 2}, "d": random.Random(4), "e": heap, "f": np.empty(0), 7: (1, "x"),
        "g": [b"", b"ab"],
        # a recency order and a CLOCK's ring keep their kind (a policy's own may hold them)
        "h": OrderedDict([(5, 1), (2, 0)]), "i": deque([4, 1], maxlen=3),
    }  # fmt: skip
    safe = through_torch_save(to_safe(state))
    back = from_safe(safe)
    assert np.array_equal(back["a"], state["a"]) and back["a"].dtype == np.uint32
    assert back["a"].flags.writeable and back["b"] == state["b"] and back["c"] == {1, 2}
    assert back["d"].random() == random.Random(4).random()
    assert back["e"].members().tolist() == [3] and back["e"].live[3] == 5 and len(back["e"]) == 1
    assert back[7] == (1, "x") and back["f"].size == 0
    assert back["g"] == [b"", b"ab"]
    assert type(back["h"]) is OrderedDict and list(back["h"].items()) == [(5, 1), (2, 0)]
    assert type(back["i"]) is deque and list(back["i"]) == [4, 1] and back["i"].maxlen == 3
    with pytest.raises(ConfigError, match=r"state\.g: a builtins.object cannot be saved"):
        to_safe({"g": object()})
    crafted = {"x": {"__hotset__": "object", "class": "Popen", "vars": {}}}
    with pytest.raises(ConfigError, match="not one hotset writes"):
        from_safe(crafted)


def test_a_heap_saved_as_a_dict_of_keys_loads_and_a_crafted_one_is_refused():
    """A ``KeyedHeap`` saved before its levels were an array (``live``: id -> key) loads
    with the same members and order; one whose members or levels are not ids and an int64
    column gets a ``ConfigError``, not a crash later."""
    from hotset.checkpoint import TAG, from_safe, to_safe
    from hotset.policy.keyed_heap import KeyedHeap

    def saved(**vars_):
        return {TAG: "object", "class": "KeyedHeap", "vars": to_safe(vars_)}

    keys = {5: 7 << 4 | 5, 2: 9 << 4 | 2, 11: 7 << 4 | 11}
    old = saved(bits=4, mask=15, heap=sorted(keys.values()), live=keys, _taken={})
    heap = from_safe(old)
    assert heap.members().tolist() == [2, 5, 11] and len(heap) == 3
    assert [heap.pop() for _ in range(3)] == [5, 11, 2]
    with pytest.raises(ConfigError, match="not ids below 2\\^4"):
        from_safe(saved(bits=4, mask=15, heap=[], live={99: 99}, _taken={}))
    with pytest.raises(ConfigError, match="levels are not a 1-D int32 or int64 array"):
        from_safe(saved(bits=4, mask=15, heap=[], levels=[1, 2], count=0, _taken={}))
    assert isinstance(from_safe(to_safe(KeyedHeap(9))), KeyedHeap)


COLD = [(name, where) for name in ("shade", "icache")
        for where in ("between batches", "after the last batch", "after set_epoch")]  # fmt: skip


@pytest.mark.parametrize("name,where", COLD)
def test_a_state_resumed_on_a_cold_store_serves_the_same_samples(fmnist_dir, name, where):
    """The killed job's cache is gone (the default store): the resumed loader reads the
    residents its policy holds back from the source, so its plans, which depend on what
    is cached (SHADE draws its cached important samples again), serve exactly what the
    uninterrupted run serves."""
    storage = FileStorage(str(fmnist_dir / "train"))
    cut = {"between batches": (1, 7), "after the last batch": (1, None),
           "after set_epoch": (2, -1)}[where]  # fmt: skip
    ref, _ = run(_loader(storage, name, 0, store="memory"), range(EPOCHS))
    _, state = run(_loader(storage, name, 0, store="memory"), range(EPOCHS), cut)
    epoch, batches = cut
    resumed = _loader(storage, name, 0, store="memory")  # empty: the cache did not survive
    resumed.load_state_dict(state)
    if batches is None:
        epoch, batches = epoch + 1, 0
    rest, _ = run(resumed, range(epoch, EPOCHS))
    assert resumed.counters()["internal"]["refilled"] > 0
    resumed.close()
    assert rest[epoch] == ref[epoch][max(batches, 0) * 40 :]
    for e in range(epoch + 1, EPOCHS):
        assert rest[e] == ref[e]


def saved_with_workers(fmnist_dir, name: str, cut: tuple) -> tuple:
    """The storage, the cache's capacity and a state saved at ``cut`` by a loader with two
    workers (whose prefetched plans the state holds)."""
    storage = FileStorage(str(fmnist_dir / "train"))
    capacity = int(0.2 * storage.manifest.total_bytes)
    loader = _loader(storage, name, 2, store=SharedStore(capacity))
    _, state = run(loader, range(EPOCHS), cut=cut)
    loader.close()
    return storage, capacity, state


def test_a_state_carries_no_sample_bytes_and_forged_ones_are_never_served(fmnist_dir):
    """A state's saved plans hold no package bytes (a resumed worker reads those samples
    from the source); a crafted state that carries some (it loads with
    ``weights_only=True``) puts none of them in the store: every sample served over the
    next epochs is the source's."""
    import numpy as np
    import torch

    from hotset.checkpoint import from_safe, to_safe

    storage, capacity, state = saved_with_workers(fmnist_dir, "icache", (1, 18))
    plain = from_safe(state)
    made = plain["planner"]["made"]
    assert made and any(p["loads"].size for p in made)  # (plans that load packages)
    assert all(not p["package"] for p in made)
    forged = np.zeros(28 * 28, np.uint8).tobytes()
    victims = np.arange(0, 550, 10, dtype=np.int64)  # 55 samples, any system would put
    for p in made:
        p["loads"] = np.union1d(p["loads"], victims)
        p["package"] = tuple((int(i), storage.keys[int(i)], forged) for i in victims)
    resumed = _loader(storage, "icache", 2, store=SharedStore(capacity))
    resumed.load_state_dict(through_torch_save(to_safe(plain)))
    for epoch in (1, 2):
        resumed.set_epoch(epoch)
        for x, _, ids in resumed:
            for k, i in enumerate(ids.tolist()):
                assert torch.equal(x[k], resumed.dataset[i][0]), f"sample {i}"
    resumed.close()


def test_an_edited_state_is_refused_by_name(fmnist_dir):
    """Edits that would skip, repeat or serve ids that do not exist are refused, naming
    what does not fit, before anything is used; a state of wrong types names the state."""
    import numpy as np

    from hotset.checkpoint import from_safe, to_safe

    storage, capacity, state = saved_with_workers(fmnist_dir, "lru", (1, 7))
    plain = from_safe(state)
    assert plain["planner"]["made"]  # (the workers' prefetched plans)

    def edited(change):
        s = from_safe(state)
        change(s["planner"])
        return through_torch_save(to_safe(s))

    def skip(p):  # a later start: the saved plans no longer follow it
        p["consumed"] += 2

    def drop(p):  # the first saved plan gone: its batch would be skipped
        p["made"] = p["made"][1:]

    def shift(p):  # a plan's ids swapped for others
        p["made"][0]["ids"] = p["made"][0]["ids"][::-1].copy()

    def out_of_range(p):
        p["order"] = p["order"].copy()
        p["order"][-1] = len(storage) + 5

    def floats(p):
        p["order"] = p["order"].astype(np.float64)

    def too_far(p):
        p["consumed"], p["made"] = 10_000, []

    cases = {skip: "is not batch", drop: "is not batch", shift: "is not batch",
             out_of_range: "outside the dataset", floats: "not a list of sample ids",
             too_far: "not a batch count"}  # fmt: skip
    store = SharedStore(capacity)
    for change, match in cases.items():
        fresh = _loader(storage, "lru", 2, store=store)
        with pytest.raises(ConfigError, match=match):
            fresh.load_state_dict(edited(change))
        fresh.close()
    fresh = _loader(storage, "lru", 0, store="memory")
    wrong = from_safe(state)
    wrong["planner"]["sampler"] = "not a state"
    with pytest.raises(ConfigError, match="this state cannot be loaded"):
        fresh.load_state_dict(through_torch_save(to_safe(wrong)))
    fresh.close()
    store.close(destroy=True)
