"""The offer catalog on disk: SQLite (WAL) with one snapshot per refresh of each source.

Path: ``$TUNEPLAN_HOME/catalog.sqlite`` if set, else ``platformdirs.user_data_dir("tuneplan")``.
A new file is seeded from the bundled SkyPilot snapshot. ``replace_source`` writes a whole
snapshot in one transaction; older snapshots stay as price history. Queries filter, de-duplicate,
sort and page in SQL with the core's rules (``OfferFilter``, ``sort_offers``): GPU, provider and
region names are matched in Python against the few distinct stored values; money is ordered and
compared exactly, by decimal sort keys written with each row (``_price_key``), never as floats.

Every write to ``snapshots`` (each write of the store makes one) and every update or delete of
``offers`` bumps a generation counter (SQL triggers, so no write path can forget it); with the
file's random token it is the catalog's ``stamp``, which caches key on (a changed stamp means a
changed catalog).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from tuneplan.core.catalog.gpu_names import CANONICAL_GPUS, gpu_matches
from tuneplan.core.catalog.offers import (
    Offer,
    OfferFilter,
    OfferSort,
    provider_matches,
    region_matches,
)
from tuneplan.errors import CatalogError, InvalidValueError

SCHEMA_VERSION = 3
STALE_AFTER_S = 7 * 86_400
_MAX_SQLITE_INT = 2**63 - 1
_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE snapshots (
        id INTEGER PRIMARY KEY, source TEXT NOT NULL, fetched_at TEXT NOT NULL,
        row_count INTEGER NOT NULL, is_current INTEGER NOT NULL DEFAULT 0);
    CREATE INDEX snapshots_source ON snapshots(source, is_current);
    CREATE TABLE offers (
        snapshot_id INTEGER NOT NULL REFERENCES snapshots(id), offer_id TEXT NOT NULL,
        provider TEXT NOT NULL, instance_type TEXT NOT NULL, gpu TEXT NOT NULL,
        gpu_count INTEGER NOT NULL, gpu_memory_bytes INTEGER NOT NULL, vcpus REAL,
        ram_bytes INTEGER, disk_bytes INTEGER, region TEXT NOT NULL, zone TEXT,
        price_per_hour TEXT, spot_price_per_hour TEXT, currency TEXT NOT NULL,
        interconnect TEXT, fetched_at TEXT NOT NULL, source TEXT NOT NULL,
        attachable INTEGER NOT NULL, notes TEXT NOT NULL);
    CREATE INDEX offers_snapshot ON offers(snapshot_id);
    CREATE INDEX offers_gpu ON offers(gpu);
    """,
    # Probe measurements (read and written by adapters/calibration.py).
    2: """
    CREATE TABLE probes (
        id INTEGER PRIMARY KEY, created_at TEXT NOT NULL, model TEXT NOT NULL,
        strategy TEXT NOT NULL, device TEXT NOT NULL, device_name TEXT NOT NULL,
        gpu TEXT, versions TEXT NOT NULL, measured TEXT NOT NULL, origin TEXT NOT NULL);
    CREATE INDEX probes_gpu ON probes(gpu, device);
    """,
    # The catalog's stamp: a random token per file and a generation every write bumps (every
    # write of the store inserts, updates or deletes snapshots; offers rows are inserted only
    # with their snapshot, so a per-row insert trigger there would only slow a refresh down).
    # Sort keys of the prices (``_price_key``), written with each row, so SQL orders and
    # compares money as exact decimals with plain text comparisons.
    3: """
    ALTER TABLE offers ADD COLUMN price_key TEXT;
    ALTER TABLE offers ADD COLUMN spot_price_key TEXT;
    ALTER TABLE offers ADD COLUMN price_per_gpu_key TEXT;
    ALTER TABLE offers ADD COLUMN spot_price_per_gpu_key TEXT;
    UPDATE offers SET price_key = tp_price_key(price_per_hour, 1),
        spot_price_key = tp_price_key(spot_price_per_hour, 1),
        price_per_gpu_key = tp_price_key(price_per_hour, gpu_count),
        spot_price_per_gpu_key = tp_price_key(spot_price_per_hour, gpu_count);
    CREATE TABLE catalog_stamp (
        id INTEGER PRIMARY KEY CHECK (id = 1), token TEXT NOT NULL,
        generation INTEGER NOT NULL);
    INSERT INTO catalog_stamp VALUES (1, lower(hex(randomblob(8))), 0);
    CREATE TRIGGER offers_update_bumps AFTER UPDATE ON offers BEGIN
        UPDATE catalog_stamp SET generation = generation + 1; END;
    CREATE TRIGGER offers_delete_bumps AFTER DELETE ON offers BEGIN
        UPDATE catalog_stamp SET generation = generation + 1; END;
    CREATE TRIGGER snapshots_insert_bumps AFTER INSERT ON snapshots BEGIN
        UPDATE catalog_stamp SET generation = generation + 1; END;
    CREATE TRIGGER snapshots_update_bumps AFTER UPDATE ON snapshots BEGIN
        UPDATE catalog_stamp SET generation = generation + 1; END;
    CREATE TRIGGER snapshots_delete_bumps AFTER DELETE ON snapshots BEGIN
        UPDATE catalog_stamp SET generation = generation + 1; END;
    CREATE INDEX snapshots_current ON snapshots(is_current, id);
    CREATE INDEX offers_offer_id ON offers(offer_id, fetched_at);
    """,
}
# Which of several current rows with one offer id is "the" offer: newest fetch, then newest
# snapshot, then the row written last.
_NEWEST = "o.fetched_at DESC, s.id DESC, o.rowid DESC"
_COLUMNS = ("offer_id", "provider", "instance_type", "gpu", "gpu_count", "gpu_memory_bytes",
            "vcpus", "ram_bytes", "disk_bytes", "region", "zone", "price_per_hour",
            "spot_price_per_hour", "currency", "interconnect", "fetched_at", "source",
            "attachable", "notes")


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceStatus:
    """The current snapshot of one source: when fetched, how many offers, how old."""

    source: str
    fetched_at: datetime
    offers: int
    snapshots: int
    age_s: float
    stale: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class OfferPage:
    """One page of a query's offers, how many match in all, and the catalog stamp it read."""

    offers: list[Offer]
    total: int
    stamp: tuple[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class PricePoint:
    """Cheapest prices of one GPU in one snapshot of one source (USD per GPU-hour)."""

    gpu: str
    source: str
    fetched_at: datetime
    offers: int
    min_price_per_gpu_hour: Decimal | None
    min_spot_price_per_gpu_hour: Decimal | None


def default_path() -> Path:
    """``$TUNEPLAN_HOME/catalog.sqlite``, else the per-user data dir (platformdirs)."""
    home = os.environ.get("TUNEPLAN_HOME")
    if home:
        return Path(home) / "catalog.sqlite"
    import platformdirs

    return Path(platformdirs.user_data_dir("tuneplan")) / "catalog.sqlite"


def default_cache_dir() -> Path:
    """Where ``catalog refresh`` keeps the last good body of each price URL (conditional
    requests): ``$TUNEPLAN_HOME/http-cache``, else the per-user cache dir (platformdirs)."""
    home = os.environ.get("TUNEPLAN_HOME")
    if home:
        return Path(home) / "http-cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir("tuneplan")) / "http"


class CatalogStore:
    """The SQLite catalog. Open with ``CatalogStore.open()``; close or use as a context manager.

    Every sqlite3 failure (corrupt or foreign file, locked, full disk) becomes a one-line
    CatalogError naming the file.
    """

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path
        # for the migration that adds the key columns to rows written before them
        connection.create_function("tp_price_key", 2, _stored_price_key, deterministic=True)

    @property
    def connection(self) -> sqlite3.Connection:
        """The open, migrated connection, for adapters that own other tables of this file
        (``calibration.CalibrationStore``: the ``probes`` table)."""
        return self._db

    @classmethod
    def open(cls, path: str | Path | None = None, *, seed: bool = True,
             check_same_thread: bool = True) -> CatalogStore:
        """Open (creating and migrating) the catalog; a new, empty one is seeded from the
        bundled SkyPilot snapshot unless ``seed`` is False. ``check_same_thread=False``: the
        caller serialises use across threads itself. Raises CatalogError."""
        target = Path(path) if path is not None else default_path()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CatalogError(f"cannot open catalog {target}: {exc}") from exc
        # Creating, migrating and seeding happen under an exclusive lock on a file beside the
        # catalog, so concurrent first uses (CLI processes, a server) wait for the one that
        # builds it instead of reading a half-made file; each re-checks the schema inside.
        with _setup_lock(target):
            try:
                connection = sqlite3.connect(target, timeout=30, isolation_level=None,
                                             check_same_thread=check_same_thread)
            except (OSError, sqlite3.Error) as exc:
                raise CatalogError(f"cannot open catalog {target}: {exc}") from exc
            store = cls(connection, target)
            try:
                store._migrate()
                if seed:
                    store._seed()
            except sqlite3.OperationalError as exc:
                connection.close()
                if _is_busy(exc):
                    raise CatalogError(f"catalog {target} is busy ({exc}): another tuneplan "
                                       "is writing it; try again") from exc
                raise CatalogError(f"catalog {target} is unreadable ({exc}); delete it to "
                                   "rebuild it from the bundled snapshot") from exc
            except sqlite3.Error as exc:
                connection.close()
                raise CatalogError(f"catalog {target} is unreadable ({exc}); delete it to "
                                   "rebuild it from the bundled snapshot") from exc
            except BaseException:
                connection.close()
                raise
        return store

    def _migrate(self) -> None:
        version = self._count("PRAGMA user_version")
        if version > SCHEMA_VERSION:
            raise CatalogError(f"catalog {self.path} has schema {version}, newer than this "
                               f"tuneplan ({SCHEMA_VERSION}): upgrade tuneplan")
        mode = self._db.execute("PRAGMA journal_mode").fetchone()
        if not mode or str(mode[0]).lower() != "wal":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        for step in range(version + 1, SCHEMA_VERSION + 1):
            self._db.execute("BEGIN IMMEDIATE")
            if self._count("PRAGMA user_version") >= step:  # another process got here first
                self._db.execute("COMMIT")
                continue
            try:
                # Statement by statement: executescript would COMMIT the open transaction.
                for statement in _statements(_MIGRATIONS[step]):
                    self._db.execute(statement)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute(f"PRAGMA user_version={step}")
            self._db.execute("COMMIT")

    def _seed(self) -> None:
        """Write the bundled snapshot into an empty catalog, all sources in one transaction
        (two processes opening a new file seed it once; a killed seed leaves it empty)."""
        if self._count("SELECT COUNT(*) FROM snapshots"):
            return
        from tuneplan.adapters.importers.snapshot import load_bundled_snapshot

        snapshot = load_bundled_snapshot()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if not self._count("SELECT COUNT(*) FROM snapshots"):
                for source, result, fetched_at in snapshot:
                    self._write_snapshot(source, result.offers, _iso(fetched_at))
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _count(self, sql: str, *args: object) -> int:
        row = self._db.execute(sql, args).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> CatalogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def replace_source(self, source: str, offers: Iterable[Offer], fetched_at: datetime, *,
                       retires: Sequence[str] = ()) -> int:
        """Write ``offers`` as the new current snapshot of ``source``, atomically.

        One transaction: either every offer is written and the snapshot becomes current, or
        (on any exception, even from the ``offers`` iterator, or a killed process) nothing
        changes. The previous snapshot is kept as history. ``retires`` names sources that this
        one supersedes (the bundled snapshot of the same SkyPilot cloud): in the same
        transaction they stop being current, so offers dropped upstream do not linger; their
        snapshots stay as price history. Returns the number written.
        Raises CatalogError on a database failure; other exceptions propagate after rollback.
        """
        if fetched_at.tzinfo is None:
            raise CatalogError("fetched_at must be timezone-aware UTC")
        stamp = _iso(fetched_at)
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                written = self._write_snapshot(source, offers, stamp)
                for old in retires:
                    self._db.execute(
                        "UPDATE snapshots SET is_current=0 WHERE source=? AND is_current=1",
                        (old,))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise CatalogError(f"could not write {source} to {self.path}: {exc}") from exc
        return written

    def _write_snapshot(self, source: str, offers: Iterable[Offer], stamp: str) -> int:
        cursor = self._db.execute(
            "INSERT INTO snapshots(source, fetched_at, row_count, is_current) VALUES (?,?,0,0)",
            (source, stamp))
        snapshot_id = cursor.lastrowid
        columns = (*_COLUMNS, *_KEY_COLUMNS)
        placeholders = ",".join("?" * (len(columns) + 1))
        self._db.executemany(
            f"INSERT INTO offers(snapshot_id,{','.join(columns)}) VALUES ({placeholders})",
            ((snapshot_id, *_row(offer)) for offer in offers))
        written = self._count("SELECT COUNT(*) FROM offers WHERE snapshot_id=?", snapshot_id)
        self._db.execute("UPDATE snapshots SET is_current=0 WHERE source=? AND is_current=1",
                         (source,))
        self._db.execute("UPDATE snapshots SET is_current=1, row_count=? WHERE id=?",
                         (written, snapshot_id))
        return written

    def remove_source(self, source: str) -> tuple[int, int]:
        """Delete every snapshot of ``source`` and their offers, in one transaction (a killed
        process leaves the catalog as it was). Returns (offers, snapshots) removed.

        Raises InvalidValueError naming the stored sources when ``source`` has none, and
        CatalogError on a database failure.
        """
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                snapshots = self._count("SELECT COUNT(*) FROM snapshots WHERE source=?", source)
                if not snapshots:
                    known = [str(r[0]) for r in self._db.execute(
                        "SELECT DISTINCT source FROM snapshots ORDER BY source")]
                    raise InvalidValueError(
                        f"no catalog source {source[:80]!r}; sources: "
                        f"{', '.join(known) or 'none'}")
                offers = self._db.execute(
                    "DELETE FROM offers WHERE snapshot_id IN "
                    "(SELECT id FROM snapshots WHERE source=?)", (source,)).rowcount
                self._db.execute("DELETE FROM snapshots WHERE source=?", (source,))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise CatalogError(f"could not remove {source} from {self.path}: {exc}") from exc
        return offers, snapshots

    def offers(self, query: OfferFilter | None = None, *, sort: OfferSort | None = None
               ) -> list[Offer]:
        """Current offers passing ``query`` (all when None), sorted by ``sort`` if given.

        When current rows share an offer id, the newest ``fetched_at`` of those passing the
        filter wins (on a tie the newer snapshot, then the row written last).
        Raises CatalogError when the file or a row is corrupt.
        """
        return self.offer_page(query, sort=sort).offers

    def offer_page(self, query: OfferFilter | None = None, *, sort: OfferSort | None = None,
                   limit: int | None = None, offset: int = 0) -> OfferPage:
        """``offers`` in SQL, one page: at most ``limit`` offers (all when None) after skipping
        ``offset``, the number matching in all, and the stamp read in the same transaction.

        The order is ``sort_offers``'s (price used, exact; ties by provider, instance, region,
        zone) then the offer id, so pages never overlap; without ``sort`` it is the offer id
        when paging, else the store's. Raises CatalogError.
        """
        query = query or OfferFilter()
        try:
            self._db.execute("BEGIN")  # one read snapshot: stamp, names, rows and count agree
        except sqlite3.Error as exc:
            raise CatalogError(f"catalog {self.path} is unreadable ({exc})") from exc
        try:
            stamp = self._stamp()
            paged = limit is not None or offset > 0
            sql, args = self._offer_sql(query, sort, paged=paged)
            rows = self._safe(sql, [*args, -1 if limit is None else limit, offset])
            if not paged:
                total = len(rows)
            elif rows:
                total = int(rows[0][-1])
            elif offset:
                total = self._count(f"SELECT COUNT(*) FROM ({sql})", *args, -1, 0)
            else:
                total = 0
        finally:
            self._db.execute("COMMIT")
        return OfferPage(offers=[_offer(row[:-1], self.path) for row in rows], total=total,
                         stamp=stamp)

    def _offer_sql(self, query: OfferFilter, sort: OfferSort | None, *, paged: bool
                   ) -> tuple[str, list[object]]:
        """SELECT of the current offers passing ``query`` (newest passing copy per id), each
        row ending with the total match count when ``paged`` (else with 0); its last two
        parameters are LIMIT and OFFSET."""
        price = "spot_price_per_hour" if query.spot else "price_per_hour"
        key, per_gpu_key = (("spot_price_key", "spot_price_per_gpu_key") if query.spot else
                            ("price_key", "price_per_gpu_key"))
        # conditions on a row {o} of a current snapshot {s}: written once, used for the row
        # and for the newer copies of it that would hide it
        where = ["{s}.is_current=1", f"{{o}}.{price} IS NOT NULL"]
        args: list[object] = []
        if query.gpu is not None:
            where.append(_gpu_clause(query.gpu, args))
        if query.gpu_count is not None:
            where.append("{o}.gpu_count=?")
            args.append(query.gpu_count)
        if query.min_gpu_memory_bytes is not None:
            where.append("{o}.gpu_memory_bytes>=?")
            args.append(query.min_gpu_memory_bytes)
        if query.providers:
            names = [p for p in self._current_values("provider")
                     if any(provider_matches(q, p) for q in query.providers)]
            where.append(_in("{o}.provider", names, args))
        if query.region is not None:
            wanted = query.region
            regions = [r for r in self._current_values("region")
                       if region_matches(wanted, r, None)]
            zones = [z for z in self._current_values("zone") if region_matches(wanted, "", z)]
            where.append(f"({_in('{o}.region', regions, args)} OR "
                         f"{_in('{o}.zone', zones, args)})")
        if query.max_price_per_hour is not None:
            ceiling = query.max_price_per_hour
            if ceiling < 0:
                where.append("0")
            elif ceiling < _KEY_LIMIT:  # above it every stored price passes
                where.append(f"{{o}}.{key} <= ?")
                args.append(_price_key(ceiling, 1))
        tie = "o.provider, o.instance_type, o.region, COALESCE(o.zone, ''), o.offer_id"
        if sort is OfferSort.PRICE:
            order: str | None = f"o.{key}, {tie}"
        elif sort is OfferSort.PRICE_PER_GPU:
            order = f"o.{per_gpu_key}, {tie}"
        elif sort is OfferSort.MEMORY:
            order = f"o.gpu_memory_bytes * o.gpu_count DESC, o.{key}, {tie}"
        else:
            order = "o.offer_id" if paged else None
        mine = " AND ".join(where).format(o="o", s="s")
        newer = " AND ".join(where).format(o="n", s="t")
        # A row is kept unless a newer current copy of its id also passes (``_NEWEST``'s
        # order as a row-value comparison; the offer_id index finds the copies).
        sql = (f"SELECT {','.join('o.' + c for c in _COLUMNS)}, "
               f"{'COUNT(*) OVER ()' if paged else '0'} "
               "FROM offers o JOIN snapshots s ON s.id=o.snapshot_id "
               f"WHERE {mine} AND NOT EXISTS (SELECT 1 FROM offers n JOIN snapshots t ON "
               f"t.id=n.snapshot_id WHERE n.offer_id=o.offer_id AND {newer} AND "
               "(n.fetched_at, t.id, n.rowid) > (o.fetched_at, s.id, o.rowid))"
               f"{f' ORDER BY {order}' if order else ''} LIMIT ? OFFSET ?")
        return sql, [*args, *args]  # the conditions' values, for the row then for its copies

    def _current_values(self, column: str) -> list[str]:
        """The distinct non-null values of ``column`` among current offers (a few hundred)."""
        rows = self._safe(f"SELECT DISTINCT o.{column} FROM offers o JOIN snapshots s ON "
                          f"s.id=o.snapshot_id WHERE s.is_current=1 AND o.{column} IS NOT NULL")
        return [str(row[0]) for row in rows]

    def stamp(self) -> tuple[str, int]:
        """(token, generation): the file's random token and its write count. Equal stamps mean
        the same catalog; any committed write to offers or snapshots changes it."""
        return self._stamp()

    def _stamp(self) -> tuple[str, int]:
        rows = self._safe("SELECT token, generation FROM catalog_stamp WHERE id=1")
        if not rows:
            raise CatalogError(f"catalog {self.path} has no stamp row; delete it to rebuild it "
                               "from the bundled snapshot")
        return str(rows[0][0]), int(rows[0][1])

    def offer(self, offer_id: str) -> Offer | None:
        """The current offer with this ``id`` (newest ``fetched_at`` across sources), or None."""
        sql = (f"SELECT {','.join('o.' + c for c in _COLUMNS)} FROM offers o "
               "JOIN snapshots s ON s.id=o.snapshot_id WHERE s.is_current=1 AND o.offer_id=? "
               f"ORDER BY {_NEWEST} LIMIT 1")
        rows = self._safe(sql, [offer_id])
        return _offer(rows[0], self.path) if rows else None

    def status(self, now: datetime | None = None) -> list[SourceStatus]:
        """Per source: current snapshot time, offer count, snapshots kept, age, stale flag
        (older than 7 days). Sorted by source."""
        now = now or datetime.now(UTC)
        rows = self._safe("SELECT source, MAX(CASE WHEN is_current=1 THEN fetched_at END), "
                          "MAX(CASE WHEN is_current=1 THEN row_count END), COUNT(*) "
                          "FROM snapshots GROUP BY source ORDER BY source")
        result = []
        for source, fetched, count, snapshots in rows:
            if fetched is None:
                continue
            when = _parse_time(fetched, self.path)
            age = (now - when).total_seconds()
            result.append(SourceStatus(source=source, fetched_at=when, offers=int(count or 0),
                                       snapshots=int(snapshots), age_s=age,
                                       stale=age > STALE_AFTER_S))
        return result

    def history(self, gpu: str) -> list[PricePoint]:
        """Cheapest per-GPU-hour prices of every GPU matching ``gpu`` (family match, as
        ``--gpu``) in every snapshot, current or not, oldest first."""
        args: list[object] = []
        rows = self._safe(
            "SELECT o.gpu, s.source, s.fetched_at, o.gpu_count, o.price_per_hour, "
            "o.spot_price_per_hour, s.id FROM offers o JOIN snapshots s ON s.id=o.snapshot_id "
            f"WHERE {_gpu_clause(gpu, args, 'o.gpu')}", args)
        points: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
        for row in rows:
            points.setdefault((row[0], row[6]), []).append(row)
        result = [_price_point(rows, self.path) for rows in points.values()]
        return sorted(result, key=lambda p: (p.fetched_at, p.gpu, p.source))

    def _safe(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        try:
            return list(self._db.execute(sql, args).fetchall())
        except sqlite3.Error as exc:
            raise CatalogError(f"catalog {self.path} is unreadable ({exc}); delete it to "
                               "rebuild it from the bundled snapshot") from exc


@contextlib.contextmanager
def _setup_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``<catalog>.lock`` (blocking: a process creating
    the catalog is waited for). Where there is no fcntl (Windows) or the lock file cannot be
    made, SQLite's own BEGIN IMMEDIATE and the re-checks inside it are what remain."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        handle = open(target.with_name(target.name + ".lock"), "a+b")  # noqa: SIM115
    except OSError:
        yield
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # closing the file releases the lock


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _gpu_clause(query: str, args: list[object], column: str = "{o}.gpu") -> str:
    """SQL condition on ``column`` for a ``--gpu`` query: the family match (``gpu_matches``) is
    resolved once against the canonical names, then SQLite filters; appends the names to args."""
    return _in(column, [name for name in CANONICAL_GPUS if gpu_matches(query, name)], args)


def _in(column: str, values: Sequence[str], args: list[object]) -> str:
    """``column IN (?, ...)`` over ``values`` (appended to args); false when there are none."""
    args.extend(values)
    return f"{column} IN ({','.join('?' * len(values))})" if values else "0"


def _statements(script: str) -> Iterator[str]:
    """The SQL statements of a migration, whole (a trigger body's ``;`` does not end one)."""
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip(" \n;"):
                yield buffer.strip()
            buffer = ""


_KEY_COLUMNS = ("price_key", "spot_price_key", "price_per_gpu_key", "spot_price_per_gpu_key")
_KEY_LIMIT = Decimal(10) ** 19  # the keys hold amounts below this (prices are capped far lower)


def _price_key(price: Decimal, divisor: int) -> str:
    """``price / divisor`` (the Decimal division ``sort_offers`` does) as text that sorts as
    the number does: fixed width, 19 digits and 40 decimals, exact for every quotient of a
    price of at most 28 significant digits down to 1e-12 USD. Stored with each row, so SQL
    orders and compares money as Decimal does, with plain text comparisons."""
    value = price / divisor
    if not value.is_finite() or not 0 <= value < _KEY_LIMIT:
        raise CatalogError(f"price {str(price)[:40]} cannot be stored as a sort key")
    return f"{value:061.40f}"


def _stored_price_key(text: object, divisor: object) -> str | None:
    """SQL ``tp_price_key`` over stored text: the key, or NULL for a value that is none (the
    row is refused when it is read)."""
    try:
        return None if text is None else _price_key(Decimal(str(text)), int(str(divisor)))
    except (ArithmeticError, ValueError, CatalogError):
        return None


def _price_point(rows: list[tuple[Any, ...]], path: Path) -> PricePoint:
    def cheapest(column: int) -> Decimal | None:
        values = [Decimal(str(r[column])) / int(str(r[3])) for r in rows if r[column] is not None]
        return min(values) if values else None

    first = rows[0]
    return PricePoint(gpu=str(first[0]), source=str(first[1]),
                      fetched_at=_parse_time(str(first[2]), path), offers=len(rows),
                      min_price_per_gpu_hour=cheapest(4), min_spot_price_per_gpu_hour=cheapest(5))


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def _parse_time(text: str, path: Path) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError) as exc:
        raise CatalogError(f"catalog {path} holds a bad timestamp {str(text)[:40]!r}") from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _row(offer: Offer) -> tuple[object, ...]:
    if not isinstance(offer, Offer):
        raise CatalogError(f"not an Offer: {type(offer).__name__}")
    money = (None if p is None else str(p) for p in (offer.price_per_hour,
                                                     offer.spot_price_per_hour))
    for label, number in (("gpu_count", offer.gpu_count), ("gpu_memory_bytes",
                          offer.gpu_memory_bytes), ("ram_bytes", offer.ram_bytes),
                          ("disk_bytes", offer.disk_bytes)):
        if number is not None and not -_MAX_SQLITE_INT - 1 <= number <= _MAX_SQLITE_INT:
            raise CatalogError(f"offer {offer.id}: {label} is beyond SQLite's 64-bit INTEGER")
    keys = (None if p is None else _price_key(p, count) for p, count in (
        (offer.price_per_hour, 1), (offer.spot_price_per_hour, 1),
        (offer.price_per_hour, offer.gpu_count), (offer.spot_price_per_hour, offer.gpu_count)))
    return (offer.id, offer.provider, offer.instance_type, offer.gpu, offer.gpu_count,
            offer.gpu_memory_bytes, offer.vcpus, offer.ram_bytes, offer.disk_bytes, offer.region,
            offer.zone, *money, offer.currency, offer.interconnect, _iso(offer.fetched_at),
            offer.source, int(offer.attachable), offer.notes, *keys)


def _offer(row: tuple[object, ...], path: Path) -> Offer:
    (_, provider, instance_type, gpu, gpu_count, gpu_memory_bytes, vcpus, ram_bytes,
     disk_bytes, region, zone, price, spot_price, currency, interconnect, fetched_at, source,
     attachable, notes) = row
    try:
        return Offer(
            provider=str(provider), instance_type=str(instance_type), gpu=str(gpu),
            gpu_count=_int(gpu_count), gpu_memory_bytes=_int(gpu_memory_bytes),
            vcpus=None if vcpus is None else float(str(vcpus)),
            ram_bytes=None if ram_bytes is None else _int(ram_bytes),
            disk_bytes=None if disk_bytes is None else _int(disk_bytes),
            region=str(region), zone=None if zone is None else str(zone),
            price_per_hour=_money(price), spot_price_per_hour=_money(spot_price),
            currency=str(currency),
            interconnect=None if interconnect is None else str(interconnect),
            fetched_at=_parse_time(str(fetched_at), path),
            source=str(source), attachable=bool(attachable), notes=str(notes))
    except CatalogError as exc:
        raise CatalogError(f"catalog {path} holds a bad offer ({exc}); delete the file to "
                           "rebuild it from the bundled snapshot") from exc
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise CatalogError(f"catalog {path} holds a bad value ({exc})") from exc


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CatalogError(f"expected an integer, found {str(value)[:40]!r}")
    return value


def _money(value: object) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def load_catalog(query: OfferFilter | None = None, *, sort: OfferSort | None = None,
                 path: str | Path | None = None) -> list[Offer]:
    """Current offers from the user's catalog (seeded on first use), filtered and sorted.

    Convenience for ``CatalogStore.open(path).offers(query, sort=sort)``; raises CatalogError.
    """
    with CatalogStore.open(path) as store:
        return store.offers(query, sort=sort)
