"""The service against other local users and bad clients (issue 14, first part): a private
default address, no silent take-over of a live address, no impostor socket, bounded and
checked messages, and a clear refusal of a 65th DSA job (test_service.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

import hotset
from hotset.errors import ConfigError
from hotset.service.address import default_address, runtime_dir
from hotset.service.messages import parse
from hotset.service.protocol import ProtocolError, decode, encode
from hotset.service.server import CacheService, start_service
from hotset.storage.columns import DigestColumn

OTHER = "hotset-test-other"


def _raw_request(address: str, frames: list[bytes], timeout_ms: int = 2000) -> list[bytes] | None:
    """One request on a fresh REQ socket: the reply's frames, or None without one."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    for opt, v in ((zmq.RCVTIMEO, timeout_ms), (zmq.SNDTIMEO, timeout_ms), (zmq.LINGER, 0)):
        sock.setsockopt(opt, v)
    sock.connect(address)
    try:
        sock.send_multipart(frames)
        return sock.recv_multipart()
    except zmq.Again:
        return None
    finally:
        sock.close(0)
        ctx.term()


@pytest.fixture
def running(tmp_path):
    address = f"ipc://{tmp_path}/svc.sock"
    proc = start_service(address, capacity_bytes=100_000, max_message_bytes=1 << 20)
    client = hotset.connect(address, timeout_s=20)
    yield address, proc, client
    client.close()
    proc.terminate()
    proc.join(10)


def test_a_second_service_refuses_a_live_address_even_a_busy_one(running):
    """Liveness is the lock the service holds for its lifetime, not an answer within a
    time-out: a service that cannot answer now (stopped here, as by a long register) is
    still not taken over; once it is gone (kill -9), the address is free again."""
    import signal

    address, proc, client = running
    with pytest.raises(ConfigError, match="already runs on"):
        CacheService(address, capacity_bytes=10_000)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(ConfigError, match="already runs on"):
            CacheService(address, capacity_bytes=10_000)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert proc.is_alive() and "store" in client.hello()  # the first one goes on
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    second = CacheService(address, capacity_bytes=10_000)  # the kernel dropped its lock
    second.close(destroy_store=True)


def test_content_keys_travel_packed():
    """A manifest's keys go to the service as 16 raw bytes each, not as text lines."""
    keys = DigestColumn(f"{i:032x}" for i in range(1000))
    frames = encode({"op": "register"}, {"keys": keys, "sizes": np.ones(1000, np.int64)})
    assert len(frames[1]) == 16 * 1000
    header, payload = decode(frames)
    assert header == {"op": "register"} and isinstance(payload["keys"], DigestColumn)
    assert payload["keys"] == keys and payload["sizes"].tolist() == [1] * 1000


def test_malformed_and_oversized_messages_are_refused_with_the_service_alive(running):
    address, proc, client = running
    reply = _raw_request(address, [b"not json"])
    assert reply is not None and b"malformed message header" in reply[0]
    lying = b'{"op": "register", "frames": [["keys", "array", "<i8", [1000000]]]}'
    reply = _raw_request(address, [lying, b"\0" * 16])
    assert reply is not None and b"do not hold" in reply[0]
    short = b'{"op": "register", "frames": [["keys", "digests", "", [3]]]}'
    reply = _raw_request(address, [short, b"\0" * 40])
    assert reply is not None and b"do not hold 3 digests" in reply[0]
    # a frame over max_message_bytes: libzmq drops the peer before anything is decoded
    assert _raw_request(address, [b'{"op": "hello", "frames": [["x", "lines", "", [1]]]}',
                                  b"x" * (2 << 20)], timeout_ms=1500) is None  # fmt: skip
    # frames each under the limit, over it together, or too many: refused, not kept
    many = [b'{"op": "hello", "frames": []}'] + [b"x" * (1 << 19)] * 8
    reply = _raw_request(address, many, timeout_ms=5000)
    assert reply is not None and b"refused" in reply[0]
    reply = _raw_request(address, [b'{"op": "hello", "frames": []}'] + [b""] * 10)
    assert reply is not None and b"frames: refused" in reply[0]
    assert proc.is_alive() and "store" in client.hello()


def test_a_register_with_a_bad_pid_is_refused_and_the_service_lives(running):
    """``"pid": "abc"`` or ``10**23`` used to reach ``os.kill`` in the reaper, outside any
    ``try``, and stop the service: each field is checked against the declared schema."""
    address, proc, client = running
    keys = DigestColumn(f"{i:032x}" for i in range(10))
    for pid in ("abc", 10**23, -5, 0):
        header = {"op": "register", "name": "bad", "batch_size": 5, "pid": pid}
        reply = _raw_request(address, encode(header, {"keys": keys, "sizes": np.ones(10, int)}))
        assert reply is not None and b"pid" in reply[0], pid
    time.sleep(1.0)  # the reaper runs every 0.5 s: nothing of those reached it
    assert proc.is_alive() and client.stats()["registered_samples"] == 0


def test_default_address_is_in_a_private_directory(tmp_path, monkeypatch, caplog):
    """A runtime directory others may enter (squatted, or opened) is refused and left
    alone: the socket goes to ``~/.cache/hotset/run``, said once."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_address() == f"ipc://{tmp_path}/hotset/service.sock"
    assert (tmp_path / "hotset").stat().st_mode & 0o777 == 0o700
    (tmp_path / "hotset").chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="hotset"):
        assert runtime_dir() == runtime_dir() == tmp_path / "home" / ".cache" / "hotset" / "run"
    assert [r.getMessage() for r in caplog.records if "open to other users" in r.getMessage()]
    assert len(caplog.records) == 1
    assert (tmp_path / "hotset").stat().st_mode & 0o777 == 0o755  # left as it was


# -- another OS user, created for the test --------------------------------------------------


def _other_user() -> pwd.struct_passwd:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create another OS user")
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(OTHER)
    subprocess.run(["useradd", "--system", "--no-create-home", OTHER], check=True)
    return pwd.getpwnam(OTHER)


def _as_user(user: pwd.struct_passwd, target, *args) -> object:
    """Run ``target(*args)`` in a forked child that has become ``user``; its result."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()

    def child() -> None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
        try:
            out.put(target(*args))
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            out.put(f"{type(exc).__name__}: {exc}")

    proc = ctx.Process(target=child)
    proc.start()
    result = out.get(timeout=60)
    proc.join(10)
    return result


def _try_stop(address: str) -> str:
    reply = _raw_request(address, [b'{"op": "stop", "frames": []}'], timeout_ms=1500)
    return "answered" if reply is not None else "no answer"


def _try_bind(address: str) -> str:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    try:
        sock.bind(address)
        return "bound"
    except zmq.ZMQError as exc:
        return f"refused: {exc}"
    finally:
        sock.close(0)
        ctx.term()


def _impostor(address: str, ready: str) -> str:
    """A REP socket at ``address`` that answers every request as a service would."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.RCVTIMEO, 15000)
    sock.bind(address)
    Path(ready).touch()
    with contextlib.suppress(zmq.Again):
        while True:
            sock.recv_multipart()
            sock.send_multipart([b'{"store": "/tmp/x", "capacity_bytes": 1, "frames": []}'])
    sock.close(0)
    return "done"


def test_another_user_cannot_reach_the_service_at_its_default_address(monkeypatch):
    other = _other_user()
    base = Path(tempfile.mkdtemp(prefix="hotset-sec-"))
    base.chmod(0o1777)  # like /tmp: anyone may create in it; the 0700 directory is the guard
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
        address = default_address()
        proc = start_service(address, capacity_bytes=100_000)
        client = hotset.connect(address, timeout_s=20)
        assert _as_user(other, _try_stop, address) == "no answer"
        assert proc.is_alive() and "store" in client.hello()
        # nor take the address while the service is down: the directory is closed to them
        assert _as_user(other, _try_bind, address + ".2").startswith("refused")
        assert _as_user(other, _try_bind, f"ipc://{base}/theirs.sock") == "bound"  # as in /tmp
        client.close()
        proc.terminate()
        proc.join(10)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_socket_another_user_owns_is_refused_before_any_data_is_sent():
    other = _other_user()
    base = Path(tempfile.mkdtemp(prefix="hotset-sec-"))
    base.chmod(0o755)
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, other.pw_uid, other.pw_gid)
    address = f"ipc://{theirs}/svc.sock"
    ready = theirs / "ready"
    try:
        ctx = mp.get_context("fork")
        proc = ctx.Process(target=_as_user, args=(other, _impostor, address, str(ready)))
        proc.start()
        for _ in range(200):
            if ready.exists():
                break
            proc.join(0.05)
        with pytest.raises(ConfigError, match=f"belongs to uid {other.pw_uid}, not to you"):
            hotset.connect(address, timeout_s=5)
        proc.terminate()
        proc.join(10)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_paused_job_is_not_reaped_whatever_its_call_timeout(fmnist_dir, tmp_path):
    """Heartbeats follow the service's job timeout (2 s here), not only the client's call
    timeout (60 s, which alone would beat every 15 s): a job pausing 5 s stays."""
    import time

    from hotset.storage import FileStorage

    address = f"ipc://{tmp_path}/svc.sock"
    proc = start_service(address, capacity_bytes=400_000, job_timeout_s=2.0, sampling="isa")
    client = hotset.connect(address, timeout_s=60)
    try:
        loader = client.make_loader(
            FileStorage(str(fmnist_dir / "train")), batch_size=100, num_workers=0, name="slow"
        )
        with loader:
            first = [ids for _, _, ids in loader]
            time.sleep(5)  # validation, a checkpoint...
            names = [j["name"] for j in client.stats()["jobs"].values()]
            assert names == ["slow"]
            loader.set_epoch(1)
            second = [ids for _, _, ids in loader]
        assert sum(map(len, first)) == sum(map(len, second)) == 1000
        assert client.stats()["removed"] == [["slow", "left"]]  # left, never reaped
    finally:
        client.close()
        proc.terminate()
        proc.join(10)


def _try_read(path: str) -> str:
    try:
        Path(path).read_bytes()
        return "read"
    except OSError as exc:
        return f"refused: {exc.strerror}"


def test_a_named_store_is_readable_by_its_user_only(tmp_path):
    from hotset.store.shared import SharedStore

    base = Path(tempfile.mkdtemp(prefix="hotset-sec-"))
    base.chmod(0o1777)
    try:
        store = SharedStore(100_000, path=str(base / "named"))
        store.put({"k": b"private bytes"})
        data = base / "named" / "data.mdb"
        assert data.stat().st_mode & 0o077 == 0 and (base / "named").stat().st_mode & 0o077 == 0
        if os.geteuid() == 0 and shutil.which("useradd"):
            assert _as_user(_other_user(), _try_read, str(data)).startswith("refused")
        store.close(destroy=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- tcp:// with ZeroMQ CURVE -----------------------------------------------------------------


def _free_tcp_address() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _forged(address: str, server_public: bytes) -> str:
    """A client with the right server key but a key pair of its own making."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    for opt, v in ((zmq.RCVTIMEO, 1500), (zmq.SNDTIMEO, 1500), (zmq.LINGER, 0)):
        sock.setsockopt(opt, v)
    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    sock.curve_serverkey = server_public
    sock.connect(address)
    try:
        sock.send_multipart([b'{"op": "stop", "frames": []}'])
        sock.recv_multipart()
        return "answered"
    except zmq.Again:
        return "no answer"
    finally:
        sock.close(0)
        ctx.term()


@pytest.fixture
def on_tcp(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="hotset-sec-"))
    base.chmod(0o1777)  # like a shared /tmp: the key file's own mode is the guard
    address, key_file = _free_tcp_address(), str(base / "svc.key")
    proc = start_service(address, capacity_bytes=100_000, key_file=key_file)
    client = hotset.connect(address, timeout_s=20, key_file=key_file)
    yield address, key_file, proc, client
    client.close()
    proc.terminate()
    proc.join(10)
    shutil.rmtree(base, ignore_errors=True)


def test_tcp_clients_need_the_key_file(on_tcp, fmnist_dir):
    from hotset.service.auth import load_keys
    from hotset.storage import FileStorage

    address, key_file, proc, client = on_tcp
    assert Path(key_file).stat().st_mode & 0o777 == 0o600
    storage = FileStorage(str(fmnist_dir / "train"))  # the owner trains, with the key file
    with client.make_loader(storage, batch_size=100, num_workers=1, name="owner") as loader:
        assert sorted(i for _, _, ids in loader for i in ids.tolist()) == list(range(1000))
    assert _try_stop(address) == "no answer"  # no keys: the handshake never completes
    assert _forged(address, load_keys(Path(key_file)).server_public) == "no answer"
    with pytest.raises(ConfigError, match="no service key file"):
        hotset.connect(address, timeout_s=0.2, key_file=key_file + ".missing")
    assert proc.is_alive() and "store" in client.hello()
    with pytest.raises(ConfigError, match="cannot listen on"):  # the port is taken
        CacheService(address, capacity_bytes=10_000, key_file=key_file)
    Path(key_file).chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        hotset.connect(address, key_file=key_file)


def _try_connect(address: str, key_file: str) -> str:
    try:
        hotset.connect(address, timeout_s=2, key_file=key_file)
        return "connected"
    except ConfigError as exc:
        return f"refused: {exc}"


def test_another_user_cannot_use_a_tcp_service(on_tcp):
    other = _other_user()
    address, key_file, proc, client = on_tcp
    assert "not to you" in _as_user(other, _try_connect, address, key_file)
    assert _as_user(other, _try_read, key_file).startswith("refused")  # 0600: not even read
    assert _as_user(other, _try_stop, address) == "no answer"
    assert proc.is_alive() and "store" in client.hello()


def _fuzz_messages(rng: np.random.Generator, n: int):
    """Random and mutated requests: bad types, ranges, sizes, frames and bytes (never a
    ``stop``, and job ids far from the real job's, which a valid ``leave`` would end)."""
    import socket

    odd = ["abc", 10**23, -1, 1.5, None, [], {}, "", "x" * 300, True, float("nan"), 2**63]
    ops = ["hello", "register", "register", "register", "plan", "plan", "heartbeat", "leave",
           "stats", "nope", 7, None]  # fmt: skip
    for _ in range(n):
        kind = rng.integers(6)
        if kind == 0:  # noise
            yield [rng.bytes(int(rng.integers(0, 64))) for _ in range(int(rng.integers(1, 4)))]
            continue
        header = {"op": ops[rng.integers(len(ops))], "job": int(rng.integers(1000, 10**6)),
                  "epoch": int(rng.integers(0, 3)), "name": "fuzz", "batch_size": 10,
                  "host": socket.gethostname(), "pid": os.getpid()}  # fmt: skip
        for field in rng.choice(["pid", "batch_size", "epoch", "job", "done", "benefit",
                                 "cache", "name", "host", "instance"], size=2):  # fmt: skip
            header[str(field)] = odd[rng.integers(len(odd))]
        m = int(rng.integers(1, 50))
        payload = {
            "keys": DigestColumn(f"{int(k):032x}" for k in rng.integers(0, 1 << 60, m)),
            "sizes": rng.integers(-5, 100, m if kind != 2 else m + 1),
            "served": rng.integers(-3, m + 3, int(rng.integers(0, 5))),
            "fb_ids": rng.integers(-2, 100, m),
            "fb_losses": rng.normal(size=m if kind != 3 else m - 1),
        }
        keep = rng.random(len(payload)) < 0.6
        payload = {k: v for (k, v), on in zip(payload.items(), keep, strict=True) if on}
        try:
            frames = encode(header, payload)
        except (TypeError, ValueError):
            continue
        if kind == 4:  # a mutated byte in a frame
            f = int(rng.integers(len(frames)))
            if frames[f]:
                b = bytearray(frames[f])
                b[int(rng.integers(len(b)))] ^= 0xFF
                frames[f] = bytes(b)
        yield frames


def test_the_protocol_survives_fuzzing_while_a_job_trains(running, fmnist_dir):
    """Thousands of random and mutated messages while a job trains: every one answered
    (an error where it is wrong), the service stays up, and the job serves every sample
    exactly once per epoch."""
    import threading

    from hotset.storage import FileStorage

    address, proc, client = running
    storage = FileStorage(str(fmnist_dir / "train"))
    answered, silent = [0], [0]

    def fuzz() -> None:
        ctx = zmq.Context()
        rng = np.random.default_rng(0)
        for frames in _fuzz_messages(rng, 3000):
            sock = ctx.socket(zmq.REQ)
            for opt, v in ((zmq.RCVTIMEO, 5000), (zmq.SNDTIMEO, 5000), (zmq.LINGER, 0)):
                sock.setsockopt(opt, v)
            sock.connect(address)
            try:
                sock.send_multipart(frames)
                sock.recv_multipart()
                answered[0] += 1
            except zmq.Again:
                silent[0] += 1
            finally:
                sock.close(0)
        ctx.term()

    thread = threading.Thread(target=fuzz)
    thread.start()
    with client.make_loader(storage, batch_size=50, num_workers=1, name="real") as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            served = sorted(i for _, _, ids in loader for i in ids.tolist())
            assert served == list(range(len(storage))), epoch
    thread.join(300)
    assert not thread.is_alive() and answered[0] > 2500 and silent[0] == 0
    assert proc.is_alive() and "store" in client.hello()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    op=st.sampled_from(["hello", "register", "plan", "heartbeat", "leave", "stats", "x"]),
    fields=st.dictionaries(
        st.sampled_from(["frames", "job", "epoch", "done", "cache", "benefit", "name", "pid",
                         "batch_size", "host", "instance"]), _json, max_size=5),  # fmt: skip
    frames=st.lists(st.binary(max_size=32), max_size=3),
)
def test_every_hostile_header_is_refused_by_the_decoder_before_any_handler(op, fields, frames):
    """Whatever types and shapes a header's fields have, decoding and checking it either
    gives a request of the schema or a ``ProtocolError`` naming what is wrong: never an
    error from inside (it reached the handlers as ``TypeError`` / ``RecursionError``)."""
    header = json.dumps({"op": op, **fields}, allow_nan=True).encode()
    with contextlib.suppress(ProtocolError):
        parse(*decode([header, *frames]))


def test_a_header_nested_too_deep_or_too_large_is_refused():
    deep = b'{"op": "hello", "frames": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ProtocolError, match="over 65536 bytes"):
        decode([deep])
    deep = b'{"op": "hello", "frames": [], "x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    with pytest.raises(ProtocolError, match="malformed message header"):
        decode([deep])
    for header in (b"[1, 2]", b'"x"', b'{"op": "hello", "frames": 7}'):
        with pytest.raises(ProtocolError, match="malformed"):
            decode([header])


def test_failures_a_peer_causes_are_logged_one_line_at_a_time(caplog):
    from hotset.service.server import _Quiet

    quiet = _Quiet("a request failed", every_s=60.0)
    with caplog.at_level(logging.DEBUG, logger="hotset.service.server"):
        for k in range(1000):
            quiet.note(TypeError(f"bad {k}"))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "TypeError: bad 0" in warned[0].getMessage()
    quiet._last -= 61.0
    with caplog.at_level(logging.WARNING, logger="hotset.service.server"):
        quiet.note(TypeError("bad again"))
    assert "(999 more since the last line)" in caplog.records[-1].getMessage()
