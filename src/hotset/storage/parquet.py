"""Tables as datasets: Parquet files (pyarrow) and Hugging Face ``datasets`` saved with
``save_to_disk`` (Arrow files). A sample is one row: its columns as a record of fields
(``records.py``; an ``Image`` column's ``bytes``), the batch's input and target taken by
column name (``input_field`` / ``target_field``).

Rows are read by piece: a Parquet row group (its column chunks fetched by range through
fsspec), an Arrow record batch (memory-mapped). A batch's misses in one piece are one
read; the last pieces read stay in a small per-process buffer (``buffer_bytes``) so the
next batches' misses in them cost no request. Labels come from the target column, read
alone when the table is opened (a small column; the image column is never pre-read).
Sizes are exact for Arrow tables and row-group averages for Parquet until read.

pyarrow is used without its thread pools (``use_threads=False``), and each process opens
the files itself: DataLoader workers are forked from a process that has read the tables.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Sequence

import fsspec
import numpy as np

from hotset.errors import ConfigError, StorageError
from hotset.ids import ids_within
from hotset.io.reader import Retry, transient
from hotset.storage.base import TAG, Storage
from hotset.storage.files import _version
from hotset.storage.formats import Format, register_format
from hotset.storage.manifest import LOCATION_KIND, Manifest, location_key
from hotset.storage.records import check_fields, encode_record

INPUT_NAMES = ("image", "img", "jpg", "png", "pixel_values", "input", "x")
TARGET_NAMES = ("label", "labels", "target", "cls", "class", "y")
_FIELD_OVERHEAD = 16  # a record field's name and headers, for sizes not known exactly


def _pa():
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:  # pragma: no cover - the extra names it
        raise ConfigError(
            "Parquet and Arrow tables need pyarrow: pip install 'hotset[parquet]'"
        ) from exc
    return pyarrow


def _cell(value):
    """A table cell as a record field: an ``Image`` struct's bytes, else the value."""
    if isinstance(value, dict) and "bytes" in value:
        return value["bytes"]
    return value


def _label_column(target_field, cols: list[str]) -> str | None:
    """The column the labels come from: the target's, where it is one column."""
    if target_field is None:
        return next((c for c in cols if c.lower() in TARGET_NAMES), None)
    return target_field if isinstance(target_field, str) and target_field in cols else None


class TableStorage(Storage):
    """Rows of pieces (subclasses: Parquet row groups, Arrow record batches)."""

    content_keyed = False

    def _setup(
        self, url: str, schema, columns, input_field, target_field, piece_rows: list[int],
        version: str, sizes: np.ndarray, labels: np.ndarray, classes: list[str],
    ) -> None:  # fmt: skip
        names = list(schema.names)
        self.columns = list(columns) if columns else names
        for c in self.columns:
            if c not in names:
                raise ConfigError(f"{url}: no column {c!r} (columns: {names})")
        pa = _pa()

        def bytes_like(c: str) -> bool:
            t = schema.field(c).type
            return pa.types.is_binary(t) or pa.types.is_large_binary(t) or (
                pa.types.is_struct(t) and t.get_field_index("bytes") >= 0
            )

        where = "the table's columns"
        self.input_field = check_fields("input_field", input_field, self.columns, where) or next(
            (c for c in self.columns if c.lower() in INPUT_NAMES),
            next((c for c in self.columns if bytes_like(c)), None),
        )
        self.target_field = check_fields(
            "target_field", target_field, self.columns, where
        ) or next((c for c in self.columns if c.lower() in TARGET_NAMES), None)
        starts = np.concatenate([[0], np.cumsum(piece_rows)]).astype(np.int64)
        self._piece_start = starts
        n = int(starts[-1])
        self._piece_of = np.repeat(np.arange(len(piece_rows), dtype=np.int32), piece_rows)
        self.manifest = Manifest(
            [f"row {r}" for r in range(n)],
            [location_key(url, version, r) for r in range(n)],
            sizes, labels, classes, posixpath.basename(url.rstrip("/")), LOCATION_KIND,
        )  # fmt: skip
        self._buffer: OrderedDict[int, list[bytes]] = OrderedDict()
        self._buffered = 0
        self._requests = 0

    def describe(self, i: int) -> str:
        return f"{self.url} row {i}"

    @property
    def requests(self) -> int:
        return self._requests

    def _piece(self, p: int) -> list[bytes]:
        """The records of piece ``p``'s rows, from the buffer or read (with retries)."""
        if p in self._buffer:
            self._buffer.move_to_end(p)
            return self._buffer[p]
        for attempt in range(self.retry.attempts):
            try:
                self._requests += 1
                table = self._read_piece(p)
                break
            except Exception as exc:
                if not transient(exc) or attempt + 1 == self.retry.attempts:
                    i = int(self._piece_start[p])
                    raise StorageError(i, self.describe(i), f"reading its piece: {exc!r}",
                                       self.keys[i]) from exc  # fmt: skip
                self._retries += 1
                time.sleep(self.retry.delay(attempt))
        rows = table.select(self.columns).to_pylist()
        records = [encode_record({k: _cell(v) for k, v in row.items()}) for row in rows]
        self._buffer[p] = records
        self._buffered += sum(map(len, records))
        while self._buffered > self.buffer_bytes and len(self._buffer) > 1:
            _, old = self._buffer.popitem(last=False)
            self._buffered -= sum(map(len, old))
        return records

    @property
    def retries(self) -> int:
        return self._retries

    def read(self, i: int) -> bytes:
        return self.read_many([i])[0]

    def read_many(self, ids: Sequence[int]) -> list[bytes]:
        ids = np.asarray(ids, np.int64)
        if not ids_within(ids, len(self)):
            raise IndexError(f"sample ids out of range for {len(self)} samples")
        out: list[bytes] = [b""] * ids.size
        pieces = self._piece_of[ids]
        for p in np.unique(pieces).tolist():
            records = self._piece(p)
            for pos in np.flatnonzero(pieces == p).tolist():
                out[pos] = records[int(ids[pos]) - int(self._piece_start[p])]
        return out

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.update(_buffer=OrderedDict(), _buffered=0, _files={})
        return state

    @abstractmethod
    def _read_piece(self, p: int):
        """Piece ``p`` as a pyarrow table (a row group, a record batch)."""


def _labels(column, n: int) -> np.ndarray:
    pa = _pa()
    if column is None or not pa.types.is_integer(column.type):
        return np.full(n, -1, np.int64)
    return column.fill_null(-1).to_numpy().astype(np.int64)


class ParquetStorage(TableStorage):
    """Rows of Parquet files at ``url`` (a file, a directory of ``*.parquet``, a glob, or
    a list), any fsspec URL. ``columns``: the fields of a sample (default: all)."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        columns: Sequence[str] | None = None,
        input_field: str | Sequence[str] | None = None,
        target_field: str | Sequence[str] | None = None,
        storage_options: dict | None = None,
        retry: Retry | None = None,
        buffer_bytes: int = 64 << 20,
    ) -> None:
        self.url = url if isinstance(url, str) else url[0]
        self.storage_options = dict(storage_options or {})
        self.retry, self.buffer_bytes, self._retries = retry or Retry(), int(buffer_bytes), 0
        fs, path = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self._fs = fs
        if not isinstance(url, str):
            self._paths = [fsspec.core.url_to_fs(u, **self.storage_options)[1] for u in url]
        elif fs.isdir(path):
            self._paths = sorted(p for p in fs.find(path) if p.endswith(".parquet"))
        else:
            self._paths = sorted(fs.glob(path)) if any(c in path for c in "*?[") else [path]
        if not self._paths:
            raise ConfigError(f"{self.url}: no .parquet files")
        self._files: dict = {}
        self._files_pid = os.getpid()
        metas = [self._file(k).metadata for k in range(len(self._paths))]
        schema = self._file(0).schema_arrow
        cols = list(columns) if columns else list(schema.names)
        self._where, piece_rows, sizes = [], [], []
        for k, meta in enumerate(metas):
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                nbytes = sum(
                    rg.column(c).total_uncompressed_size
                    for c in range(rg.num_columns)
                    if rg.column(c).path_in_schema.split(".")[0] in cols
                )
                rows = rg.num_rows
                self._where.append((k, g))
                piece_rows.append(rows)
                per_row = nbytes // max(rows, 1) + _FIELD_OVERHEAD * len(cols) + TAG
                sizes.append(np.full(rows, per_row))
        version = ";".join(f"{p}:{_version(fs.info(p))}" for p in self._paths)
        target = _label_column(target_field, cols)
        labels = np.full(sum(piece_rows), -1, np.int64)
        if target is not None:  # the target column alone (small), for label-aware samplers
            labels = np.concatenate([
                _labels(self._file(k).read(columns=[target], use_threads=False).column(0),
                        m.num_rows)
                for k, m in enumerate(metas)
            ])  # fmt: skip
        self._setup(
            self.url, schema, columns, input_field, target_field, piece_rows, version,
            np.concatenate(sizes), labels, _hf_classes(schema, target),
        )  # fmt: skip

    def _file(self, k: int):
        if self._files_pid != os.getpid():  # a forked worker: file offsets are not shared
            self._files, self._files_pid = {}, os.getpid()
        f = self._files.get(k)
        if f is None:
            pq = _pa().parquet
            f = pq.ParquetFile(self._fs.open(self._paths[k], "rb"))
            self._files[k] = f
        return f

    def _read_piece(self, p: int):
        k, g = self._where[p]
        return self._file(k).read_row_group(g, columns=self.columns, use_threads=False)


def _hf_classes(schema, target: str | None) -> list[str]:
    """A ``ClassLabel``'s names, from the Hugging Face metadata a table carries."""
    meta = (schema.metadata or {}).get(b"huggingface")
    if not meta or target is None:
        return []
    features = json.loads(meta).get("info", {}).get("features", {})
    return list(features.get(target, {}).get("names", []))


class ArrowStorage(TableStorage):
    """Rows of a Hugging Face dataset saved with ``save_to_disk`` (a directory with
    ``state.json`` and Arrow files), memory-mapped where local."""

    def __init__(
        self,
        url: str,
        *,
        columns: Sequence[str] | None = None,
        input_field: str | Sequence[str] | None = None,
        target_field: str | Sequence[str] | None = None,
        storage_options: dict | None = None,
        retry: Retry | None = None,
    ) -> None:
        pa = _pa()
        self.url, self.storage_options = url, dict(storage_options or {})
        self.retry, self.buffer_bytes, self._retries = retry or Retry(), 16 << 20, 0
        fs, root = fsspec.core.url_to_fs(url, **self.storage_options)
        try:
            state = json.loads(fs.cat_file(posixpath.join(root, "state.json")))
            files = [d["filename"] for d in state["_data_files"]]
        except (FileNotFoundError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{url}: not a dataset saved with save_to_disk ({exc})") from exc
        self._fs, self._root, self._names = fs, root, files
        table = self._table()
        schema = table.schema
        cols = list(columns) if columns else list(schema.names)
        self._batches = table.to_batches()
        sizes = np.full(table.num_rows, _FIELD_OVERHEAD * len(cols) + TAG, np.int64)
        for c in cols:
            col = table.column(c)
            if pa.types.is_struct(col.type) and col.type.get_field_index("bytes") >= 0:
                col = pa.compute.struct_field(col, "bytes")
            if pa.types.is_binary(col.type) or pa.types.is_string(col.type):
                sizes += pa.compute.binary_length(col).fill_null(0).to_numpy().astype(np.int64)
        target = _label_column(target_field, cols)
        labels = _labels(table.column(target) if target else None, table.num_rows)
        self._setup(url, schema, columns, input_field, target_field,
                    [b.num_rows for b in self._batches], str(state.get("_fingerprint")),
                    sizes, labels, _hf_classes(schema, target))  # fmt: skip

    def _table(self):
        pa = _pa()
        tables = []
        for name in self._names:
            path = posixpath.join(self._root, name)
            if "file" in self._fs.protocol:
                source = pa.memory_map(path)
            else:  # remote: the file read once into this process's memory
                source = pa.BufferReader(self._fs.cat_file(path))
            tables.append(pa.ipc.open_stream(source).read_all())
        return pa.concat_tables(tables)

    def _read_piece(self, p: int):
        if not self._batches:  # a worker process: map the files again
            self._batches = self._table().to_batches()
        return _pa().Table.from_batches([self._batches[p]])

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_batches"] = []
        return state


register_format(Format("parquet", ParquetStorage, suffix=".parquet"))
register_format(Format("hf", ArrowStorage, marker=frozenset({"state.json", "dataset_info.json"})))
