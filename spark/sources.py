"""bk storage as PySpark Python data sources (pyspark.sql.datasource): Arrow batches.

    spark.read.format("bk_entry_logs").option("ledger_dirs", "/data/b1/ledgers,/data/b2/ledgers")
         .option("mode", "ledgers_map" | "scan").load()
    spark.read.format("bk_ledgers").option("metadata_uri", "zk://zk1:2181/ledgers").load()
    spark.read.format("bk_remote_entry_logs").option("metadata_uri", uri).load()
         # or .option("urls", "http://b1:8180,http://b2:8180")

bk_entry_logs: the files of bookies whose ledger dirs this Spark can read (a path,
a comma list, globs). One input partition per entry log; the bookie id comes from
each directory's cookie. Options `logs_per_partition` (default 1) or `max_partitions`
group logs: a Python data source task costs ~30 ms of its own in pyspark 4.3
(measured: 400 empty tasks, 13 s on 2 cores), which for 10,000 small ledgers-map reads
is most of the work (docs/BENCHMARKS.md). Mode "ledgers_map" (default) gives spark.logs.LEDGERS_SCHEMA,
"scan" spark.logs.ENTRIES_SCHEMA (option `checksums` "false" skips digest checks;
`digest_types` a JSON object ledger id -> digest name, e.g. from bk_ledgers, tells
which digest to check where the data cannot say).

Where the code runs. A data source's reader is planned in a Python worker on the driver's
host and read in executors, both with the executors' Python (PYSPARK_PYTHON), which on a
cluster has only what the job ships (spark.session.ship_code: pure modules, no protobuf,
no ZooKeeper client). So the options that need bk.meta or a bookie's cookie
(`metadata_uri`, a `ledger_dirs` listing) are for sessions whose workers have bk
installed (local mode); the job resolves them in the driver process itself and hands the
sources plain data: `logs` (JSON list of [bookie id, ledger dir, log id, path], what
spark.logs.list_logs gives) and `bookies` (JSON object bookie id -> HTTP URL), and reads
the ledger metadata into a DataFrame directly (spark.metadata.read_ledgers).

bk_ledgers: every ledger's metadata (spark.metadata.LEDGERS_META_SCHEMA), read once
when the reader is planned and shipped to the executors inside the partitions
(option `partitions`, default 4).

bk_remote_entry_logs: the ledgers-map rows of bookies this Spark cannot read from disk,
over each bookie's HTTP admin server (GET /api/v1/bookie/entry_log_usage, the same
rows; docs/ANALYTICS.md). One partition per bookie. Option `token`: the bookies'
http_server_token. A bookie that does not answer fails the job: its bytes missing
would look like nothing to reclaim, and an analysis must not quietly omit a bookie.
"""
from __future__ import annotations

import json
import urllib.request

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from . import logs as L

REMOTE_USAGE_PATH = "/api/v1/bookie/entry_log_usage"
REMOTE_TIMEOUT_S = 600.0


def _list_option(options, name: str) -> list[str]:
    text = options.get(name, "")
    try:
        value = json.loads(text)
        if isinstance(value, list):
            return [str(v) for v in value]
    except ValueError:
        pass
    return [p.strip() for p in text.split(",") if p.strip()]


class _LogPartition(InputPartition):
    """One entry log (bookie id, ledger dir, log id, path), or several when logs_per_partition > 1."""

    def __init__(self, logs: list[tuple[str, str, int, str]]):
        self.logs = logs


class EntryLogsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bk_entry_logs"

    def _mode(self) -> str:
        mode = self.options.get("mode", "ledgers_map")
        if mode not in ("ledgers_map", "scan"):
            raise ValueError(f"bk_entry_logs: mode must be ledgers_map or scan, got {mode!r}")
        return mode

    def schema(self):
        return L.spark_ddl(L.ENTRIES_SCHEMA if self._mode() == "scan" else L.LEDGERS_SCHEMA)

    def reader(self, schema):
        return EntryLogsReader(self.options, self._mode())


class EntryLogsReader(DataSourceReader):
    def __init__(self, options, mode: str):
        listed = options.get("logs")
        if listed:  # listed by the driver: no directory walk, no cookie read here
            self.logs = [(str(b), str(d), int(i), str(p)) for b, d, i, p in json.loads(listed)]
        else:
            self.logs = L.list_logs(L.expand_dirs(_list_option(options, "ledger_dirs") or _list_option(options, "path")))
        self.mode = mode
        self.checksums = options.get("checksums", "true").lower() != "false"
        raw = json.loads(options.get("digest_types", "{}") or "{}")
        self.digest_types = {int(k): L.DigestType[str(v).upper()] for k, v in raw.items()}
        self.per_partition = max(1, int(options.get("logs_per_partition", "1")))
        self.max_partitions = max(0, int(options.get("max_partitions", "0")))

    def partitions(self):
        logs = self.logs
        n = self.per_partition
        if self.max_partitions:
            n = max(n, -(-len(logs) // self.max_partitions))
        return [_LogPartition(logs[i:i + n]) for i in range(0, len(logs), n)] or [_LogPartition([])]

    def read(self, partition: _LogPartition):
        if self.mode == "scan":
            for bookie_id, _d, log_id, path in partition.logs:
                yield from L.scan_batches(bookie_id, log_id, path, self.digest_types, self.checksums)
            return
        by_dir: dict[tuple[str, str], list[dict]] = {}
        for bookie_id, ledger_dir, _log_id, path in partition.logs:
            by_dir.setdefault((bookie_id, ledger_dir), []).append(L.usage.log_usage_row(path))
        for (bookie_id, ledger_dir), rows in by_dir.items():
            yield L.usage_to_batch(bookie_id, ledger_dir, rows)


class _RowsPartition(InputPartition):
    def __init__(self, rows: list[dict]):
        self.rows = rows


class LedgersDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bk_ledgers"

    def schema(self):
        from . import metadata as M

        return M.LEDGERS_META_DDL

    def reader(self, schema):
        return LedgersReader(self.options)


class LedgersReader(DataSourceReader):
    def __init__(self, options):
        uri = options.get("metadata_uri", "")
        if not uri:
            raise ValueError("bk_ledgers: option metadata_uri is required (zk://host:port/ledgers)")
        self.n = max(1, int(options.get("partitions", "4")))
        from . import metadata as M

        self._rows = M.read_ledgers(uri)  # on the driver, once; not pickled into tasks (see partitions)

    def __getstate__(self):
        return {"n": self.n, "_rows": []}

    def partitions(self):
        rows = self._rows
        step = max(1, -(-len(rows) // self.n))
        return [_RowsPartition(rows[i:i + step]) for i in range(0, len(rows), step)] or [_RowsPartition([])]

    def read(self, partition: _RowsPartition):
        if partition.rows:
            from . import metadata as M

            yield M.rows_to_batch(partition.rows)


class _BookiePartition(InputPartition):
    def __init__(self, bookie_id: str | None, url: str):
        self.bookie_id, self.url = bookie_id, url


def fetch_usage(url: str, token: str = "", timeout_s: float = REMOTE_TIMEOUT_S) -> dict:
    """GET one bookie's entry_log_usage answer: {"bookie_id", "ledger_dirs": {dir: [usage row, ...]}}."""
    req = urllib.request.Request(url.rstrip("/") + REMOTE_USAGE_PATH)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except OSError as e:
        raise RuntimeError(f"bookie at {url} did not answer {REMOTE_USAGE_PATH}: {e}") from None


def registered_urls(metadata_uri: str) -> dict[str, str]:
    """Every registered bookie's HTTP admin URL; ValueError when one has none (its bytes
    would be missing from the analysis)."""
    from . import metadata as M

    found = M.bookie_http_urls(metadata_uri)
    silent = sorted(b for b, u in found.items() if u is None)
    if silent:
        raise ValueError(f"bk_remote_entry_logs: bookies registered without an HTTP endpoint: {silent}"
                         " (set http_server_enabled, or read their ledger dirs with bk_entry_logs)")
    return found


class RemoteEntryLogsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bk_remote_entry_logs"

    def schema(self):
        return L.spark_ddl(L.LEDGERS_SCHEMA)

    def reader(self, schema):
        return RemoteEntryLogsReader(self.options)


class RemoteEntryLogsReader(DataSourceReader):
    def __init__(self, options):
        self.token = options.get("token", "")
        urls = _list_option(options, "urls")
        if urls:
            self.bookies = [(None, u) for u in urls]
        elif options.get("bookies"):  # resolved by the driver: {bookie id: url}
            self.bookies = sorted(json.loads(options["bookies"]).items())
        elif options.get("metadata_uri"):
            self.bookies = sorted(registered_urls(options["metadata_uri"]).items())
        else:
            raise ValueError("bk_remote_entry_logs: give option urls (http://bookie:8180,...), bookies or metadata_uri")

    def partitions(self):
        return [_BookiePartition(b, u) for b, u in self.bookies] or [_BookiePartition(None, "")]

    def read(self, partition: _BookiePartition):
        if not partition.url:
            return
        answer = fetch_usage(partition.url, self.token)
        bookie_id = answer["bookie_id"]
        if partition.bookie_id is not None and bookie_id != partition.bookie_id:
            raise RuntimeError(f"{partition.url} answers as bookie {bookie_id}, registered as {partition.bookie_id}")
        for ledger_dir, logs in answer["ledger_dirs"].items():
            for i in range(0, len(logs), 1024):
                yield L.usage_to_batch(bookie_id, ledger_dir, logs[i:i + 1024])


SOURCES = (EntryLogsDataSource, LedgersDataSource, RemoteEntryLogsDataSource)


def register(session) -> None:
    for source in SOURCES:
        session.dataSource.register(source)
