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
from hotset.ids import index_dtype, sorted_by_top_bits

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

    def prefixed(self, prefix: str) -> StringColumn:
        """Each string with ``prefix`` before it, made in numpy (no Python string each)."""
        head, n = np.frombuffer(prefix.encode(), np.uint8), len(self)
        if not head.size or not n:
            return self
        text, ends = np.frombuffer(self._blob, np.uint8), self._ends
        out_ends = ends + head.size * np.arange(1, n + 1, dtype=np.int64)
        lengths = np.diff(ends, prepend=0)
        out = np.empty(int(out_ends[-1]), np.uint8)
        if (lengths == lengths[0]).all():  # names of one width: a row each
            rows = out.reshape(n, -1)
            rows[:, : head.size], rows[:, head.size :] = head, text.reshape(n, -1)
            return StringColumn._of(out, out_ends)
        at = (out_ends - lengths - head.size)[:, None] + np.arange(head.size)
        at = at.ravel()
        out[at] = np.tile(head, n)
        rest = np.ones(out.size, bool)
        rest[at] = False
        out[rest] = text
        return StringColumn._of(out, out_ends)

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
        self._order: _HashIndex | None = None  # for ``positions`` and ``numbered``

    def __len__(self) -> int:
        return int(self._raw.shape[0])

    def _at(self, i: int) -> str:
        return self._raw[i].tobytes().hex()

    def __iter__(self) -> Iterator[str]:
        """The digests as strings, ``CHUNK`` at a time, each chunk's in one ``hex`` and one
        ``split`` (0.06-0.09 us a digest, where a ``hex`` each took 0.2: the service lists
        every key it evicts)."""
        for lo in range(0, len(self), CHUNK):
            yield from self._raw[lo : lo + CHUNK].tobytes().hex(" ", 16).split(" ")

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

    def _index(self) -> _HashIndex:
        """The digests in order of a 64-bit hash of each (ties in column order), built
        once: 12 B per id beside the digests, not a dict of strings."""
        if self._order is None:
            hashed = _mix(self._raw.view(np.uint64))
            order = _hash_order(hashed)
            heads = hashed[order]
            self._order = _HashIndex(order.astype(index_dtype(len(self))), heads)
        return self._order

    def numbered(self) -> tuple[np.ndarray, np.ndarray]:
        """As ``_Column.numbered``, from the hash index (digests alike only where their
        hashes are; a collision of two different digests takes the general path)."""
        n = len(self)
        index = self._index()
        if index.distinct:
            return np.arange(n), np.arange(n)
        order = index.order.astype(np.int64)
        tie = index.heads[1:] == index.heads[:-1]
        a, b = order[:-1][tie], order[1:][tie]
        words = self._raw.view(np.uint64)
        if not ((words[a, 0] == words[b, 0]) & (words[a, 1] == words[b, 1])).all():
            return super().numbered()
        starts = np.concatenate([[True], ~tie])  # a new digest begins, in hash order
        is_first = np.zeros(n, bool)
        is_first[order[starts]] = True  # ties in column order: the first occurrence
        rank = np.cumsum(is_first) - 1  # a first occurrence's number, in column order
        number = np.empty(n, np.int64)
        number[order] = rank[order[starts]][np.cumsum(starts) - 1]
        return np.flatnonzero(is_first), number

    def positions(self, strings: Iterable[str]) -> np.ndarray:
        """As ``_Column.positions``, from the hash index without sorting the queries:
        each query walks the index's entries from the first its hash may equal
        (``_Buckets``), comparing each candidate's 16 bytes whole, to the first that
        is the same or to the end of its range (absent)."""
        if isinstance(strings, DigestColumn):
            ok, query = np.ones(len(strings), bool), strings._raw
        else:
            strings = list(strings)
            ok, query = _digests(strings)
        out = np.full(ok.size, -1, np.int64)
        if not ok.any() or not len(self):
            return out
        index = self._index()
        order, words = index.order, self._raw.view(np.uint64)  # words: a digest as two ints
        q = np.ascontiguousarray(query).view(np.uint64)
        if index.distinct and ok.all() and q.shape == words.shape and np.array_equal(q, words):
            return np.arange(len(self))  # the same digests in the same order
        qrows, rows, hashed = _rows(q), _rows(self._raw), _mix(q)
        where = np.arange(ok.size) if ok.all() else np.flatnonzero(ok)
        buckets = index.buckets()
        for lo in range(0, where.size, LOOKUP_BLOCK):  # temporaries of a block, reused
            block = where[lo : lo + LOOKUP_BLOCK]
            at, end = buckets.ranges(hashed[lo : lo + LOOKUP_BLOCK])
            pending, mine = np.arange(block.size), qrows[lo : lo + LOOKUP_BLOCK]
            while pending.size:  # a few steps: a bucket holds about one hash
                pending = pending[at[pending] < end[pending]]
                cand = order[at[pending]]
                whole = _same(rows[cand], mine[pending])
                out[block[pending[whole]]] = cand[whole]
                pending = pending[~whole]
                at[pending] += 1
        return out


MAX_BUCKET = 64  # more hashes in one bucket (repeated keys): search by equal hashes
#: queries looked up at a time (``DigestColumn.positions``): temporaries of 16 MB, not 14M
LOOKUP_BLOCK = 1 << 20


class _Buckets:
    """Where to walk the sorted ``heads`` for a hash: its bucket, named by the hash's top
    bits (about one head per bucket; a count and a cumulative sum find where each
    begins, once), so the queries need no sort and no binary search. Where a bucket is
    crowded (a key repeated many times), the heads equal to the hash instead (two
    binary searches)."""

    def __init__(self, heads: np.ndarray) -> None:
        self.heads = heads
        bits = min(30, max(1, (heads.size - 1).bit_length()))
        self.shift = np.uint64(64 - bits)
        top = heads >> self.shift  # < 2**30: read as int64 without a copy
        counts = np.bincount(top.view(np.int64), minlength=1 << bits)
        self.starts = None  # bucket b's heads are [starts[b], starts[b + 1])
        if counts.max() <= MAX_BUCKET:
            self.starts = np.empty((1 << bits) + 1, index_dtype(heads.size + 1))
            self.starts[0] = 0
            np.cumsum(counts, out=self.starts[1:])

    def ranges(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each of the hashes ``h``, the range ``[at, end)`` of the heads to walk."""
        if self.starts is None:
            return np.searchsorted(self.heads, h, "left"), np.searchsorted(self.heads, h, "right")
        b = (h >> self.shift).view(np.int64)
        at = self.starts[b].astype(np.int64)
        b += 1
        return at, self.starts[b]


class _HashIndex:
    """A column's digests in order of their hash, and where each hash's bucket begins
    (built at the first look-up and kept: 4 B per id at 14M ids, against 0.3-1.2 s per
    look-up to build again)."""

    def __init__(self, order: np.ndarray, heads: np.ndarray) -> None:
        self.order = order  # positions in order of their hash (ties in column order)
        self.heads = heads  # the hashes, sorted
        self.distinct = not (heads[1:] == heads[:-1]).any()  # no digest repeats
        self._buckets: _Buckets | None = None

    def buckets(self) -> _Buckets:
        if self._buckets is None:
            self._buckets = _Buckets(self.heads)
        return self._buckets


def _rows(raw: np.ndarray) -> np.ndarray:
    """16-byte rows as one value each, to gather whole: a complex128 view (copied 4x
    faster than a void one; its bits are moved, never compared: ``_same`` compares)."""
    return np.ascontiguousarray(raw).view(np.uint8).reshape(-1, 16).view(np.complex128).ravel()


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether each pair of ``_rows`` is the same 16 bytes."""
    x, y = a.view(np.uint64).reshape(-1, 2), b.view(np.uint64).reshape(-1, 2)
    return (x[:, 0] == y[:, 0]) & (x[:, 1] == y[:, 1])


def _hash_order(h: np.ndarray) -> np.ndarray:
    """``np.argsort(h, kind="stable")`` for uint64 ``h``, about 3x faster at 14M: each
    hash's top ``64 - b`` bits keep its position in the low ``b`` bits (enough for
    ``n``) and numpy sorts these keys as plain integers (``sorted_by_top_bits``, as
    ``hotset.ids.stable_order`` does for floats); the few entries whose top bits
    tie (about 90 pairs in 14M, and every repeat of a key) are then put in order of
    their whole hash, positions still ascending among equal ones."""
    b = max(1, (h.size - 1).bit_length())
    keys = sorted_by_top_bits(h, b)
    order = keys & np.uint64((1 << b) - 1)
    keys >>= np.uint64(b)  # the top bits, in order
    tie = np.flatnonzero(keys[1:] == keys[:-1])
    if tie.size:  # runs of equal top bits: by (top, whole hash, position), in their slots
        slots = np.union1d(tie, tie + 1)
        pos = order[slots]
        order[slots] = pos[np.lexsort((pos, h[pos], keys[slots]))]
    return order


def _mix(words: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of ``(n, 2)`` uint64 (both halves mixed, so keys alike
    in one half, e.g. a counter's digits, still spread)."""
    with np.errstate(over="ignore"):  # in place: two arrays of n, not five
        h = words[:, 0] * np.uint64(0x9E3779B97F4A7C15)
        t = np.multiply(words[:, 1], np.uint64(0xC2B2AE3D27D4EB4F))
        h ^= t
        h ^= np.right_shift(h, np.uint64(31), out=t)
        return h


def _is_digest(s: str) -> bool:
    return len(s) == 32 and s == s.lower() and all(c in "0123456789abcdef" for c in s)


def _digests(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Which ``strings`` are hex digests, and those digests as ``(k, 16)`` uint8: all of
    them in one ``fromhex`` where all are (a store's listing), else one by one."""
    text = "".join(strings)
    if len(text) == 32 * len(strings) and all(len(s) == 32 for s in strings):
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = b""
        if raw.hex() == text:
            return np.ones(len(strings), bool), np.frombuffer(raw, np.uint8).reshape(-1, 16)
    ok = np.fromiter(map(_is_digest, strings), bool, len(strings))
    hexes = "".join(s for s, y in zip(strings, ok, strict=True) if y)
    return ok, np.frombuffer(bytes.fromhex(hexes), np.uint8).reshape(-1, 16)


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


def concat(*columns: _Column) -> _Column:
    """The columns one after another as one: packed digests where all are, text buffers
    joined where all are text (no Python string per value), one of them, with its index,
    where the others are empty."""
    full = [c for c in columns if len(c)]
    if len(full) <= 1:
        return full[0] if full else (columns[0] if columns else DigestColumn())
    if all(isinstance(c, DigestColumn) for c in full):
        return DigestColumn.of_raw(np.concatenate([c.raw for c in full]))
    if all(isinstance(c, StringColumn) for c in full):
        ends = np.cumsum([0] + [int(c._ends[-1]) for c in full[:-1]])
        return StringColumn._of(
            b"".join(c._blob for c in full),
            np.concatenate([c._ends + at for c, at in zip(full, ends.tolist(), strict=True)]),
        )  # fmt: skip
    return StringColumn(chain(*full))


def text_column(strings: Iterable[str]) -> _Column:
    return strings if isinstance(strings, _Column) else StringColumn(strings)
