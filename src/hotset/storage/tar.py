"""WebDataset tar shards, read per sample by byte range.

Each shard is indexed from its tar headers alone (``tarfile`` seeks from header to
header; no payload is read): member name, data offset and size. Members are grouped into
samples as WebDataset groups them: consecutive members sharing a key, the basename up to
its first dot (``n01440764_10026.jpg`` + ``n01440764_10026.cls`` is one sample with fields
``jpg`` and ``cls``). The index is kept in the user's index cache (``index_cache.py``),
one per shard, named by the shard's URL, size and version.

A sample's members (with their headers and padding) are one byte range of its shard, and
the next sample's range starts where it ends; a batch's misses in one shard are
read as few range requests (neighbours merged when the gap between them costs less than a
request, ``merge_gap``), in one call per batch (``io/reader.py``). A sample is served as a
record of its fields (``records.py``) whose size the index knows exactly.
"""

from __future__ import annotations

import glob as globlib
import io
import json
import posixpath
import re
import tarfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fsspec
import numpy as np

from hotset.codecs import IMAGE_FIELDS, INT_FIELDS
from hotset.errors import (
    ConfigError,
    CorruptSampleError,
    MissingSampleError,
    ShardError,
    StorageError,
)
from hotset.ids import ids_within
from hotset.io.reader import Retry, T, read_failure, remote_call
from hotset.io.requests import CostModel, coalesce
from hotset.progress import progress
from hotset.storage import column_file
from hotset.storage.base import TAG, FsspecStorage, concurrency_for
from hotset.storage.columns import DigestColumn, StringColumn
from hotset.storage.files import _version
from hotset.storage.formats import Format, register_format
from hotset.storage.index_cache import cached_mapped, cached_path, index_path
from hotset.storage.manifest import LOCATION_KIND, Manifest, location_digest
from hotset.storage.records import check_fields, encode_record, record_size

#: a remote shard this small is indexed from one read of it (a request per member header
#: costs a round trip each: 20 s a 250-sample shard behind 20 ms); larger ones in blocks
WHOLE_SHARD_BYTES = 64 << 20
INDEX_BLOCK = 8 << 20
#: remote shards indexed at once (at least; the storage's ``concurrency`` if higher)
INDEX_THREADS = 8
#: indexing at least this many shards shows its progress
PROGRESS_SHARDS = 32

#: WebDataset's split of a member name into the sample's key and the field's name
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")


def index_shard(fileobj, url: str) -> list[list]:
    """``[[key, header offset, [[field, data offset, size], ...]], ...]`` of a tar read
    from headers only (``tarfile`` seeks over payloads). A tar that does not end in
    tar's end-of-archive block (cut at a member boundary, or mid-header: ``tarfile``
    stops there without a word) or whose last payload is cut raises the shard's ``ShardError``."""
    samples: list[list] = []
    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as tf:
            for info in tf:
                if not info.isfile():
                    continue
                m = _KEY_EXT.match(info.name)
                if m is None or posixpath.basename(info.name).startswith("__"):
                    continue
                key, field = m.group(1), m.group(2).lower()
                if not samples or samples[-1][0] != key:
                    samples.append([key, info.offset, []])
                samples[-1][2].append([field, info.offset_data, info.size])
            fileobj.seek(tf.offset)
            end = fileobj.read(512)
    except tarfile.ReadError as exc:
        if "empty file" in str(exc):
            raise ShardError(url, "empty", "0 bytes") from None
        kind = "truncated" if samples or "unexpected end" in str(exc) else "not a tar"
        raise ShardError(url, kind, f"{exc}, after {len(samples)} samples") from None
    if len(end) < 512:
        raise ShardError(url, "truncated", (
            f"ends at byte {tf.offset + len(end)}, after {len(samples)} samples, "
            + ("mid-header" if end else "without tar's end-of-archive block")
            + ": was its upload cut short?"))  # fmt: skip
    if end.count(0) != 512:
        raise ShardError(url, "not a tar", f"a corrupt header at byte {tf.offset}")
    return samples


def shard_arrays(url: str, samples: list[list], version: str) -> dict:
    """A shard's index: per sample its name (a ``StringColumn``), key (a ``DigestColumn``
    of the shard's URL and ``version``, its size and ETag or mtime: ``fingerprint``, and
    the sample's place), byte range (from its first header to its last payload's padding,
    so that the next sample's range starts where it ends) and record size; per member its
    field, offset in the range and size."""
    fields: dict[str, int] = {}
    m_field, m_off, m_size, m_ptr, start, end, sizes, keys = [], [], [], [0], [], [], [], []
    for key, lo, members in samples:
        hi = -(-max(off + size for _, off, size in members) // 512) * 512
        for field, off, size in members:
            m_field.append(fields.setdefault(field, len(fields)))
            m_off.append(off - lo)
            m_size.append(size)
        m_ptr.append(len(m_field))
        start.append(lo)
        end.append(hi)
        sizes.append(record_size((f, n) for f, _, n in members) + TAG)
        keys.append(location_digest(url, version, key, lo, hi))
    i64 = np.int64
    return {
        "names": StringColumn(key for key, _, _ in samples),
        "keys": DigestColumn.of_raw(np.frombuffer(b"".join(keys), np.uint8)),
        "start": np.asarray(start, i64), "end": np.asarray(end, i64),
        "sizes": np.asarray(sizes, i64), "m_ptr": np.asarray(m_ptr, i64),
        "m_field": np.asarray(m_field, np.int16), "m_off": np.asarray(m_off, i64),
        "m_size": np.asarray(m_size, i64), "fields": np.asarray(list(fields), dtype=str),
    }  # fmt: skip


def shard_records(data: bytes, arrays: dict) -> dict[str, bytes]:
    """Each sample's record (as ``TarStorage.read_many`` gives it), by key, from a whole
    shard's bytes and its index."""
    start, ptr, fields = arrays["start"], arrays["m_ptr"], arrays["fields"].tolist()
    m_field, m_off, m_size = arrays["m_field"], arrays["m_off"], arrays["m_size"]
    out = {}
    for j, key in enumerate(arrays["keys"]):
        lo, a, b = int(start[j]), int(ptr[j]), int(ptr[j + 1])
        out[key] = encode_record({
            fields[f]: data[lo + o : lo + o + n]
            for f, o, n in zip(m_field[a:b].tolist(), m_off[a:b].tolist(), m_size[a:b].tolist(),
                               strict=True)
        })  # fmt: skip
    return out


def index_file(url: str, samples: list[list], version: str) -> bytes:
    """A shard's index (``shard_arrays``) as the index cache keeps it."""
    return index_bytes(shard_arrays(url, samples, version))


def index_bytes(arrays: dict) -> bytes:
    """``arrays`` as an ``.npz`` of plain arrays: the names' UTF-8 text back to back and
    their ends, the keys' 16 raw bytes each (read back with no Python string per sample)."""
    plain = {k: v for k, v in arrays.items() if k not in ("names", "keys")}
    names = arrays["names"]
    buf = io.BytesIO()
    np.savez(buf, name_text=np.frombuffer(names._blob, np.uint8), name_ends=names._ends,
             keys=arrays["keys"].raw, **plain)  # fmt: skip
    return buf.getvalue()


def load_index(source: bytes | Path) -> dict:
    """An index ``index_bytes`` wrote (its bytes, or the file), names and keys as columns."""
    with np.load(io.BytesIO(source) if isinstance(source, bytes) else source) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["names"] = StringColumn._of(arrays.pop("name_text"), arrays.pop("name_ends"))
    arrays["keys"] = DigestColumn.of_raw(arrays["keys"])
    return arrays


#: the index cache's kind for tar shards (its keys name the shard's version)
INDEX_KIND = "tar-v3"
#: the kind before it (names and keys as numpy text), converted where it is found
OLD_INDEX_KIND = "tar-v2"


def shard_indexed(url: str, version: str) -> bool:
    """Whether shard ``url``'s index as of ``version`` is cached (of either kind)."""
    return any(index_path(k, url, version).exists() for k in (INDEX_KIND, OLD_INDEX_KIND))


def cached_shard_index(url: str, version: str, build: Callable[[], bytes]) -> Path:
    """The file of shard ``url``'s index as of ``version``: in the cache, converted from
    the kind before it where that is cached (no read of the shard), else ``build()`` and
    kept."""
    old = index_path(OLD_INDEX_KIND, url, version)

    def converted() -> bytes:
        if not old.exists():
            return build()
        with np.load(old) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["names"] = StringColumn(arrays["names"].tolist())
        arrays["keys"] = DigestColumn(arrays["keys"].tolist())
        data = index_bytes(arrays)
        old.unlink(missing_ok=True)
        return data

    return cached_path(INDEX_KIND, url, version, converted)


#: the index cache's kind for a tar set's index: its shards' joined, mapped by every process
SET_INDEX_KIND = "tar-set-v1"


def write_set_index(path: Path, files: Sequence[Path], prefixes: Sequence[str]) -> None:
    """The shards' cached indexes (``files``) joined into one column file at ``path``
    (``column_file.py``): the fields of all, and each column with the shards' one after
    another (``shard``: each sample's; ``path_*``: its name after its shard's prefix;
    ``labels``: none). Two passes over the files, their lengths then their columns, each
    shard's written into its place in the file: no copy of the set's index in memory."""
    counts, members, text, shard_fields = [], [], [], []
    for f in files:
        with np.load(f) as z:
            ptr, ends = z["m_ptr"], z["name_ends"]
            counts.append(ptr.size - 1)
            members.append(int(ptr[-1]))
            text.append(int(ends[-1]) if ends.size else 0)
            shard_fields.append(z["fields"].tolist())
    fields = list(dict.fromkeys(f for names in shard_fields for f in names))
    codes = [np.asarray([fields.index(f) for f in names], np.int16) for names in shard_fields]
    heads = [len(p.encode()) for p in prefixes]
    n, m, i64 = sum(counts), sum(members), np.int64
    specs = {k: (i64, (n,)) for k in ("start", "end", "sizes", "labels", "shard", "path_ends")}
    specs.update(m_ptr=(i64, (n + 1,)), m_off=(i64, (m,)), m_size=(i64, (m,)),
                 m_field=(np.int16, (m,)), keys=(np.uint8, (n, 16)),
                 path_blob=(np.uint8, (sum(text) + int(np.dot(counts, heads)),)))  # fmt: skip
    out = column_file.Writer(path, specs, {"format": SET_INDEX_KIND, "fields": fields})
    out.put("m_ptr", 0, [0])
    a = b = t = 0
    try:
        for s, f in enumerate(files):
            arrays, k, j = load_index(f), counts[s], members[s]
            out.put("shard", a, np.full(k, s, i64))
            out.put("labels", a, np.full(k, -1, i64))
            for c in ("start", "end", "sizes"):
                out.put(c, a, arrays[c])
            out.put("m_ptr", a + 1, arrays["m_ptr"][1:] + b)
            out.put("m_off", b, arrays["m_off"])
            out.put("m_size", b, arrays["m_size"])
            out.put("m_field", b, codes[s][arrays["m_field"]])
            out.put("keys", a, arrays["keys"].raw)
            paths = arrays["names"].prefixed(prefixes[s])
            out.put("path_blob", t, np.frombuffer(paths._blob, np.uint8))
            out.put("path_ends", a, paths._ends + t)
            a, b, t = a + k, b + j, t + text[s] + k * heads[s]
    finally:
        out.close()


def member_header_matches(block: bytes, name: str, size: int) -> bool:
    """Whether ``block`` is the tar header of the member ``name`` (checked where the
    header holds the whole name) of ``size`` bytes: the check that a shard read at its
    indexed offsets is still the shard that was indexed (a range read includes each
    member's header: it costs no request)."""
    if len(block) != 512:
        return False
    try:  # (tarfile's own parse of a header costs 20 us; these few fields, 3)
        checksum = int(block[148:156].rstrip(b" \0").lstrip(b" ") or b"-1", 8)
        stored = int(block[124:136].rstrip(b" \0").lstrip(b" ") or b"0", 8)
    except ValueError:  # a size in base-256 (over 8 GiB), or not a header
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            return False
        checksum, stored = sum(block) - sum(block[148:156]) + 256, info.size
    if checksum != sum(block) - sum(block[148:156]) + 256 or stored != size:
        return False
    raw = block[:100].split(b"\0", 1)[0]
    if len(raw) >= 99 or block[345:346] not in (b"", b"\0"):
        return True  # a long or prefixed name: the size and checksum are what is checked
    return raw.decode("utf-8", "surrogateescape").lower() == name.lower()


def fingerprint(info: dict) -> str:
    """What a shard's cached index is keyed by beside its URL: its size and version."""
    return f"{info.get('size')}:{_version(info)}"


def chosen_fields(
    fields: list[str], input_field: str | Sequence[str] | None,
    target_field: str | Sequence[str] | None,
) -> tuple:  # fmt: skip
    """The fields a batch's inputs and targets come from: those given (each checked to be
    one of ``fields``), else the first image field and the first integer field."""
    where = "the shards' fields"
    return (
        check_fields("input_field", input_field, fields, where)
        or next((f for f in fields if f in IMAGE_FIELDS), None),
        check_fields("target_field", target_field, fields, where)
        or next((f for f in fields if f in INT_FIELDS), None),
    )


def locate_shards(
    url: str | Sequence[str], storage_options: dict, retry: Retry
) -> tuple[fsspec.AbstractFileSystem, list[str], list[str]]:
    """The filesystem of the shards ``url`` names, their URLs and their paths on it."""
    if not isinstance(url, str) and not url:
        raise ConfigError("TarStorage: no shards given")
    fs = fsspec.core.url_to_fs(url if isinstance(url, str) else url[0], **storage_options)[0]
    urls = shard_urls(url, fs, retry)
    return fs, urls, [fsspec.core.url_to_fs(u, **storage_options)[1] for u in urls]


def shard_urls(
    url: str | Sequence[str], fs: fsspec.AbstractFileSystem, retry: Retry | None = None
) -> list[str]:
    """The shards a URL names: a list, a ``{000..009}`` range or glob, a ``.tar`` file, or
    a directory of them (sorted; the listing retried as ``retry`` says, its failure a
    ``ShardError`` naming the URL)."""
    if not isinstance(url, str):
        return [str(u) for u in url]
    protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
    braces = re.fullmatch(r"(.*)\{(\d+)\.\.(\d+)\}(.*)", url)
    if braces:  # WebDataset's brace notation, zero-padded as written
        head, lo, hi, tail = braces.groups()
        return [f"{head}{i:0{len(lo)}d}{tail}" for i in range(int(lo), int(hi) + 1)]
    path = fs._strip_protocol(url)

    def listing() -> list[str] | None:
        if globlib.has_magic(path):
            return sorted(fs.glob(path))
        if fs.isdir(path):
            return sorted(p for p in fs.find(path) if p.endswith(".tar"))
        return None

    found = remote_call(fs, url, listing, retry or Retry())
    if found is None:
        return [url]
    if not found:
        raise ConfigError(f"{url}: no .tar shards found")
    return [p if "://" in p else protocol + p for p in found]


class TarStorage(FsspecStorage):
    """Samples of WebDataset tar shards at ``url`` (any fsspec URL: local, ``s3://``,
    ``http://``; a directory, a glob, ``shard-{000..099}.tar`` or a list), each sample read
    by range. ``input_field`` / ``target_field``: the field a batch's inputs and targets
    come from, or a list of fields (each sample's a dict of them; default: the first
    image field, and ``cls`` when the shards have one); the other fields stay in the
    sample for a ``collate_fn``.

    ``merge_gap``: a fixed gap (bytes) to read through; by default the gap follows the
    latency the planner measures, ``cost`` (default: 10 ms per request remote, 0.2 ms
    local, 100 MB/s shared by ``concurrency`` requests) its prior. ``concurrency``: range
    requests in flight per process (default: 32 on an object store, 8 on local files);
    ``node_concurrency``: in flight across the processes (``FsspecStorage``). ``keep``:
    called with the records (by key) of a remote shard read whole (the disk tier keeps
    them, so they are not read again) where ``wants(first key, bytes)`` says so (the
    tier lacks them and has room): a shard read whole to index it, and one whose index is
    cached, read whole for it (a fresh disk tier fills as it would with the index cold)."""

    content_keyed = False

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        concurrency: int | None = None,
        node_concurrency: int | None = None,
        storage_options: dict | None = None,
        retry: Retry | None = None,
        merge_gap: int | None = None,
        cost: CostModel | None = None,
        input_field: str | Sequence[str] | None = None,
        target_field: str | Sequence[str] | None = None,
        keep: Callable[[dict[str, bytes]], object] | None = None,
        wants: Callable[[str, int], bool] | None = None,
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self._keep, self._wants = keep, wants
        self.retry = retry or Retry()
        fs, self.urls, self._paths = locate_shards(url, self.storage_options, self.retry)
        self.concurrency = concurrency_for(fs, concurrency)
        self.url = url if isinstance(url, str) else url[0]
        if merge_gap is None:  # the planner measures the latency, this is its prior
            local = "file" in fs.protocol
            self.cost = cost or CostModel(0.2 if local else 10.0, in_flight=self.concurrency)
            self.merge_gap = self.cost.merge_gap
        else:
            self.merge_gap = int(merge_gap)
        self._fs = fs
        self._bound_node(node_concurrency)
        self.index_retries = 0
        self._versions: dict[str, str] = {}  # each shard's, as indexed
        local = "file" in fs.protocol
        with ThreadPoolExecutor(1 if local else max(self.concurrency, INDEX_THREADS)) as pool:
            files = list(progress(
                pool.map(self._index, self.urls, self._paths), len(self.urls),
                "indexing tar shards" if local else
                "indexing tar shards (make_loader(first_epoch='stream') trains meanwhile)",
                "shards", enabled=len(self.urls) >= PROGRESS_SHARDS,
            ))  # fmt: skip
        header, index = self._set_index_of(url, files)
        if not index["sizes"].size:
            raise ConfigError(f"{url}: the shards hold no samples")
        self.fields = header["fields"]
        self._shard, self._start, self._end = index["shard"], index["start"], index["end"]
        self._m_ptr, self._m_off, self._m_size = index["m_ptr"], index["m_off"], index["m_size"]
        self._m_field = index["m_field"]
        self.input_field, self.target_field = chosen_fields(self.fields, input_field, target_field)
        self.manifest = Manifest(
            StringColumn._of(index["path_blob"], index["path_ends"]),
            DigestColumn.of_raw(index["keys"]), index["sizes"], index["labels"], [],
            posixpath.basename(self.url.rstrip("/")), LOCATION_KIND,
        )  # fmt: skip

    def _set_index_of(self, url, files: list[Path]) -> tuple[dict, dict[str, np.ndarray]]:
        """The set's index (``write_set_index``) from the index cache, mapped; made from
        the shards' ``files`` where it is missing or damaged."""
        prefixes = [posixpath.basename(p) + "#" for p in self._paths]

        def mapped(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
            self._set_index = path
            return column_file.map_file(path, SET_INDEX_KIND, "a tar set's index")

        return cached_mapped(
            SET_INDEX_KIND, url if isinstance(url, str) else "\n".join(self.urls),
            json.dumps([[u, self._versions[u]] for u in self.urls]),
            lambda tmp: write_set_index(tmp, files, prefixes), mapped, str(url),
        )  # fmt: skip

    def _index(self, url: str, path: str) -> Path:
        """The file of one shard's index (``shard_arrays``), from the cache or made from
        its headers; each request retried as ``retry`` says, a failure raised as the
        shard's ``ShardError``."""
        remote = "file" not in self._fs.protocol
        info = self._call(url, lambda: self._fs.info(path))
        size = info.get("size")

        whole = remote and (size or 0) <= WHOLE_SHARD_BYTES

        def read_whole() -> bytes:
            data = self._call(url, lambda: self._fs.cat_file(path))
            if size is not None and len(data) != size:
                raise ShardError(url, "cut off", f"{len(data)} of {size} bytes came")
            return data

        def build() -> bytes:
            if not remote:
                with open(path, "rb") as f:
                    samples = index_shard(f, url)
            elif whole:  # one request, not one a header
                data = read_whole()
                samples = index_shard(io.BytesIO(data), url)
                if self._keep is not None:  # its samples, read already: not read again
                    arrays = shard_arrays(url, samples, version)
                    if self._wanted(arrays["keys"], len(data)):
                        self._keep(shard_records(data, arrays))
                    built.append(url)
            else:  # large blocks, read ahead: a few requests a shard

                def blocks() -> list[list]:
                    with self._fs.open(path, "rb", block_size=INDEX_BLOCK,
                                       cache_type="readahead") as f:  # fmt: skip
                        return index_shard(f, url)

                samples = self._call(url, blocks)
            return index_file(url, samples, version)

        version = fingerprint(info)
        self._versions[url] = version
        built: list[str] = []
        file = cached_shard_index(url, version, build)
        if whole and not built and self._keep is not None:  # the index cached, not the bytes
            arrays = load_index(file)
            if self._wanted(arrays["keys"], size or 0):
                self._keep(shard_records(read_whole(), arrays))
        return file

    def _wanted(self, keys: DigestColumn, nbytes: int) -> bool:
        """Whether a shard of ``keys`` read whole (``nbytes``) is to be kept."""
        return bool(len(keys)) and (self._wants is None or self._wants(str(keys[0]), nbytes))

    def _call(self, url: str, call: Callable[[], T]) -> T:
        return remote_call(self._fs, url, call, self.retry, self._count_retry)

    def _count_retry(self) -> None:
        self.index_retries += 1

    @property
    def extents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._shard, self._start, self._end

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(self.urls)

    def describe(self, i: int) -> str:
        return f"{self.urls[self._shard[i]]}#{self.manifest.paths[i].split('#', 1)[1]}"

    def read_many(self, ids: Sequence[int]) -> list[bytes]:
        """Each sample's record; the samples of one shard in as few range requests as
        ``merge_gap`` allows, all of them in one call."""
        ids = np.asarray(ids, np.int64)
        if not ids_within(ids, len(self)):
            raise IndexError(f"sample ids out of range for {len(self)} samples")
        groups = coalesce(self._shard[ids], self._start[ids], self._end[ids], self.merge_gap)
        got = self.reader.read(
            [self._paths[g.object] for g in groups], [g.start for g in groups],
            [g.end for g in groups],
        )  # fmt: skip
        out: list[bytes] = [b""] * ids.size
        for g, data in zip(groups, got, strict=True):
            for pos in g.members:
                i = int(ids[pos])
                if isinstance(data, BaseException):
                    self._fail(i, data)
                lo = int(self._start[i]) - g.start
                if len(data) < lo + int(self._end[i] - self._start[i]):
                    raise CorruptSampleError(
                        i, self.describe(i), "the shard is shorter than its index says "
                        "(changed since it was indexed)", self.keys[i],
                    )  # fmt: skip
                a, b = self._m_ptr[i], self._m_ptr[i + 1]
                members = list(zip(self._m_field[a:b].tolist(), self._m_off[a:b].tolist(),
                                   self._m_size[a:b].tolist(), strict=True))  # fmt: skip
                key = self.manifest.paths[i].split("#", 1)[1]
                for f, o, n in members:
                    name = f"{key}.{self.fields[f]}"
                    if not member_header_matches(data[lo + o - 512 : lo + o], name, n):
                        self._changed(i, int(self._start[i]) + o - 512)
                out[pos] = encode_record({self.fields[f]: data[lo + o : lo + o + n]
                                          for f, o, n in members})  # fmt: skip
        return out

    def _changed(self, i: int, at: int) -> None:
        """Sample ``i``'s shard no longer has the member header its index says at byte
        ``at``: rewritten since it was indexed. Its cached index is dropped (the next
        loader indexes it again) and the sample is never served from these bytes."""
        url = self.urls[self._shard[i]]
        version = self._versions.get(url)
        if version is not None:
            index_path(INDEX_KIND, url, version).unlink(missing_ok=True)
        self._set_index.unlink(missing_ok=True)  # (its shards' sizes and versions are as they were)
        raise CorruptSampleError(
            i, self.describe(i), f"the shard changed since it was indexed (no member header "
            f"of the indexed size and name at byte {at}): make a new loader to index it again",
            self.keys[i],
        )  # fmt: skip

    def _fail(self, i: int, exc: BaseException) -> None:
        if isinstance(exc, FileNotFoundError):
            raise MissingSampleError(i, self.describe(i), "shard not found", self.keys[i]) from exc
        why = read_failure(exc, self.retry)
        raise StorageError(i, self.describe(i), why, self.keys[i]) from exc


register_format(Format("tar", TarStorage, suffix=".tar", indexes_whole=True))
