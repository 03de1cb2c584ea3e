"""Maps that keep their most recently used entries in memory and the rest on disk, in a private
SQLite database: what bounds the endpoint cache (conversation_endpoints.py) whatever the number
of dialogs, as a Kafka Streams store keeps a compacted topic's table in RocksDB.

The topic stays the truth: the database is a temporary one (SQLite's "" file name: created in the
temporary directory, deleted when its connection closes or the process dies), so every process
still builds its table from the topic and nothing on disk outlives it. When the memory tier is
full its least recently used entries go to disk, in one batch; an entry used again is read back
and its row kept, so moving it out again unchanged costs no write. A key looked up and found
absent is remembered in memory as absent, so a hot miss costs one SELECT, not one per call. Until
a map first outgrows its memory tier it is a plain dict and the database is not even opened, so
small processes pay nothing.

Values are pickled: the database holds only what this process wrote to it, never a record read
from Kafka, so nothing untrusted is ever unpickled.
"""

from __future__ import annotations

import pickle
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Generic, TypeVar, overload

from kbroker import config

V = TypeVar("V")
D = TypeVar("D")

HOT = config.HOT_ENDPOINTS  # entries of each map kept in memory: see docs/endpoints.md
PAGE_CACHE_KIB = 8_192  # SQLite's page cache per store: the database's share of memory
_ABSENT: Any = object()  # "no such key", to callers
_NONE: Any = object()  # in the memory tier: "this key is on neither tier"


class SpillStore:
    """One private temporary SQLite database, shared by the maps of one cache and its lock."""

    def __init__(self, page_cache_kib: int = PAGE_CACHE_KIB):
        self.lock = threading.RLock()
        self._page_cache_kib = page_cache_kib
        self._conn: sqlite3.Connection | None = None
        self.closed = False

    def connection(self) -> sqlite3.Connection:
        """The database, opened on first use (under `lock`)."""
        if self._conn is None:
            if self.closed:
                raise RuntimeError("the endpoint cache's database is closed")
            conn = sqlite3.connect("", check_same_thread=False, isolation_level=None)
            # A scratch file rebuilt from the topic at every start: no journal, no fsync; on disk
            # beyond its page cache even where SQLite was built to keep temporary files in memory.
            pragmas = ("temp_store=FILE", "journal_mode=OFF", "synchronous=OFF", f"cache_size=-{self._page_cache_kib}")
            for pragma in pragmas:
                conn.execute(f"PRAGMA {pragma}")
            self._conn = conn
        return self._conn

    @property
    def opened(self) -> bool:
        return self._conn is not None

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class SpillMap(Generic[V]):
    """A str-keyed map of up to `hot` entries in memory, the rest in `store`'s table `table`.
    `ordered`: values are numbers, and below() finds the keys whose value is under a bound."""

    def __init__(self, store: SpillStore, table: str, hot: int = HOT, *, ordered: bool = False):
        if not table.isidentifier():
            raise ValueError(f"not a table name: {table!r}")
        self._store, self._table, self.hot, self._ordered = store, table, max(1, hot), ordered
        self._slack = self.hot // 64  # evict in batches of this many and more: one transaction each
        # The memory tier: values, and _NONE for keys known to be on neither tier.
        self._mem: OrderedDict[str, Any] = OrderedDict()
        self._nones = 0  # _NONE entries in _mem
        self._rows = 0  # rows on disk
        self._shadowed: set[str] = set()  # keys in _mem with a row on disk ...
        self._clean: set[str] = set()  # ... which holds the same value
        self._made = False  # the table exists
        self.spilled = 0  # rows ever written to disk, and entries read back (a miss of the memory tier)
        self.read_back = 0

    # --- the disk tier (called under the store's lock) --------------------------------------------

    def _db(self) -> sqlite3.Connection:
        conn = self._store.connection()
        if not self._made:
            kind = "REAL" if self._ordered else "BLOB"
            conn.execute(f"CREATE TABLE {self._table} (k TEXT PRIMARY KEY, v {kind})")
            if self._ordered:
                conn.execute(f"CREATE INDEX {self._table}_v ON {self._table} (v)")
            self._made = True
        return conn

    def _encode(self, value: V) -> Any:
        return value if self._ordered else pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

    def _decode(self, raw: Any) -> V:
        return raw if self._ordered else pickle.loads(raw)  # type: ignore[no-any-return]  # only what _encode wrote

    def _lookup(self, key: str) -> Any:
        """`key`'s value or _NONE, brought into the memory tier (under the lock)."""
        mem = self._mem
        if key in mem:
            mem.move_to_end(key)
            return mem[key]
        if not self._rows:
            return _NONE  # nothing on disk: absence needs no marker
        row = self._db().execute(f"SELECT v FROM {self._table} WHERE k = ?", (key,)).fetchone()
        if row is None:
            value = _NONE
            self._nones += 1
        else:
            value = self._decode(row[0])
            self._shadowed.add(key)
            self._clean.add(key)
            self.read_back += 1
        mem[key] = value
        self._evict()
        return value

    def _evict(self) -> None:
        mem = self._mem
        if len(mem) <= self.hot + self._slack:
            return
        rows, new = [], 0
        while len(mem) > self.hot:
            key, value = mem.popitem(last=False)
            if value is _NONE:
                self._nones -= 1
            elif key in self._clean:
                self._clean.discard(key)
                self._shadowed.discard(key)
            else:
                rows.append((key, self._encode(value)))
                if key in self._shadowed:
                    self._shadowed.discard(key)
                else:
                    new += 1
        if rows:
            db = self._db()
            db.execute("BEGIN")
            db.executemany(f"INSERT OR REPLACE INTO {self._table} VALUES (?, ?)", rows)
            db.execute("COMMIT")
            self._rows += new
            self.spilled += len(rows)

    def _drop_row(self, key: str) -> None:
        self._db().execute(f"DELETE FROM {self._table} WHERE k = ?", (key,))
        self._rows -= 1

    def _disk_rows(self, sql: str, *args: Any) -> Iterator[tuple[Any, ...]]:
        """Rows of `sql` whose key (the first column) is not in memory, where its value is."""
        if self._rows:
            mem = self._mem
            yield from (row for row in self._db().execute(sql, args) if row[0] not in mem)

    # --- the map ----------------------------------------------------------------------------------

    @overload
    def get(self, key: str) -> V | None: ...

    @overload
    def get(self, key: str, default: D) -> V | D: ...

    def get(self, key: str, default: Any = None) -> Any:
        with self._store.lock:
            value = self._lookup(key)
            return default if value is _NONE else value

    def __getitem__(self, key: str) -> V:
        value = self.get(key, _ABSENT)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        with self._store.lock:
            return self._lookup(key) is not _NONE

    def __setitem__(self, key: str, value: V) -> None:
        with self._store.lock:
            mem = self._mem
            if key in mem:
                if mem[key] is _NONE:
                    self._nones -= 1
                self._clean.discard(key)
                mem[key] = value
                mem.move_to_end(key)
                return
            if self._rows and self._db().execute(f"SELECT 1 FROM {self._table} WHERE k = ?", (key,)).fetchone():
                self._shadowed.add(key)
            mem[key] = value
            self._evict()

    def pop(self, key: str, default: Any = None) -> Any:
        with self._store.lock:
            value = self._lookup(key)
            if value is _NONE:
                return default
            if key in self._shadowed:
                self._shadowed.discard(key)
                self._clean.discard(key)
                self._drop_row(key)
            if self._rows:
                self._mem[key] = _NONE  # remembered as gone: the next lookup needs no SELECT
                self._nones += 1
            else:
                del self._mem[key]
            return value

    def __delitem__(self, key: str) -> None:
        if self.pop(key, _ABSENT) is _ABSENT:
            raise KeyError(key)

    def setdefault(self, key: str, default: V) -> V:
        with self._store.lock:
            value = self.get(key, _ABSENT)
            if value is _ABSENT:
                self[key] = default
                return default
            return value

    @property
    def in_memory(self) -> int:
        return len(self._mem) - self._nones

    def __len__(self) -> int:
        return len(self._mem) - self._nones + self._rows - len(self._shadowed)

    def __bool__(self) -> bool:
        return len(self) > 0

    def items(self) -> list[tuple[str, V]]:
        """Every entry, a snapshot (nothing is moved between the tiers)."""
        with self._store.lock:
            out = [(k, v) for k, v in self._mem.items() if v is not _NONE]
            out.extend((k, self._decode(v)) for k, v in self._disk_rows(f"SELECT k, v FROM {self._table}"))
            return out

    def values(self) -> list[V]:
        return [v for _, v in self.items()]

    def keys(self) -> list[str]:
        with self._store.lock:
            out = [k for k, v in self._mem.items() if v is not _NONE]
            out.extend(k for (k,) in self._disk_rows(f"SELECT k FROM {self._table}"))
            return out

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def below(self, bound: float) -> list[str]:
        """The keys whose value is under `bound` (an `ordered` map's)."""
        assert self._ordered, "below() needs a map of numbers"
        with self._store.lock:
            out = [k for k, v in self._mem.items() if v is not _NONE and v < bound]
            out.extend(k for (k,) in self._disk_rows(f"SELECT k FROM {self._table} WHERE v < ?", bound))
            return out
