"""The corruption suite's parts (tests/crash/test_corruption.py): databases written by the real
object store over the software card, a map of every on-disk structure in them, and trials that
flip one random byte of one structure and judge what the damage cost.

An image is two database files written through ``ObjectStore`` (what the gateway's sessions
store through) with objects of one to three fragments over both databases, overwrites of
another length (a tombstone buries the old version), deletes, and enough writes that regions
are reclaimed (their tombstones carried). A ``sealed`` image was closed cleanly; a ``crash``
image is the files as a kill leaves them (the open regions have no footer).

A trial copies an image, flips one byte of a structure of one kind (``KINDS``), runs
``adp-gateway check`` on it, opens it as the gateway does and loads every object. It records
whether check reported damage, the objects lost, the bytes returned wrong, and the deleted
objects that came back; ``owners`` are the objects whose own bytes the flip hit.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from adp_gateway.card.software.check import check
from adp_gateway.card.software.format import Kind, unpack_header, unpack_superblock
from adp_gateway.card.software.sealing import TRAILER_BYTES, unpack_trailer
from adp_gateway.objects.census import ObjectCensus
from adp_gateway.objects.names import parse
from adp_gateway.objects.store import ObjectStore
from adp_wire.ring.layout import PAGE_BYTES, align_up
from tests.support.storage import FRAGMENT, REGION, extent, make_devices, open_store, payload

DATABASES = 2
DATABASE_BYTES = PAGE_BYTES + 8 * REGION
SPARE_BYTES = 4 * REGION
TENANT = "t"
KINDS = ("superblock", "region start", "record header", "payload", "footer", "trailer")


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of database ``database`` that make one structure; ``owner`` is
    the live object they belong to (None: no object's, or a dead record's)."""

    database: int
    start: int
    end: int
    owner: str | None = None
    tombstone: bool = False


@dataclass
class Image:
    """Database files and what they hold: the objects a load must return, every version
    ever stored of each key (a deleted one that comes back must be one of them), and the map
    of their structures by kind."""

    directory: Path
    held: dict[str, bytes]
    history: dict[str, set[bytes]]
    deleted: set[str]
    spans: dict[str, list[Span]] = field(default_factory=dict)

    def paths(self, directory: Path | None = None) -> list[Path]:
        base = directory or self.directory
        return [base / f"db{i}.adp" for i in range(DATABASES)]


def write_image(directory: Path, seed: int, crash: bool) -> Image:
    """Work objects through a store over fresh database files in ``directory``; ``crash``:
    copy the files before the store is closed (what a kill leaves), else close it first."""
    rng = random.Random(seed)
    work = directory / "work"
    work.mkdir(parents=True)
    store = open_store(make_devices("file", work, DATABASES, DATABASE_BYTES))
    current: dict[str, bytes] = {}
    history: dict[str, set[bytes]] = {}
    for step in range(140):
        key = f"k{rng.randrange(48)}"
        if key in current and rng.random() < 0.15:
            store.delete(TENANT, [key])
            del current[key]
            continue
        size = rng.choice([3_000, 40_000, FRAGMENT, FRAGMENT + 5_000, 2 * FRAGMENT + 777])
        if store.exists(TENANT, [key])[0] and len(current.get(key, b"")) == size:
            continue  # the store keeps what it holds (keys name content): no write
        data = payload(seed * 1000 + step, size)
        store.put(TENANT, key, extent(data), size)
        current[key] = data
        history.setdefault(key, set()).add(data)
    if not crash:
        store.close()
    _copy(work, directory)
    if crash:
        store.close()  # after the copy: the image keeps the open regions as a kill leaves them
    shutil.rmtree(work)
    # What the image holds, from a copy opened as the gateway opens it (a recovery writes
    # footers and may repair): the image itself stays as it was written.
    analysis = directory / "analysis"
    analysis.mkdir()
    _copy(directory, analysis)
    reopened = open_store(make_devices("file", analysis, DATABASES, DATABASE_BYTES))
    try:
        held = {k: v for k, v in current.items() if reopened.exists(TENANT, [k])[0]}
        image = Image(directory, held, history, set(history) - set(current))
        image.spans = structures(image, reopened)
    finally:
        reopened.close()
        shutil.rmtree(analysis)
    return image


def _copy(source: Path, target: Path) -> None:
    for i in range(DATABASES):
        shutil.copyfile(source / f"db{i}.adp", target / f"db{i}.adp")


def structures(image: Image, store: ObjectStore) -> dict[str, list[Span]]:
    """Every structure of the image's databases by kind, read from the files as they are."""
    spans: dict[str, list[Span]] = {kind: [] for kind in KINDS}
    for database, path in enumerate(image.paths()):
        data = path.read_bytes()
        superblock = unpack_superblock(data[:PAGE_BYTES])
        assert superblock is not None, f"{path} has no superblock"
        spans["superblock"].append(Span(database, 0, PAGE_BYTES))
        for start in range(PAGE_BYTES, len(data) - REGION + 1, REGION):
            _region(spans, database, data, start, superblock.salt, store)
    return spans


def _region(
    spans: dict[str, list[Span]],
    database: int,
    data: bytes,
    start: int,
    salt: int,
    store: ObjectStore,
) -> None:
    first = unpack_header(data[start : start + PAGE_BYTES], salt)
    if first is None or first.kind != Kind.REGION:
        return  # a free region
    spans["region start"].append(Span(database, start, start + PAGE_BYTES))
    offset, limit = PAGE_BYTES, REGION - TRAILER_BYTES
    while offset + PAGE_BYTES <= limit:
        at = start + offset
        header = unpack_header(data[at : at + PAGE_BYTES], salt)
        if header is None or header.epoch != first.epoch:
            break
        owner = _owner(store, header.tenant, header.key) if header.kind == Kind.DATA else None
        tombstone = header.kind == Kind.TOMBSTONE
        spans["record header"].append(Span(database, at, at + PAGE_BYTES, owner, tombstone))
        if header.kind == Kind.DATA and header.fragment_bytes:
            body = at + PAGE_BYTES
            spans["payload"].append(Span(database, body, body + header.fragment_bytes, owner))
        offset += header.record_bytes
    trailer_at = start + REGION - TRAILER_BYTES
    trailer = unpack_trailer(memoryview(data[trailer_at : start + REGION]), salt)
    if trailer is None or trailer.epoch != first.epoch:
        return  # the region open at a kill: no footer yet
    spans["trailer"].append(Span(database, trailer_at, trailer_at + TRAILER_BYTES))
    footer = start + trailer.footer_offset
    spans["footer"].append(Span(database, footer, footer + align_up(trailer.footer_bytes)))


def _owner(store: ObjectStore, tenant: str, name: str) -> str | None:
    """The live object a record of ``name`` is a fragment of; None for a dead version's."""
    fragment = parse(name)
    if fragment is None:
        return None
    live = store.version(tenant, fragment.key)
    return fragment.key if live == fragment.version else None


@dataclass
class Outcome:
    kind: str
    reported: bool  # check named damage
    lost: set[str]  # held objects that did not load
    wrong: int  # loads that returned bytes other than the object's
    back: set[str]  # deleted objects that loaded again (each one of its own past versions)
    owners: set[str]  # the objects whose own bytes the flip hit
    tombstone: bool  # the flip hit a tombstone's header


def trial(image: Image, scratch: Path, rng: random.Random, kind: str | None) -> Outcome:
    """Flip one byte of a structure of ``kind`` in a copy of ``image`` (None: flip nothing),
    check it, open it as the gateway does, and load every object."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    _copy(image.directory, scratch)
    span = Span(-1, 0, 0)
    if kind is not None:
        span = rng.choice(image.spans[kind])
        offset = rng.randrange(span.start, span.end)
        with open(scratch / f"db{span.database}.adp", "r+b") as f:
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ rng.randrange(1, 256)]))
    paths = [str(p) for p in image.paths(scratch)]
    report = check(paths, False, lambda *progress: None, REGION, ObjectCensus())
    # Opened with room to spare: the tombstone a failed verification writes must not evict
    # another object (a full cache's eviction is no damage's cost).
    store = open_store(make_devices("file", scratch, DATABASES, DATABASE_BYTES + SPARE_BYTES))
    try:
        lost: set[str] = set()
        back: set[str] = set()
        wrong = 0
        for key, data in image.held.items():
            into = extent(bytes(len(data)))
            if not store.get(TENANT, key, into, len(data)):
                lost.add(key)
            elif bytes(into[: len(data)]) != data:
                wrong += 1
        for key in image.deleted:
            if store.exists(TENANT, [key])[0]:
                back.add(key)
                into = extent(bytes(2 * FRAGMENT + 777))
                version = store.version(TENANT, key)
                assert version is not None
                size = version.object_bytes
                got = store.get(TENANT, key, into, size)
                wrong += got and bytes(into[:size]) not in image.history[key]
    finally:
        store.close()
    owners = {span.owner} if span.owner is not None else set()
    return Outcome(kind or "none", bool(report.damage), lost, wrong, back, owners, span.tombstone)


@dataclass
class Tally:
    """The suite's figures."""

    trials: Counter[str] = field(default_factory=Counter)  # by kind
    reported: int = 0
    lost: int = 0
    lost_beyond_own: int = 0
    wrong: int = 0
    back: int = 0
    back_without_tombstone_hit: int = 0

    def add(self, outcome: Outcome) -> None:
        self.trials[outcome.kind] += 1
        self.reported += outcome.reported
        self.lost += len(outcome.lost)
        self.lost_beyond_own += len(outcome.lost - outcome.owners)
        self.wrong += outcome.wrong
        self.back += len(outcome.back)
        self.back_without_tombstone_hit += bool(outcome.back) and not outcome.tombstone

    def line(self) -> str:
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self.trials.items()))
        return (
            f"{sum(self.trials.values())} trials ({kinds}): damage reported by check in "
            f"{self.reported}, objects lost {self.lost} (beyond the objects hit: "
            f"{self.lost_beyond_own}), wrong bytes {self.wrong}, deleted objects back "
            f"{self.back} (without a tombstone hit: {self.back_without_tombstone_hit})"
        )
