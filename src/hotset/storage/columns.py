"""Compact string columns for manifests of millions of samples: a few bytes per id in
numpy arrays instead of a Python object per string (~70 B of object header and pointer
each before its text).

* :class:`StringColumn`: UTF-8 text back to back in one buffer, and each string's end.
* :class:`DigestColumn`: 32-character lowercase hex digests (the manifest's blake2b-128
  keys) packed as their 16 raw bytes.

Both are read-only sequences of ``str``: ``column[i]``, ``len``, iteration, ``take``
(a sub-column), ``positions`` (look-up), ``distinct`` (first occurrences), :func:`concat`,
and ``==`` with any sequence of the same strings.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import index_dtype

CHUNK = 1 << 16  # strings encoded at a time: bounds the transient Python objects


def _chunks(strings: Iterable[str]) -> Iterator[list[str]]:
    it = iter(strings)
    while part := list(islice(it, CHUNK)):
        yield part


class _Column(Sequence[str]):
    """What both columns share; a subclass stores the strings (``_at``, ``take``,
    ``__len__``)."""

    __slots__ = ()

    @abstractmethod
    def _at(self, i: int) -> str:
        """The string at ``0 <= i < len(self)``."""

    @abstractmethod
    def take(self, idx) -> _Column:
        """The strings at ``idx``, in that order, as a column of the same kind."""

    def positions(self, strings: Iterable[str]) -> np.ndarray:
        """The position of each of ``strings`` in the column (the first, if repeated);
        -1 for one that is absent."""
        index = {s: i for i, s in reversed(list(enumerate(self)))}
        return np.fromiter((index.get(s, -1) for s in strings), np.int64)

    def distinct(self) -> np.ndarray:
        """The position of each distinct string's first occurrence, in column order."""
        return self.numbered()[0]

    def _values(self) -> np.ndarray:
        """The strings as one array ``np.unique`` sorts."""
        return np.array(list(self), object)

    def numbered(self) -> tuple[np.ndarray, np.ndarray]:
        """``(first, number)``: the position of each distinct string's first occurrence,
        in column order, and for each string the index of its own in ``first`` (one
        sort of the column)."""
        _, first, inverse = np.unique(self._values(), return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        return first[order], rank[inverse.ravel()]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for {n} strings")
        return self._at(i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in islice(self, 3))
        return f"{type(self).__name__}([{head}{', ...' if len(self) > 3 else ''}], n={len(self)})"


class StringColumn(_Column):
    """Strings as one UTF-8 buffer (``bytes``, or a uint8 array mapped from a file) and
    an int64 end offset each."""

    __slots__ = ("_blob", "_ends")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        blobs, ends, total = [], [np.zeros(0, np.int64)], 0
        for part in _chunks(strings):
            enc = [s.encode() for s in part]
            lens = np.fromiter(map(len, enc), np.int64, len(enc))
            ends.append(total + np.cumsum(lens))
            total = int(ends[-1][-1])
            blobs.append(b"".join(enc))
        self._blob = b"".join(blobs)
        self._ends = np.concatenate(ends)

    @classmethod
    def _of(cls, blob: bytes, ends: np.ndarray) -> StringColumn:
        col = cls.__new__(cls)
        col._blob, col._ends = blob, ends
        return col

    def __len__(self) -> int:
        return int(self._ends.size)

    def _at(self, i: int) -> str:
        start = int(self._ends[i - 1]) if i else 0
        return bytes(self._blob[start : int(self._ends[i])]).decode()

    def __iter__(self) -> Iterator[str]:
        blob, start = self._blob, 0
        for end in self._ends.tolist():
            yield bytes(blob[start:end]).decode()
            start = end

    def take(self, idx) -> StringColumn:
        idx = np.asarray(idx, np.int64)
        starts = np.concatenate([[0], self._ends[:-1]])[idx] if idx.size else idx
        ends = self._ends[idx]
        blob = b"".join(
            self._blob[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
        )
        return StringColumn._of(blob, np.cumsum(ends - starts).astype(np.int64))


class DigestColumn(_Column):
    """32-character lowercase hex digests as an ``(n, 16)`` uint8 array."""

    __slots__ = ("_raw", "_order")

    def __init__(self, digests: Iterable[str] = ()) -> None:
        parts = [np.zeros((0, 16), np.uint8)]
        done = 0
        for part in _chunks(digests):
            text = "".join(part)
            try:
                raw = bytes.fromhex(text)
            except ValueError:
                raw = b""
            if raw.hex() != text or any(len(s) != 32 for s in part):  # lowercase hex, 32 each
                bad = next((s for s in part if not _is_digest(s)), part[0])
                raise ConfigError(f"key {done + part.index(bad)} ({bad!r}) is not a hex digest")
            parts.append(np.frombuffer(raw, np.uint8).reshape(-1, 16))
            done += len(part)
        self._raw = np.concatenate(parts)
        self._order: tuple[np.ndarray, np.ndarray] | None = None  # for ``positions``

    def __len__(self) -> int:
        return int(self._raw.shape[0])

    def _at(self, i: int) -> str:
        return self._raw[i].tobytes().hex()

    def __iter__(self) -> Iterator[str]:
        raw = self._raw.tobytes()
        for lo in range(0, len(raw), 16):
            yield raw[lo : lo + 16].hex()

    @classmethod
    def of_raw(cls, raw: np.ndarray) -> DigestColumn:
        """The digests whose 16 raw bytes are the rows of ``raw`` (``(n, 16)`` uint8)."""
        col = cls.__new__(cls)
        col._raw, col._order = np.ascontiguousarray(raw, np.uint8).reshape(-1, 16), None
        return col

    @property
    def raw(self) -> np.ndarray:
        """The digests' raw bytes, ``(n, 16)`` uint8 (read-only use)."""
        return self._raw

    def take(self, idx) -> DigestColumn:
        return DigestColumn.of_raw(self._raw[np.asarray(idx, np.int64)])

    def _packed(self) -> np.ndarray:
        return self._raw.view("S16").ravel()  # 16 raw bytes each: order and equality hold

    def _values(self) -> np.ndarray:
        return self._packed()

    def positions(self, strings: Iterable[str]) -> np.ndarray:
        """As ``_Column.positions``, by binary search on a 64-bit hash of each digest
        (integers: fast to compare), sorted once (12 B per id beside the digests, not a
        dict of strings); each candidate is then compared whole."""
        if isinstance(strings, DigestColumn):
            ok, query = np.ones(len(strings), bool), strings._raw
        else:
            strings = list(strings)
            ok = np.fromiter(map(_is_digest, strings), bool, len(strings))
            hexes = "".join(s for s, y in zip(strings, ok, strict=True) if y)
            query = np.frombuffer(bytes.fromhex(hexes), np.uint8).reshape(-1, 16)
        out = np.full(ok.size, -1, np.int64)
        if not ok.any() or not len(self):
            return out
        words = self._raw.view(np.uint64)  # (n, 2): a digest as two integers
        if self._order is None:
            hashed = _mix(words)
            order = np.argsort(hashed, kind="stable")
            index = order.astype(index_dtype(len(self)))
            self._order = (index, hashed[order])
        order, heads = self._order
        q = np.ascontiguousarray(query).view(np.uint64)
        qh = _mix(q)
        ranked = np.argsort(qh, kind="stable")  # sorted queries search 25x faster
        sq = qh[ranked]
        at = np.searchsorted(heads, sq)
        pending, where = np.arange(q.shape[0]), np.flatnonzero(ok)[ranked]
        while pending.size:  # past the first candidate only where two hashes collide
            a = at[pending]
            live = a < len(self)
            pending, a = pending[live], a[live]
            same = heads[a] == sq[pending]
            pending, a = pending[same], a[same]
            cand, qi = order[a], ranked[pending]
            whole = (words[cand, 0] == q[qi, 0]) & (words[cand, 1] == q[qi, 1])
            out[where[pending[whole]]] = cand[whole]
            pending = pending[~whole]
            at[pending] += 1
        return out


def _mix(words: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of ``(n, 2)`` uint64 (both halves mixed, so keys alike
    in one half, e.g. a counter's digits, still spread)."""
    with np.errstate(over="ignore"):
        h = words[:, 0] * np.uint64(0x9E3779B97F4A7C15) ^ words[:, 1] * np.uint64(
            0xC2B2AE3D27D4EB4F
        )
        return h ^ (h >> np.uint64(31))


def _is_digest(s: str) -> bool:
    return len(s) == 32 and s == s.lower() and all(c in "0123456789abcdef" for c in s)


def key_column(keys: Iterable[str]) -> _Column:
    """Content keys: packed digests when they are hex digests (the manifest's kind),
    else text (keys of another kind, e.g. a test's)."""
    if isinstance(keys, _Column):
        return keys
    it = iter(keys)
    first = next(it, None)
    if first is None:
        return DigestColumn()
    rest = chain([first], it)
    return DigestColumn(rest) if _is_digest(first) else StringColumn(rest)


def concat(a: _Column, b: _Column) -> _Column:
    """``a`` then ``b`` as one column (packed digests when both are)."""
    if isinstance(a, DigestColumn) and isinstance(b, DigestColumn):
        return DigestColumn.of_raw(np.concatenate([a.raw, b.raw]))
    return StringColumn(chain(a, b))


def text_column(strings: Iterable[str]) -> _Column:
    return strings if isinstance(strings, _Column) else StringColumn(strings)
