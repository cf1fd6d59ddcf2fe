"""Nothing lost, nobody else in: a loader removes only what hotset made, a named store
outlives every user but its last, two jobs on one server keep apart, a capacity the
backend cannot hold is refused before anything is made, and paths other users control
(links, FIFOs, open modes, files of theirs) are refused instead of followed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from hotset import ConfigError, MemoryStore, SharedStore, decode_image, make_loader, to_tensor
from hotset.storage import FileStorage
from hotset.store.lease import LOCK, STORE_PREFIX, private_base, remove_unused

OTHER_UID = 54321  # a user that is not us (the tests that chown need root)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def epoch_checked(loader, epoch: int) -> int:
    """One epoch; every served sample compared with a direct read of its file. Returns
    the samples served."""
    loader.set_epoch(epoch)
    storage, n = loader.dataset.storage, 0
    for x, _, ids in loader:
        expected = [to_tensor(decode_image(storage.read(i))) for i in ids.tolist()]
        assert torch.equal(x, torch.stack(expected))
        n += len(ids)
    return n


def private_stores() -> set[str]:
    """The user's stores now, those of killed jobs (other tests') removed first."""
    remove_unused(private_base())
    return {n for n in os.listdir(private_base()) if n.startswith(STORE_PREFIX)}


def test_a_directory_of_the_users_keeps_everything_it_held(fmnist_dir, tmp_path):
    """``shared:///some/dir`` on a directory that exists: close() removes hotset's files
    and nothing else (the directory stays, with the user's file in it)."""
    storage = FileStorage(str(fmnist_dir / "train"))
    mine = tmp_path / "x"
    mine.mkdir(mode=0o755)
    (mine / "precious.txt").write_text("keep")
    loader = make_loader(storage, batch_size=100, cache_fraction=0.2,
                         store=f"shared://{mine}", num_workers=2)  # fmt: skip
    epoch_checked(loader, 0)
    assert {"data.mdb", "lock.mdb", LOCK} <= set(os.listdir(mine))
    loader.close()
    assert os.listdir(mine) == ["precious.txt"] and (mine / "precious.txt").read_text() == "keep"
    # the exit finaliser of a loader never closed follows the same rule
    script = textwrap.dedent(f"""
        from hotset import FileStorage, make_loader
        loader = make_loader(FileStorage({str(fmnist_dir / "train")!r}), batch_size=100,
                             cache_fraction=0.2, store="shared://{mine}", num_workers=0)
        loader.set_epoch(0)
        for _ in loader:
            pass
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert os.listdir(mine) == ["precious.txt"]


def test_a_directory_hotset_made_goes_with_its_last_user_only_if_empty(fmnist_dir, tmp_path):
    storage = FileStorage(str(fmnist_dir / "train"))
    made = tmp_path / "made"
    loader = make_loader(storage, batch_size=100, cache_fraction=0.2,
                         store=f"shared://{made}", num_workers=0)  # fmt: skip
    epoch_checked(loader, 0)
    (made / "notes.txt").write_text("the user put this here meanwhile")
    loader.close()
    assert os.listdir(made) == ["notes.txt"]  # hotset's files gone, the user's kept
    fresh = tmp_path / "fresh"
    loader = make_loader(storage, batch_size=100, cache_fraction=0.2,
                         store=f"shared://{fresh}", num_workers=2)  # fmt: skip
    epoch_checked(loader, 0)
    loader.close()
    assert not fresh.exists()


def test_two_jobs_on_one_named_store_the_last_out_cleans(fmnist_dir, tmp_path):
    """The first job to close leaves the store (and its own entries only); the second
    goes on with workers, hits, and no store failure; the last out removes it. A second
    live job on the same dataset is refused (two planners of the same entries)."""
    train, test = FileStorage(str(fmnist_dir / "train")), FileStorage(str(fmnist_dir / "test"))
    spec = f"shared://{tmp_path}/team"
    a = make_loader(train, batch_size=100, capacity_bytes=200_000, store=spec, num_workers=2,
                    policy="lru")  # (it evicts: the store has room for b's)
    b = make_loader(test, batch_size=100, capacity_bytes=200_000, store=spec, num_workers=2,
                    policy="minio")  # fmt: skip
    with pytest.raises(ConfigError, match="another job already trains on this dataset"):
        make_loader(train, batch_size=100, capacity_bytes=200_000, store=spec, num_workers=0)
    epoch_checked(a, 0)
    epoch_checked(b, 0)
    a_keys = set(a.dataset.store.list_keys())
    assert a_keys and a.dataset.store.inner.path == b.dataset.store.inner.path
    a.close()
    assert os.path.isdir(f"{tmp_path}/team")
    held = b.dataset.store.inner.list_keys()
    assert not any(k.startswith(a.dataset.store.prefix) for k in held)  # a's entries left
    assert held  # b's stayed
    before = b.counters()
    for e in (1, 2):
        assert epoch_checked(b, e) == len(test)
    after = b.counters()
    assert after["hits"] > before["hits"] and after["store_failures"] == 0
    b.close()
    assert not os.path.exists(f"{tmp_path}/team")
    # the same dataset again, now that its first job is gone: accepted
    make_loader(train, batch_size=100, capacity_bytes=200_000, store=spec, num_workers=0).close()


def _a_job_whose_store_goes(fmnist_dir, path):
    """A loader of 2 workers on the named store ``path``, one epoch checked, then the
    store's directory removed under it: (storage, path, loader)."""
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = make_loader(storage, batch_size=100, cache_fraction=0.3,
                         store=f"shared://{path}", num_workers=2)  # fmt: skip
    epoch_checked(loader, 0)
    shutil.rmtree(path)
    return storage, path, loader


def test_a_store_removed_under_a_running_loader_is_absorbed(fmnist_dir, tmp_path):
    """A tmpfs cleanup removes the store's directory mid-run: every sample is still served
    right (from storage), the failures are counted, listings do not escape, and close()
    does not touch a new store made at the same path meanwhile."""
    storage, path, loader = _a_job_whose_store_goes(fmnist_dir, tmp_path / "swept")
    for e in (1, 2):
        assert epoch_checked(loader, e) == len(storage)
    assert loader.counters()["store_failures"] > 0
    other = SharedStore(10_000, path=str(path))  # another job makes a store there now
    other.put_many({"theirs": b"x" * 10})
    loader.close()
    assert other.get_many(["theirs"]) == [b"x" * 10] and (path / "data.mdb").exists()
    other.close(destroy=True)
    assert not path.exists()


def test_a_store_directory_replaced_under_a_running_loader_is_not_used(fmnist_dir, tmp_path):
    """``rm -rf S; mkdir -m700 S`` between epochs: the workers (new processes) and the
    planner notice the store is not the one the job opened (its directory and the token
    in its meta), serve every sample right from storage, count it, write nothing into the
    new directory, and close cleanly; a store another job then makes there is its own."""
    storage, path, loader = _a_job_whose_store_goes(fmnist_dir, tmp_path / "replaced")
    path.mkdir(mode=0o700)
    for e in (1, 2):
        assert epoch_checked(loader, e) == len(storage)
        assert os.listdir(path) == []  # no LMDB made in a directory that is not the store
    assert loader.counters()["store_failures"] > 0
    other = SharedStore(10_000, path=str(path))
    other.put_many({"theirs": b"x" * 10})
    loader.close()
    assert other.get_many(["theirs"]) == [b"x" * 10]
    other.close(destroy=True)


def test_two_jobs_on_one_redis_url_keep_their_entries_and_budgets(fmnist_dir, redis_server):
    storage = FileStorage(str(fmnist_dir / "train"))
    a = make_loader(storage, batch_size=100, policy="minio", cache_fraction=0.3,
                    store=redis_server.url, num_workers=2)  # fmt: skip
    b = make_loader(storage, batch_size=100, policy="minio", cache_fraction=0.3,
                    store=redis_server.url, num_workers=2)  # fmt: skip
    epoch_checked(a, 0)
    epoch_checked(b, 0)
    assert all(ld.counters()["internal"]["refused_puts"] == 0 for ld in (a, b))
    b_keys = set(b.dataset.store.list_keys())
    assert len(b_keys) > 0.25 * len(storage)
    a.close()
    assert set(b.dataset.store.list_keys()) == b_keys  # a's close touched nothing of b's
    epoch_checked(b, 1)
    assert b.counters()["hits"] >= len(b_keys)
    b.close()
    import redis

    assert redis.Redis.from_url(redis_server.url).keys("hotset*") == []  # both cleaned


def test_a_second_live_job_on_one_named_redis_namespace_is_refused(fmnist_dir, redis_server):
    """As on a named LMDB store: the namespace is claimed on the server while its job
    lives; another job on the same dataset and namespace is refused, before and after."""
    storage = FileStorage(str(fmnist_dir / "train"))
    url = redis_server.url + "?namespace=team"
    a = make_loader(storage, batch_size=100, cache_fraction=0.3, store=url, num_workers=0)
    with pytest.raises(ConfigError, match="another job already trains .* namespace 'team'"):
        make_loader(storage, batch_size=100, cache_fraction=0.3, store=url, num_workers=0)
    epoch_checked(a, 0)
    a.close()
    b = make_loader(storage, batch_size=100, cache_fraction=0.3, store=url, num_workers=0)
    epoch_checked(b, 0)
    b.dataset.store.clear()
    b.close()


def test_a_killed_jobs_redis_namespace_is_cleared_by_the_next_one(fmnist_dir, redis_server):
    """A job killed (-9) leaves its drawn namespace on the server; the next loader that
    draws one on the same server clears it (its lock file's holder is gone)."""
    import redis

    script = textwrap.dedent(f"""
        import os, signal
        from hotset import FileStorage, make_loader
        loader = make_loader(FileStorage({str(fmnist_dir / "train")!r}), batch_size=100,
                             policy="minio", cache_fraction=0.3, store={redis_server.url!r},
                             num_workers=0)
        loader.set_epoch(0)
        for _ in loader:
            pass
        print(loader.dataset.store.inner.namespace, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    dead = out.stdout.strip()
    server = redis.Redis.from_url(redis_server.url)
    assert dead and len(server.keys(f"hotset:{{{dead}}}:*")) > 100  # left behind
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = make_loader(storage, batch_size=100, cache_fraction=0.3, store=redis_server.url,
                         num_workers=0)  # fmt: skip
    assert server.keys(f"hotset:{{{dead}}}:*") == []  # cleared at the next start
    loader.close()
    assert server.keys("hotset:*") == []


def test_a_named_redis_namespace_outlives_close_but_not_the_jobs_entries(redis_server):
    from hotset.store import make_store

    with pytest.raises(ConfigError, match="namespace"):
        make_store(redis_server.url + "?namespace=a*b", 100)
    s = make_store(redis_server.url + "?namespace=team", 1000)
    assert s.namespace == "team" and not s.owns_namespace
    s.put_many({"k": b"v"})
    s.close(destroy=True)  # the user's namespace: kept
    t = make_store(s.spec, 1000)
    assert t.get_many(["k"]) == [b"v"]
    t.clear()
    t.close()


@pytest.mark.serial
def test_a_capacity_the_backend_cannot_hold_is_refused_up_front(
    fmnist_dir, tmp_path, redis_server
):
    import redis

    storage = FileStorage(str(fmnist_dir / "train"))
    with pytest.raises(ConfigError, match="capacity_bytes=100000000000000 .* redis store"):
        make_loader(storage, batch_size=10, capacity_bytes=10**14, store=redis_server.url)
    assert redis.Redis.from_url(redis_server.url).keys("hotset*") == []
    before = private_stores()
    for store in ("shared", f"shared://{tmp_path}/big"):
        with pytest.raises(ConfigError, match="capacity_bytes=100000000000000"):
            make_loader(storage, batch_size=10, capacity_bytes=10**14, store=store)
    assert private_stores() == before and not os.path.exists(f"{tmp_path}/big")
    with pytest.raises(ConfigError, match="capacity_bytes=.* machine's memory"):
        MemoryStore(10**16)


def test_stores_whose_users_are_gone_are_removed_and_fifos_never_opened(tmp_path):
    """A leftover store (its process killed) is removed at the next start; a FIFO or a
    link where a lock file should be is skipped, never opened for reading or waited on."""
    base = private_base()
    left = SharedStore(1000)
    path = left.path
    os.close(left.lease._fd)  # as a kill -9 leaves it: nobody holds it, the files stay
    left.lease._fd = None
    trap = os.path.join(base, STORE_PREFIX + "trap")
    os.makedirs(trap, exist_ok=True)
    if not os.path.exists(os.path.join(trap, LOCK)):
        os.mkfifo(os.path.join(trap, LOCK))
    try:
        assert path in remove_unused(base) and not os.path.exists(path)
        assert os.path.exists(trap)  # not a store of ours: left alone, and no hang
        SharedStore(1000).close(destroy=True)  # a new store starts past it too
    finally:
        shutil.rmtree(trap)


def test_the_old_fifo_trap_in_dev_shm_no_longer_blocks_anyone(fmnist_dir, tmp_path):
    """Another user's ``/dev/shm/hotset-store-zz/owner`` FIFO blocked every start forever."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    if shm is None:
        pytest.skip("no /dev/shm")
    trap = os.path.join(shm, "hotset-store-zz")
    os.makedirs(trap, exist_ok=True)
    if not os.path.exists(os.path.join(trap, "owner")):
        os.mkfifo(os.path.join(trap, "owner"))
    try:
        script = textwrap.dedent(f"""
            from hotset import FileStorage, make_loader
            make_loader(FileStorage({str(fmnist_dir / "train")!r}), batch_size=100,
                        cache_fraction=0.1, num_workers=0).close()
        """)
        subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    finally:
        shutil.rmtree(trap)


def test_store_paths_other_users_control_are_refused(tmp_path):
    """A directory others can write, a link another user made, an LMDB hotset did not
    make, store files others can open, and a FIFO as the lock file: each refused with a
    clear error, nothing written into it."""
    open_dir = tmp_path / "team-cache"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(ConfigError, match="open to other users"):
        SharedStore(1000, path=str(open_dir))
    assert os.listdir(open_dir) == []

    foreign = tmp_path / "their-lmdb"
    foreign.mkdir(mode=0o700)
    (foreign / "data.mdb").write_bytes(b"an LMDB of another program")
    with pytest.raises(ConfigError, match="did not make"):
        SharedStore(1000, path=str(foreign))
    assert sorted(os.listdir(foreign)) == ["data.mdb"]

    readable = tmp_path / "readable"
    s = SharedStore(1000, path=str(readable))
    s.close()  # left without removing: its files stay
    os.chmod(readable / "data.mdb", 0o666)
    with pytest.raises(ConfigError, match="can be opened by other users"):
        SharedStore(1000, path=str(readable))

    fifo = tmp_path / "fifo"
    fifo.mkdir(mode=0o700)
    os.mkfifo(fifo / LOCK)
    with pytest.raises(ConfigError, match="not a regular file"):
        SharedStore(1000, path=str(fifo))  # refused at once: never blocks on the FIFO


@as_root
def test_a_directory_or_link_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigError, match="not a directory of yours"):
        SharedStore(1000, path=str(theirs))
    assert os.listdir(theirs) == []
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(mine)
    os.lchown(link, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigError, match="is a link user 54321 owns"):
        SharedStore(1000, path=str(link))
    assert os.listdir(mine) == []


@as_root
def test_a_store_below_a_directory_or_link_another_user_controls_is_refused(tmp_path):
    """As OpenSSH's StrictModes: every directory above the store, and every link on the
    way, must be root's or ours and writable by no one else (a sticky one excepted)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    mine = theirs / "mine"  # ours, but its parent's owner could swap it
    mine.mkdir(mode=0o700)
    with pytest.raises(ConfigError, match=rf"{theirs}, above .* belongs to user {OTHER_UID}"):
        SharedStore(1000, path=str(mine / "store"))
    assert os.listdir(mine) == []
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    hop = tmp_path / "hop"
    hop.symlink_to(real)
    os.lchown(hop, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigError, match=rf"{hop} \(on the way to .*\) is a link user"):
        SharedStore(1000, path=str(hop / "store"))
    assert os.listdir(real) == []
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o775)
    with pytest.raises(ConfigError, match="is writable by others"):
        SharedStore(1000, path=str(team / "store"))
    shared_tmp = tmp_path / "tmp"  # like /tmp: anyone may create, no one may swap
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)
    SharedStore(1000, path=str(shared_tmp / "store")).close(destroy=True)


@as_root
def test_a_squatted_default_directory_is_left_and_a_private_one_used(
    fmnist_dir, tmp_path, monkeypatch, caplog
):
    """Another user made the default directory first (``mkdir -m777 ROOT/hotset-UID``):
    it is refused and left alone, a private directory of ours is used instead, said
    once; with ``XDG_RUNTIME_DIR`` set, there."""
    import logging

    import hotset.store.lease as lease

    root = tmp_path / "shm"
    root.mkdir()
    root.chmod(0o1777)
    squat = root / f"hotset-{os.geteuid()}"
    squat.mkdir()
    os.chown(squat, OTHER_UID, OTHER_UID)
    squat.chmod(0o777)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with caplog.at_level(logging.WARNING, logger="hotset.store.lease"):
        base = private_base(str(root))
        assert private_base(str(root)) == base != str(squat)
    assert len([r for r in caplog.records if "instead" in r.getMessage()]) == 1
    assert os.stat(base).st_uid == os.geteuid() and os.stat(base).st_mode & 0o777 == 0o700
    assert os.listdir(squat) == [] and os.stat(squat).st_uid == OTHER_UID
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(lease, "_INSTEAD", {})
    assert private_base(str(root)) == str(runtime / "hotset-stores")
    # a default store of a loader goes there, and works
    monkeypatch.setattr(lease, "private_base", lambda: private_base(str(root)))
    loader = make_loader(FileStorage(str(fmnist_dir / "train")), batch_size=100,
                         cache_fraction=0.1, num_workers=0)  # fmt: skip
    epoch_checked(loader, 0)
    assert loader.dataset.store.inner.path.startswith(str(runtime / "hotset-stores"))
    loader.close()


# -- the streamed first epoch's spool and iCACHE's packages: files of the user's own ------


@as_root
def test_a_spool_where_another_user_could_swap_it_is_refused(tmp_path, monkeypatch):
    """The streamed first epoch's spool is never made where another user could swap it
    for links the job would write shards through."""
    import tempfile

    from hotset.storage.tar_spool import ShardSpool
    from test_sources import _images, _write_tar

    _write_tar(tmp_path / "shard-000.tar", _images(4), 0)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)  # writable by all, not sticky
    os.chown(theirs, OTHER_UID, OTHER_UID)
    monkeypatch.setattr(tempfile, "tempdir", str(theirs))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with pytest.raises(ConfigError, match="another user could replace"):
        ShardSpool(str(tmp_path / "shard-000.tar"))
    with pytest.raises(ConfigError, match="not a directory of yours|open to other users"):
        ShardSpool(str(tmp_path / "shard-000.tar"), directory=str(theirs))


def test_a_killed_jobs_spool_is_removed_by_the_next(tmp_path, monkeypatch):
    from hotset.store.lease import private_temp_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # (TMPDIR read again)
    holder = subprocess.Popen(
        [sys.executable, "-c", "from hotset.store.lease import private_temp_dir; "
         "print(private_temp_dir('hotset-spool-')[0], flush=True); import time; time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    left = holder.stdout.readline().strip()
    assert os.path.isdir(left) and left.startswith(str(tmp_path))
    assert stat_mode(os.path.dirname(left)) == 0o700
    mine, fd = private_temp_dir("hotset-spool-")
    assert os.path.isdir(left)  # its process lives: kept
    holder.kill()
    holder.wait()
    again, fd2 = private_temp_dir("hotset-spool-")
    assert not os.path.exists(left) and os.path.isdir(mine)  # the dead one's, not ours
    for f in (fd, fd2):
        os.close(f)


def stat_mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_package_dir_follows_the_stores_rules_and_its_files_are_private(tmp_path, fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    for bad, match in ((tmp_path / "link", "not a directory of yours"),
                       (tmp_path / "open", "open to other users")):  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            make_loader(storage, batch_size=40, system="icache", cache_fraction=0.2,
                        num_workers=0, store="memory", package_dir=str(bad))  # fmt: skip
    old = os.umask(0o022)
    try:
        packages = tmp_path / "packages"
        with make_loader(storage, batch_size=40, system="icache", cache_fraction=0.2,
                         num_workers=0, store="memory", package_dir=str(packages),
                         policy_options={"package_bytes": 20_000}) as loader:  # fmt: skip
            for epoch in range(3):
                loader.set_epoch(epoch)
                for _, _, ids in loader:
                    loader.feedback(ids, torch.rand(len(ids)))
                modes = []
                for p in packages.iterdir():  # (the packager drops old ones meanwhile)
                    try:
                        modes.append(stat_mode(p))
                    except FileNotFoundError:
                        continue
    finally:
        os.umask(old)
    assert stat_mode(packages) == 0o700
    assert modes and set(modes) == {0o600}


def test_a_job_restarted_at_once_waits_for_its_dead_predecessors_workers(tmp_path):
    """A job killed (-9) whose DataLoader workers (forked: they hold its claim) are still
    exiting: its restart, at once, waits for them instead of being refused; a live job's
    claim is refused at once."""
    from hotset.store.lease import claim

    (tmp_path / "s").mkdir(mode=0o700)
    job = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time
        from hotset.store.lease import claim
        claim({str(tmp_path / "s")!r}, "data")
        if os.fork() == 0:  # a worker: it holds the claim until it exits, 2 s later
            time.sleep(2)
            os._exit(0)
        print("ready", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert job.stdout.readline().strip() == "ready"
    with pytest.raises(ConfigError, match="another job already trains"):
        claim(str(tmp_path / "s"), "data")  # the job lives
    job.kill()
    job.wait()
    release = claim(str(tmp_path / "s"), "data")  # its worker exits: then it is ours
    release()
