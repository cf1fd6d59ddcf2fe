"""JOADER's dependent sampling (DSA) for several jobs on overlapping datasets.

Each element of the id universe carries a *need mask*: the jobs that still have to read
it this epoch. Elements are grouped by mask (one bucket per distinct mask, with O(1)
swap-remove), and the dependent sampling tree of Definition 1 is read off the buckets
for the jobs sorted by what they have left: with the jobs J_1..J_m in ascending order
and G_l = {J_l..J_m}, vertex V_l (the intersection of the l-th recursion) holds the
elements whose mask contains G_l but not G_{l-1}, and J_k's leaf (its difference) the
elements J_k needs whose mask does not contain G_k.

* **Sampling** (Algorithm 1 and 2, appendix C): a round walks the rightmost path; the
  first undecided job takes the intersection I (one or several vertices) with
  probability |I| / (|R_k| - |S|), each next job with (|R_{k-1}| - |S|) / (|R_k| - |S|);
  the jobs that took I share one uniform element of it; if none took it, the first
  takes a uniform element of its difference. Every job's pick stays uniform over what
  it has left (Theorem 2), and each job reads each of its elements once per epoch.
* **Compensation** (appendix C): an element read by some of the jobs that share it only
  loses their bits, so it moves to the vertex of the jobs that still need it.
* **Insertion and deletion** (4.2): insertion sets the job's bit on its ids in one
  vectorised pass and regroups the buckets; deletion clears the bit, merging each bucket
  that had it into the one without it. The tree follows, with its vertices split or
  merged as Definition 1 requires.
* **Partial sampling** (appendix C): a round may name only some jobs (the fast ones);
  the tree is re-sorted by what the named jobs have left, every round.
* **Runs of rounds** (``picks``, a service's batch): where the jobs are in step, or two
  jobs out of step need only their shared bucket and their own, a run is drawn in numpy
  (``bucket_draws``) with the law of the rounds one at a time and draws of its own.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import BLOCK, as_ids, distinct_index, index_dtype, nonzero_as
from hotset.sampling.bucket_draws import REMOVE, first_takes, take

MAX_JOBS = 64  # one bit of a uint64 need mask per job
#: up to this many distinct need masks (and 16 jobs), a regroup scans the masks once per
#: mask instead of sorting the ids by mask (sequential passes, no random gathers)
SCAN_MASKS = 32
#: the tree for an order of jobs: their bits, and per level the buckets (id arrays) of
#: the vertex and of the leaf (``DependentSampling._levels``)
Levels = tuple[list[int], list[list[array]], list[list[array]]]


@dataclass(frozen=True)
class Vertex:
    """A vertex of the dependent sampling tree: ``jobs`` sample from ``ids``."""

    kind: str  # "intersection" (on the rightmost path) or "difference" (a leaf)
    jobs: tuple[Hashable, ...]
    ids: np.ndarray


class DependentSampling:
    """DSA over jobs whose datasets are id sets of one universe ``0 .. universe - 1``."""

    #: a run of at least this many rounds, none of which can empty a bucket, is drawn at
    #: once (``_rounds_at_once``); shorter runs a round at a time
    at_once_min = 32

    def __init__(self, universe: int, seed: int = 0) -> None:
        if universe <= 0:
            raise ConfigError(f"universe must be > 0, got {universe}")
        self.universe = int(universe)
        self.mask = np.zeros(self.universe, np.uint64)
        self.dtype = index_dtype(self.universe)
        self._code = "i" if self.dtype == np.int32 else "q"  # the buckets' array type
        self.pos = np.zeros(self.universe, self.dtype)  # index in its bucket
        # the same columns, read and written one element at a time by a round (a
        # memoryview's item is a Python int: no numpy scalar per access)
        self._mask_mv, self._pos_mv = memoryview(self.mask), memoryview(self.pos)
        # need mask -> its ids (no empty buckets), each an ``array``: 4 B per id, and
        # Python-speed swap-remove and append in a round
        self.buckets: dict[int, array] = {}
        self.datasets: dict[Hashable, np.ndarray] = {}
        self.bit: dict[Hashable, int] = {}
        self.left: dict[Hashable, int] = {}  # |R_j|: what job j still reads this epoch
        self._rng = random.Random(seed)
        self._draws = np.random.default_rng(seed)  # the runs drawn at once
        self._version = 0  # bumped when the set of buckets changes
        self._cached_levels: tuple = ((), -1, None)  # (order, version, levels)

    # -- jobs --------------------------------------------------------------------------
    def add_job(self, job: Hashable, ids: Iterable[int] | np.ndarray, start: bool = True) -> None:
        """Insert ``job`` with its dataset (global ids; kept without a copy when they are
        sorted, distinct and of ``self.dtype``); ``start``: begin its first epoch now
        (else at ``start_epoch``)."""
        if job in self.bit:
            raise ConfigError(f"job {job!r} is already registered")
        free = sorted(set(range(MAX_JOBS)) - set(self.bit.values()))
        if not free:
            raise ConfigError(f"at most {MAX_JOBS} jobs can sample together")
        ids = np.asarray(ids).ravel()
        if ids.dtype.kind not in "iu":
            ids = ids.astype(np.int64)
        if ids.size == 0:
            raise ConfigError(f"job {job!r}: the dataset is empty")
        if ids.min() < 0 or ids.max() >= self.universe:
            raise ConfigError(f"job {job!r}: ids must lie in [0, {self.universe})")
        if ids.dtype != self.dtype or not (ids[1:] > ids[:-1]).all():  # else kept as is
            present = np.zeros(self.universe, bool)  # sorted and unique in O(universe)
            present[ids] = True
            ids = nonzero_as(present, self.dtype)
        self.bit[job] = free[0]
        self.datasets[job] = ids
        self.left[job] = 0
        if start:
            self.start_epoch(job)

    def remove_job(self, job: Hashable) -> np.ndarray:
        """Delete ``job``: its bit leaves every mask (vertices merge). Returns the ids it
        still needed, whose references the cache should release."""
        needed = self.end_epoch(job)
        del self.bit[job], self.datasets[job], self.left[job]
        return needed

    def end_epoch(self, job: Hashable) -> np.ndarray:
        """The job reads nothing more this epoch; returns the ids it had left."""
        b = 1 << self._bit(job)
        self.left[job] = 0
        return self._drop_bit(b)

    def start_epoch(self, job: Hashable, ids: np.ndarray | None = None) -> None:
        """The job needs its whole dataset again (what it had left is dropped), or only
        ``ids`` of it (a job resuming an epoch it had partly read)."""
        if self.left[job]:
            self.end_epoch(job)
        ids = as_ids(self.datasets[job] if ids is None else ids)
        self.left[job] = int(ids.size)
        self.mask[distinct_index(ids, ids)] |= np.uint64(1 << self._bit(job))
        self._regroup()

    def _bit(self, job: Hashable) -> int:
        try:
            return self.bit[job]
        except KeyError:
            raise ConfigError(f"unknown job {job!r}") from None

    def _regroup(self) -> None:
        """Rebuild the buckets from the masks (after an insertion, deletion or epoch): each
        bucket holds its ids in increasing order."""
        self.buckets = {}
        self._version += 1
        narrow = self.mask.size and self.mask.max() < 1 << 16  # up to 16 jobs' bits
        if narrow:
            found = np.flatnonzero(np.bincount(self.mask.astype(np.uint16))[1:]) + 1
            if found.size <= SCAN_MASKS:  # few masks: one pass each (14M ids: 0.3 s)
                for m in found.tolist():
                    self._fill(m, nonzero_as(self.mask == m, self.dtype))
                return
        live = nonzero_as(self.mask, self.dtype)
        if not live.size:
            return
        masks = self.mask[live]  # narrow: numpy's radix sort of uint16, 3x faster
        order = np.argsort(masks.astype(np.uint16) if narrow else masks, kind="stable")
        live, masks = live[order], masks[order]
        cuts = np.flatnonzero(np.diff(masks)) + 1
        for seg_ids, m in zip(np.split(live, cuts), masks[np.r_[0, cuts]], strict=True):
            self._fill(int(m), seg_ids)

    def _fill(self, m: int, ids: np.ndarray) -> None:
        """Bucket ``m`` holds ``ids``, in that order."""
        bucket = self.buckets[m] = array(self._code)
        bucket.frombytes(memoryview(np.ascontiguousarray(ids, self.dtype)).cast("B"))
        self._number(ids, 0)

    def _number(self, ids: np.ndarray, start: int) -> None:
        """``pos[ids] = start, start + 1, ...``, a block at a time (no array of 14M
        numbers to fault in at every epoch start)."""
        for lo in range(0, ids.size, BLOCK):
            part = ids[lo : lo + BLOCK]
            self.pos[part] = np.arange(start + lo, start + lo + part.size, dtype=self.dtype)

    def _drop_bit(self, b: int) -> np.ndarray:
        """Clear bit ``b`` everywhere: each bucket that has it merges into the bucket
        without it (Figure 4b's merge), in O(buckets + moved ids). Returns the ids, in no
        particular order (their references are given back)."""
        moved = []
        self._version += 1
        for m in [m for m in self.buckets if m & b]:
            arr = np.frombuffer(self.buckets.pop(m), self.dtype)  # of a bucket gone
            moved.append(arr)
            if m == b:  # nobody else needs them
                self.mask[arr] = 0
                continue
            dst = self.buckets.setdefault(m & ~b, array(self._code))
            self.mask[arr] = m & ~b
            self._number(arr, len(dst))
            dst.frombytes(memoryview(arr).cast("B"))
        return np.concatenate(moved).astype(np.int64) if moved else np.zeros(0, np.int64)

    def _clear(self, e: int, bits: int) -> None:
        """Element ``e`` was read by the jobs of ``bits``: move it to its new bucket."""
        mask, pos, buckets = self._mask_mv, self._pos_mv, self.buckets
        old = mask[e]
        lst = buckets[old]
        k = pos[e]
        last = lst.pop()
        if last != e:
            lst[k] = last
            pos[last] = k
        if not lst:
            del buckets[old]
            self._version += 1
        new = old & ~bits
        mask[e] = new
        if new:
            dst = buckets.get(new)
            if dst is None:
                dst = buckets[new] = array(self._code)
                self._version += 1
            pos[e] = len(dst)
            dst.append(e)

    # -- the tree ------------------------------------------------------------------------
    def _sorted(self, jobs: Iterable[Hashable] | None) -> list[Hashable]:
        names = list(self.bit) if jobs is None else list(dict.fromkeys(jobs))
        for j in names:
            self._bit(j)
        live = (j for j in names if self.left[j] > 0)
        return sorted(live, key=lambda j: (self.left[j], self.bit[j]))

    def _levels(self, order: list[Hashable]) -> Levels:
        """For jobs in ``order``: the job bits, and per level l the buckets (their id
        arrays) of vertex V_l and of J_l's leaf. Kept while the order and the set of
        buckets stay (a bucket's array changes in place; one made or dropped bumps
        ``_version``)."""
        key, version, levels = self._cached_levels
        if version == self._version and key == tuple(order):
            return levels
        bits = [1 << self.bit[j] for j in order]
        m = len(order)
        suffix = [0] * (m + 1)
        for k in range(m - 1, -1, -1):
            suffix[k] = suffix[k + 1] | bits[k]
        part = suffix[0]
        vertex: list[list[array]] = [[] for _ in range(m)]
        leaf: list[list[array]] = [[] for _ in range(m)]
        for mask, ids in self.buckets.items():
            c = mask & part
            if not c:
                continue
            t = m  # the first level l whose group G_l the mask contains
            for k in range(m):
                if c & suffix[k] == suffix[k]:
                    t = k
                    break
            if t < m:
                vertex[t].append(ids)
            for k in range(min(t, m)):  # J_k needs it but does not share it with all of G_k
                if c & bits[k]:
                    leaf[k].append(ids)
        self._cached_levels = (tuple(order), self._version, (bits, vertex, leaf))
        return bits, vertex, leaf

    def vertices(self, jobs: Iterable[Hashable] | None = None) -> list[Vertex]:
        """Definition 1's tree for ``jobs`` (default: all with something left), as the
        rightmost path (intersections) followed by the leaves (differences)."""
        order = self._sorted(jobs)
        _, vertex, leaf = self._levels(order)
        out = []
        for kind, groups in (("intersection", vertex), ("difference", leaf)):
            for k, buckets in enumerate(groups):
                ids = [np.frombuffer(b, self.dtype) for b in buckets]
                ids = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
                jobs_k = tuple(order[k:]) if kind == "intersection" else (order[k],)
                out.append(Vertex(kind, jobs_k, np.sort(ids)))
        return out

    def _pick(self, buckets: list[array], total: int | None = None) -> int:
        """A uniform element of the union of ``buckets`` (``total`` ids)."""
        if total is None:
            total = sum(map(len, buckets))
        # ``randrange(total)``'s draw (rejection from ``getrandbits``), without its calls
        bits, below = total.bit_length(), self._rng.getrandbits
        r = below(bits)
        while r >= total:
            r = below(bits)
        for ids in buckets:
            if r < len(ids):
                return ids[r]
            r -= len(ids)
        raise AssertionError("unreachable")

    # -- sampling ------------------------------------------------------------------------
    def round(self, jobs: Iterable[Hashable] | None = None) -> dict[Hashable, int]:
        """One element for each of ``jobs`` (default: all) that has something left this
        epoch (Algorithm 1 then 2). Jobs that took the same intersection get the same id."""
        order = self._sorted(jobs)
        return self._round(order) if order else {}

    def rounds(self, jobs: Iterable[Hashable], n: int) -> list[dict[Hashable, int]]:
        """``n`` rounds over ``jobs`` as ``n`` calls of ``round`` would draw them, but at
        most as many as the job with least left has (none runs out before the last)."""
        picks = {j: e.tolist() for j, e in self.picks(jobs, n).items()}
        return [dict(zip(picks, col, strict=True)) for col in zip(*picks.values(), strict=True)]

    def picks(self, jobs: Iterable[Hashable], n: int) -> dict[Hashable, np.ndarray]:
        """``rounds(jobs, n)`` as each job's elements in order (every round takes one
        from each job with something left). The jobs are sorted once: each round takes
        one element from each, so their order holds. Runs of rounds where the jobs are in
        step, or two jobs out of step, are drawn at once (``_rounds_at_once``: rounds of
        the same law, their own draws), then a round at a time where V_0 is one bucket
        (``_rounds_in_step``: ``round``'s draws), else by ``round``."""
        order = self._sorted(jobs)
        n = min([n] + [self.left[j] for j in order]) if order else 0
        parts: list[list] = [[] for _ in order]  # per job: runs of its elements
        done = 0
        while done < n:
            step = self._rounds_at_once(order, n - done, parts)
            if not step:
                lists: list[list[int]] = [[] for _ in order]
                step = self._rounds_in_step(order, n - done, lists)
                if not step:
                    break
                for part, got in zip(parts, lists, strict=True):
                    part.append(got)
            done += step
        if done < n:
            rest = [self._round(order) for _ in range(n - done)]
            for part, j in zip(parts, order, strict=True):
                part.append([r[j] for r in rest])
        return {
            j: np.concatenate([np.asarray(p, np.int64) for p in part]) if part else
            np.zeros(0, np.int64) for j, part in zip(order, parts, strict=True)
        }  # fmt: skip

    def _v0_alone(self, order: list[Hashable]) -> tuple[list[int], array, int] | None:
        """(the jobs' bits, V_0's bucket, their mask) where V_0, the elements every job of
        ``order`` needs, is one bucket that no other job needs; else ``None``."""
        bits, vertex, _ = self._levels(order)
        if len(vertex[0]) != 1:
            return None
        bucket, group = vertex[0][0], sum(bits)  # distinct bits
        return (bits, bucket, group) if self._mask_mv[bucket[0]] == group else None

    def _rounds_at_once(self, order: list[Hashable], n: int, parts: list[list]) -> int:
        """Up to ``n`` rounds in numpy (``bucket_draws``), where V_0 is one bucket of the
        elements every job of ``order`` needs and no bucket drawn from can run out:
        jobs in step (each has only V_0 left: every job takes it, line 9's probability
        being 1, and all share a uniform element of it), or two jobs that need nothing
        but V_0 and their own buckets (one joined mid-epoch). For those, each round J_0
        takes V_0 with probability |V_0| / |R_0| (``first_takes``); then J_1 with
        |R_0| / |R_1| (they share a uniform element of V_0), or it reads a uniform element
        of its own, where J_0's element takes its place (it needs only J_1 now); where
        J_0 does not take V_0, it reads a uniform element of its own and J_1 of its own.
        The law of ``round``'s rounds, with draws of their own. Appends each job's run to
        its part; returns the rounds made (0: none drawn here)."""
        if n < self.at_once_min:
            return 0
        found = self._v0_alone(order)
        if found is None:
            return 0
        bits, shared, group = found
        v, lefts, rng = len(shared), [self.left[j] for j in order], self._draws
        if all(x == v for x in lefts):  # in step
            k = min(n, v - 1)
            if k < self.at_once_min:
                return 0
            read = take(shared, self.pos, rng.integers(0, v - np.arange(k)))
            self.mask[read] = 0
            for part in parts:
                part.append(read)
        else:
            if len(order) != 2 or any(m & ~group for m in self.buckets):
                return 0
            own = [self.buckets.get(b) for b in bits]
            a, b = (len(x) if x is not None else 0 for x in own)
            if lefts != [v + a, v + b]:
                return 0
            k = min(n, v - 1, a - 1 if a else n, b - 1 if b else n)
            if k < self.at_once_min:
                return 0
            t = np.arange(k)
            u = rng.random((2, k))
            first = first_takes(u[0], lefts[0] - t, v)  # J_0 takes V_0
            both = first & (u[1] * (lefts[1] - t) < lefts[0] - t)  # and J_1 shares it
            apart = ~both  # J_1 reads its own bucket
            alone = ~first  # J_0 reads its own
            j0 = np.empty(k, np.int64)
            j0[first] = take(shared, self.pos, rng.integers(0, v - np.arange(first.sum())))
            if alone.any():
                j0[alone] = take(own[0], self.pos, rng.integers(0, a - np.arange(alone.sum())))
            j1 = j0.copy()
            if apart.any():  # J_0's element of V_0, read alone, takes the place of J_1's
                removes = alone[apart]
                puts = np.where(removes, REMOVE, j0[apart])
                self.mask[j0[first & apart]] = bits[1]
                left = b - (np.cumsum(removes) - removes)
                j1[apart] = take(own[1], self.pos, rng.integers(0, left), puts)
                self.mask[j1[apart]] = 0
            self.mask[j0[both | alone]] = 0
            parts[0].append(j0)
            parts[1].append(j1)
        for j in order:
            self.left[j] -= k
        return k

    def _rounds_in_step(self, order: list[Hashable], n: int, lists: list[list[int]]) -> int:
        """Up to ``n`` rounds while V_0, the elements every job of ``order`` needs, is one
        bucket that no other job needs (jobs in step on one dataset, or nearly): each job
        draws line 9 in turn and, where all take V_0, they share a uniform element of it
        that nobody needs after (``_pick``'s draw, ``_clear``'s swap-remove: the draws and
        the state of ``_round``, without its tree); a round where one does not take it is
        finished by ``_round``, or here for two jobs whose elements lie in V_0 and in
        each one's own bucket (one joined the other mid-epoch): J_0 takes V_0 alone, or
        its own, and J_1 its own. Appends each job's element to its list (``lists`` in
        ``order``); returns the rounds made (until a bucket empties)."""
        found = self._v0_alone(order)
        if found is None:
            return 0
        bits, bucket, group = found
        mask = self._mask_mv
        left, rand, below, pos = self.left, self._rng.random, self._rng.getrandbits, self._pos_mv
        lefts, m = [left[j] for j in order], len(order)
        own: list[array | None] = [None, None]  # the two jobs' own buckets, where they are
        if m == 2 and not any(b & ~group for b in self.buckets):
            own = [self.buckets.get(b) for b in bits]
        for done in range(n):
            c = total = len(bucket)
            took = 0
            while took < m and rand() * lefts[took] < c:  # line 9, S empty
                c = lefts[took]
                took += 1
            if took < m and own[1] and (took or own[0]):  # two jobs: J_1 takes its own
                src = bucket if took else own[0]  # J_0 took V_0 alone, or takes its own
                size = len(src)
                r = below(size.bit_length())
                while r >= size:
                    r = below(size.bit_length())
                e = src[r]
                rand()  # J_1's line 9 for its own vertex: taken (it holds all it has left)
                dst = own[1]
                r = below(len(dst).bit_length())
                while r >= len(dst):
                    r = below(len(dst).bit_length())
                f = dst[r]
                last = src.pop()  # ``_clear(e)``, then ``_clear(f)``: inline, as ``_pick``'s draws
                # above (calling both measured 15% more per planned sample out of step)
                if last != e:
                    src[pos[e]] = last
                    pos[last] = pos[e]
                if took:  # e now needs only J_1: it ends in f's place
                    dst[r], pos[e], mask[e] = e, r, bits[1]
                else:
                    mask[e] = 0
                    last = dst.pop()
                    if last != f:
                        dst[r] = last
                        pos[last] = r
                mask[f] = 0
                lists[0].append(e)
                lists[1].append(f)
                lefts = [lefts[0] - 1, lefts[1] - 1]
                if not src or not dst:  # a bucket emptied: the caller goes on
                    for b, lst in ((group if took else bits[0], src), (bits[1], dst)):
                        if not lst and self.buckets.get(b) is lst:
                            del self.buckets[b]
                            self._version += 1
                    left.update(zip(order, lefts, strict=True))
                    return done + 1
            elif took < m:  # J_took does not take V_0: the tree finishes the round
                left.update(zip(order, lefts, strict=True))
                picked = self._round(order, drawn=took)
                for j, got in zip(order, lists, strict=True):
                    got.append(picked[j])
                lefts = [left[j] for j in order]
            else:
                width = total.bit_length()
                r = below(width)
                while r >= total:
                    r = below(width)
                e = bucket[r]
                last = bucket.pop()  # ``_clear`` inlined (a call per round costs 15%)
                if last != e:
                    bucket[r] = last
                    pos[last] = r
                mask[e] = 0
                for got in lists:
                    got.append(e)
                lefts = [v - 1 for v in lefts]
            if not bucket:  # V_0 is all read: the tree from here
                if self.buckets.get(group) is bucket:  # not dropped by ``_clear``
                    del self.buckets[group]
                    self._version += 1
                left.update(zip(order, lefts, strict=True))
                return done + 1
        left.update(zip(order, lefts, strict=True))
        return n

    def _round(self, order: list[Hashable], drawn: int | None = None) -> dict[Hashable, int]:
        """A round over ``order`` (``_sorted``'s: jobs with something left). ``drawn``:
        the first jobs' draws of line 9 for V_0 were made, and that many took it."""
        bits, vertex, leaf = self._levels(order)
        left, rand = self.left, self._rng.random
        out: dict[Hashable, int] = {}
        reads: list[tuple[int, int]] = []  # (element, bits of the jobs that took it)
        k, s, s_level, m = 0, 0, 0, len(order)  # first undecided job; S = V_0..V_{s_level-1}
        while k < m:
            i_buckets = vertex[k] if s_level == k else sum(vertex[s_level : k + 1], [])
            c = inter = sum(map(len, i_buckets))  # |I|, I = V_{s_level} .. V_k
            took = k
            if drawn is not None:  # made: J_drawn did not take V_0
                took, drawn = drawn, None
            else:
                while took < m:  # line 9: J takes I with probability c / (|R_J| - |S|)
                    denom = left[order[took]] - s
                    if rand() * denom >= c:
                        break
                    c = denom  # line 13
                    took += 1
            if took > k:  # J_k .. J_{took-1} share one element of I (Algorithm 2)
                e = self._pick(i_buckets, inter)
                group = 0
                for q in range(k, took):
                    out[order[q]] = e
                    group |= bits[q]
                reads.append((e, group))
            else:  # nobody took I: J_k samples its own difference (lines 16-19)
                e = self._pick(leaf[k])
                out[order[k]] = e
                reads.append((e, bits[k]))
                took = k + 1
            s += inter  # line 20: S = S + I
            s_level, k = k + 1, took
        for e, group in reads:  # after the round: the tree stays fixed while it is walked
            self._clear(e, group)
        for j in out:
            left[j] -= 1
        return out
