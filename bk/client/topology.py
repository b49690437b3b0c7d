"""Where a bookie is: its network location ("/region/rack", or "/rack"), its isolation group, and
its free disk space - what the placement policies (bk.client.placement) decide with.

Sources of a bookie's location, the first that knows it wins:
1. a static mapping in the client's settings (`network_topology_mapping`): a dict, or the path of
   a JSON file, or of a text file of `bookie location [group]` lines. A JSON object is either flat
   (bookie -> location) or Pulsar's rack layout (group -> bookie -> {"rack": location}). A key is a
   bookie id (host:port) or a host (every bookie on it);
2. BookKeeper's network topology script (`network_topology_script_file_name`, ScriptBasedMapping):
   run with up to `network_topology_script_number_args` bookie ids as arguments, it prints one
   location per argument (whitespace-separated, in order). bk passes bookie ids (host:port), not
   bare hosts as BookKeeper does, so bookies sharing a host can be told apart; a script written
   for BookKeeper strips `:port`. Answers are cached for the client's life, as ScriptBasedMapping's;
   a failing script (exit code, wrong count, timeout) leaves the bookies unresolved (logged) and is
   run for them again after SCRIPT_RETRY_S;
3. the `/bookies` znode, Pulsar's rack-affinity layout that ZkBookieRackAffinityMapping reads:
   JSON `{"<group>": {"<bookie id or host>": {"rack": "/region/rack", "hostname": ...}}}`; the group
   names are also the bookies' isolation groups. Read again at most every RACK_ZNODE_TTL_S;
4. the bookie's registration (BookieServiceInfo properties `rack` and `group`);
5. otherwise the policy's default rack (BookKeeper: "/default-rack" for the rack-aware policy,
   "/default-region/default-rack" for the region-aware one), as DNSResolverDecorator does.
Locations are normalized to start with "/" (as BookieRackAffinityMapping does); an empty or "/"
answer counts as unknown.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Iterable, Mapping

from bk.errors import BKError, IncorrectParameterError, MetadataNotFoundError
from bk.formats.wire import BOOKIE_INFO_FREE_DISK_SPACE, BOOKIE_INFO_TOTAL_DISK_CAPACITY

log = logging.getLogger(__name__)

DEFAULT_RACK = "/default-rack"  # BookKeeper's NetworkTopology.DEFAULT_RACK
DEFAULT_REGION = "/default-region"
DEFAULT_REGION_AND_RACK = DEFAULT_REGION + DEFAULT_RACK
RACK_ZNODE = "/bookies"  # Pulsar's BookieRackAffinityMapping.BOOKIE_INFO_ROOT_PATH
RACK_ZNODE_TTL_S = 5.0
SCRIPT_TIMEOUT_S = 10.0
SCRIPT_RETRY_S = 60.0  # after a failure, the script is run again for unresolved bookies at most this often
BOOKIE_INFO_TIMEOUT_S = 5.0
FREE_AND_TOTAL = BOOKIE_INFO_FREE_DISK_SPACE | BOOKIE_INFO_TOTAL_DISK_CAPACITY


def normalize_location(value) -> str | None:
    """'/region/rack' form of a location answer, or None for "unknown" (empty, '/', null)."""
    if value is None:
        return None
    text = str(value).strip()
    if not text or text == "/" or text.lower() in ("null", "none"):
        return None
    return text if text.startswith("/") else "/" + text


def _host(bookie: str) -> str:
    return bookie.rpartition(":")[0] or bookie


class RackLayout:
    """bookie -> location and bookie -> groups, from a flat mapping or Pulsar's grouped layout."""

    def __init__(self, locations: Mapping[str, str] | None = None, groups: Mapping[str, set] | None = None):
        self.locations = dict(locations or {})
        self.groups = {k: set(v) for k, v in (groups or {}).items()}

    @classmethod
    def parse(cls, data, what: str) -> "RackLayout":
        if not isinstance(data, Mapping):
            raise IncorrectParameterError(f"{what}: expected an object mapping bookies (or groups) to racks")
        locations: dict[str, str] = {}
        groups: dict[str, set] = {}
        for key, value in data.items():
            if isinstance(value, Mapping):  # Pulsar: group -> bookie -> {"rack": ...}
                for bookie, info in value.items():
                    groups.setdefault(str(bookie), set()).add(str(key))
                    rack = normalize_location(info.get("rack") if isinstance(info, Mapping) else info)
                    if rack is not None:
                        locations[str(bookie)] = rack
            else:
                rack = normalize_location(value)
                if rack is not None:
                    locations[str(key)] = rack
        return cls(locations, groups)

    @classmethod
    def load(cls, source) -> "RackLayout":
        """A dict, or a file: JSON, or lines `bookie location [group]` (# comments)."""
        if source is None or source == "":
            return cls()
        if isinstance(source, Mapping):
            return cls.parse(source, "network_topology_mapping")
        try:
            with open(source, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as e:
            raise IncorrectParameterError(f"network_topology_mapping: cannot read {source}: {e}") from None
        if text.lstrip().startswith("{"):
            try:
                return cls.parse(json.loads(text), f"network_topology_mapping {source}")
            except ValueError as e:
                raise IncorrectParameterError(f"network_topology_mapping {source}: bad JSON: {e}") from None
        locations, groups = {}, {}
        for number, line in enumerate(text.splitlines(), 1):
            parts = line.split("#", 1)[0].split()
            if not parts:
                continue
            if len(parts) not in (2, 3) or normalize_location(parts[1]) is None:
                raise IncorrectParameterError(
                    f"network_topology_mapping {source}:{number}: expected `bookie /region/rack [group]`, got {line!r}")
            locations[parts[0]] = normalize_location(parts[1])
            if len(parts) == 3:
                groups.setdefault(parts[0], set()).add(parts[2])
        return cls(locations, groups)

    def location(self, bookie: str) -> str | None:
        return self.locations.get(bookie) or self.locations.get(_host(bookie))

    def groups_of(self, bookie: str) -> set[str]:
        return self.groups.get(bookie, set()) | self.groups.get(_host(bookie), set())


class NetworkTopology:
    """The cache of bookie locations, groups and disk sizes one policy decides with."""

    def __init__(self, *, mapping=None, script: str = "", script_number_args: int = 100,
                 bookie_info_interval_s: float = 86400.0):
        self.static = RackLayout.load(mapping)
        self.script = script
        if script and not os.access(script, os.X_OK):
            raise IncorrectParameterError(f"network_topology_script_file_name {script!r} is not an executable file")
        self.script_number_args = max(1, int(script_number_args))
        self.bookie_info_interval_s = float(bookie_info_interval_s)
        self.default_rack = DEFAULT_RACK  # set by the policy
        self.store = None
        self.pool = None
        self.registration = None
        self._locations: dict[str, str] = {}  # resolved (known and historical) bookies
        self._script_answers: dict[str, str | None] = {}
        self._script_failed_at = float("-inf")
        self._pinned: dict[str, str] = {}
        self._znode: RackLayout = RackLayout()
        self._znode_read_at = float("-inf")
        self._registration: dict[str, RackLayout] = {}
        self.disk: dict[str, tuple[int, int]] = {}  # bookie -> (free, total) bytes
        self._disk_read_at: dict[str, float] = {}

    @classmethod
    def from_settings(cls, settings) -> "NetworkTopology":
        return cls(mapping=settings.network_topology_mapping, script=settings.network_topology_script_file_name,
                   script_number_args=settings.network_topology_script_number_args,
                   bookie_info_interval_s=settings.get_bookie_info_interval_seconds)

    def bind(self, *, store=None, pool=None, registration=None) -> None:
        if store is not None:
            self.store = store
        if pool is not None:
            self.pool = pool
        if registration is not None:
            self.registration = registration

    # ------------------------------------------------------------ lookups (synchronous, cached)
    def location(self, bookie: str) -> str:
        return self._locations.get(bookie) or self.default_rack

    def known(self, bookie: str) -> bool:
        return bookie in self._locations

    def groups_of(self, bookie: str) -> set[str]:
        reg = self._registration.get(bookie)
        return (self.static.groups_of(bookie) | self._znode.groups_of(bookie)
                | (reg.groups_of(bookie) if reg is not None else set()))

    def bookies_in_groups(self, groups: Iterable[str]) -> set[str]:
        wanted = set(groups)
        out = set()
        for layout in (self.static, self._znode, *self._registration.values()):
            out |= {b for b, gs in layout.groups.items() if gs & wanted}
        return out

    def grouped_bookies(self) -> set[str]:
        """Every bookie some source puts in a group."""
        out = set()
        for layout in (self.static, self._znode, *self._registration.values()):
            out |= {b for b, gs in layout.groups.items() if gs}
        return out

    @property
    def has_groups(self) -> bool:
        return bool(self.static.groups or self._znode.groups or any(r.groups for r in self._registration.values()))

    def set_location(self, bookie: str, location: str) -> None:
        """Tests and callers that know better: pin a bookie's location (it wins over every source)."""
        self._pinned[bookie] = self._locations[bookie] = normalize_location(location) or self.default_rack

    # ------------------------------------------------------------ learning (asynchronous)
    async def update(self, writable: Iterable[str], readonly: Iterable[str] = (), *, disk_info: bool = False) -> None:
        bookies = sorted(set(writable) | set(readonly))
        await self.resolve(bookies)
        if disk_info:
            await self._refresh_disk_info(sorted(set(writable)))

    async def resolve(self, bookies: Iterable[str]) -> dict[str, str]:
        bookies = list(dict.fromkeys(bookies))
        await self._refresh_znode()
        unresolved = []
        for bookie in bookies:
            location = self._pinned.get(bookie) or self.static.location(bookie)
            if location is None and self.script:
                unresolved.append(bookie)
                continue
            self._locations[bookie] = location or await self._late_sources(bookie)
        if unresolved:
            ask = [b for b in unresolved if b not in self._script_answers]
            if ask and time.monotonic() - self._script_failed_at < SCRIPT_RETRY_S:
                ask = []  # it failed a moment ago: not again on every ledger creation
            answers = await self._run_script(ask)
            self._script_answers.update(answers)
            for bookie in unresolved:
                self._locations[bookie] = self._script_answers.get(bookie) or await self._late_sources(bookie)
        return {b: self._locations[b] for b in bookies}

    async def _late_sources(self, bookie: str) -> str:
        location = self._znode.location(bookie)
        if location is None:
            location = (await self._registration_layout(bookie)).location(bookie)
        return location or self.default_rack

    async def _refresh_znode(self) -> None:
        if self.store is None or time.monotonic() - self._znode_read_at < RACK_ZNODE_TTL_S:
            return
        self._znode_read_at = time.monotonic()
        try:
            data, _ = await self.store.get(RACK_ZNODE)
        except MetadataNotFoundError:
            self._znode = RackLayout()
            return
        except BKError as e:
            log.warning("cannot read the rack layout %s: %s (keeping the last one)", RACK_ZNODE, e)
            return
        try:
            self._znode = RackLayout.parse(json.loads(data.decode() or "{}"), RACK_ZNODE)
        except (ValueError, IncorrectParameterError) as e:
            log.warning("rack layout %s is not valid JSON of Pulsar's layout: %s (ignored)", RACK_ZNODE, e)
            self._znode = RackLayout()

    async def _registration_layout(self, bookie: str) -> RackLayout:
        if bookie in self._registration or self.registration is None:
            return self._registration.get(bookie, RackLayout())
        layout = RackLayout()
        try:
            info = await self.registration.get_service_info(bookie)
        except BKError as e:
            log.debug("no registration properties for %s: %s", bookie, e)
            return layout  # not cached: asked again next time
        if info is not None:
            props = dict(info.properties)
            rack = normalize_location(props.get("rack"))
            layout = RackLayout({bookie: rack} if rack else {},
                                {bookie: {g.strip() for g in props.get("group", "").split(",") if g.strip()}})
        self._registration[bookie] = layout
        return layout

    async def _run_script(self, bookies: list[str]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for start in range(0, len(bookies), self.script_number_args):
            batch = bookies[start:start + self.script_number_args]
            try:
                proc = await asyncio.create_subprocess_exec(
                    self.script, *batch, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE)
                try:
                    async with asyncio.timeout(SCRIPT_TIMEOUT_S):
                        stdout, stderr = await proc.communicate()
                except asyncio.TimeoutError:
                    proc.kill()
                    await proc.wait()
                    raise OSError(f"no answer within {SCRIPT_TIMEOUT_S:g} s") from None
                if proc.returncode != 0:
                    raise OSError(f"exit code {proc.returncode}: {stderr.decode(errors='replace').strip()[:200]}")
                answers = stdout.decode(errors="replace").split()
                if len(answers) != len(batch):
                    raise OSError(f"printed {len(answers)} location(s) for {len(batch)} bookie(s)")
            except OSError as e:
                log.error("network topology script %s failed for %s: %s; those bookies get the default rack %s"
                          " (asked again in %g s)", self.script, batch, e, self.default_rack, SCRIPT_RETRY_S)
                self._script_failed_at = time.monotonic()
                continue  # not cached: tried again after SCRIPT_RETRY_S
            out.update({b: normalize_location(a) for b, a in zip(batch, answers)})
        return out

    async def _refresh_disk_info(self, bookies: list[str]) -> None:
        """GET_BOOKIE_INFO (free, total) from bookies not asked within get_bookie_info_interval_seconds
        (BookKeeper's BookieInfoReader: on new bookies and periodically)."""
        if self.pool is None:
            return
        now = time.monotonic()
        due = [b for b in bookies if now - self._disk_read_at.get(b, float("-inf")) >= self.bookie_info_interval_s]
        if not due:
            return

        async def ask(bookie: str):
            client = self.pool.get(bookie)
            async with asyncio.timeout(BOOKIE_INFO_TIMEOUT_S):
                return await client.call(client.send_bookie_info, FREE_AND_TOTAL)

        answers = await asyncio.gather(*(ask(b) for b in due), return_exceptions=True)
        for bookie, answer in zip(due, answers):
            if isinstance(answer, BaseException):
                log.info("GET_BOOKIE_INFO from %s failed: %s (weighted as unknown)", bookie, answer)
                continue  # asked again at the next cluster change
            self.disk[bookie] = (int(answer.free_disk_bytes), int(answer.total_disk_bytes))
            self._disk_read_at[bookie] = now

