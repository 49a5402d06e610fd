"""Goal: the gateway survives being SIGKILLed at any moment, again and again, on the same data.

A model-based crash test in the style of RocksDB's crash test and foyer's recovery test. Each
cycle: start the gateway on the same data dir, check every key against the model, run the driver
(tests/support/crash_driver.py: the real plugin, random stores, deletes, loads and EXISTS on a small
key space, every event logged) for a random 0.2-1.5 s, SIGKILL the gateway mid-traffic (mid-write,
mid-sync, mid-eviction), stop the driver, and replay its event log into the model. After the last
kill the gateway is started and checked once more. ``no_eviction`` starts over on an empty data dir
(a new "generation") only when the next cycle could fill a database; any region reclaimed in that
configuration fails the test, as its presence checks would not hold.

The last two tests show the oracle can fail: a load hit with a flipped byte (planted in the
driver) and objects corrupted on disk (reported missing, never as wrong bytes).

What must hold (a violation fails the test, naming cycle, key, expected, seen and the logs):

1. No load ever returns wrong bytes: a hit holds exactly ``content(key, length)``.
2. ``no_eviction`` (capacity far above what is written): a key whose last acknowledged op was a
   store of length L, with nothing in flight at the kill, is present and loads byte-exact with
   L; one whose last acknowledged op was a delete is absent. A key with a store or delete in
   flight at the kill may hold its old state, the new one or (an overwrite buries the old version
   before it writes the new one) nothing; the check after the restart records which.
3. ``eviction`` (capacity a few times below what one cycle writes): presence is not required,
   but a key that EXISTS reports loads byte-exact (the index matches the disk) with a length it
   may hold as in 2: a deleted key never comes back, nor a version replaced by an acknowledged
   store of another length. The check loads every length stored since the last acknowledged
   delete, so an older version that came back is seen.

Every configuration above runs with ``sync: always``; ``*_sync_periodic`` and ``*_sync_none``
check the same promises under the cheaper policies, which differ only on a power cut (modelled
in tests/unit/test_faults.py), never on a kill of the gateway.

Short form (default, CI): a few cycles per configuration. Long form: ``-m slow``, 100 cycles per
configuration. ``ADP_CRASH_CYCLES`` overrides the cycle count of both, ``ADP_CRASH_SEED`` the
random seed (printed with the result); ``ADP_CRASH_KEEP=1`` keeps the work dirs (gateway log,
driver event logs, data dir) for a post-mortem.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adp_wire import fragmenter
from adp_wire.checksum import key_hash
from adp_wire.ring.layout import align_up
from lmcache_adp import ADPConnector
from tests.support import (
    BIN,
    Gateway,
    Process,
    remove_tree,
    short_tmpdir,
    wait_for_future,
    wait_until,
)
from tests.support.crash_model import (
    ABSENT,
    EXIT_VIOLATION,
    FRAGMENT_BYTES,
    PAGE,
    Model,
    content,
    describe_mismatch,
    key_name,
    read_events,
    replay,
    states_text,
)

KEYS = 200
DATABASES = 2
REGION_BYTES = 2**20
# A region's room not used for records, at most: less than one record when it is sealed, plus
# record headers, its footer and trailer (adp_gateway/card/software/sealing.py), with a margin.
REGION_OVERHEAD_BYTES = 64 * 2**10
GATEWAY_YAML = f"""\
databases_per_dir: {DATABASES}
region_size: {REGION_BYTES}
fragment_size: {FRAGMENT_BYTES}
io_threads: 4
session_slots: 64
session_window_size: 64MiB
log_level: DEBUG
"""
RUN_S = (0.2, 1.5)  # how long the driver runs before the kill
OUTAGE_S = (0.05, 0.3)  # how long it keeps going against the dead gateway
SHORT_CYCLES = 5  # per configuration
LONG_CYCLES = 100
RECLAIM_LINE = "reclaimed database"  # the gateway's DEBUG line for an evicted region
GATEWAY_RING_ERROR = "dropping the session"  # the gateway's ERROR line for a protocol error
PLUGIN_RING_ERROR = "gateway link broken: peer"  # the plugin's, in the driver's log
TORN_LINE = "was torn by a crash"  # the gateway's WARNING for a record a recovery dropped
LOAD_BATCH = 24


@dataclass(frozen=True)
class CrashConfig:
    name: str
    capacity_bytes: int
    strict: bool  # no eviction: acknowledged objects must survive
    shared_l1: bool = False  # the driver's buffers in a shared-memory L1: zero-copy stores
    # The gateway's sync policy. A kill of the gateway process loses nothing acknowledged under
    # any of them: an acknowledged write is in the kernel (O_DIRECT: on the device) already.
    sync: str = "always"


CONFIGS = {
    "no_eviction": CrashConfig("no_eviction", 2 * 2**30, strict=True),
    "eviction": CrashConfig("eviction", 16 * 2**20, strict=False),
    "no_eviction_shared_l1": CrashConfig("no_eviction_shared_l1", 2 * 2**30, True, True),
    "eviction_shared_l1": CrashConfig("eviction_shared_l1", 16 * 2**20, False, True),
    "no_eviction_sync_periodic": CrashConfig(
        "no_eviction_sync_periodic", 2 * 2**30, strict=True, sync="periodic"
    ),
    "no_eviction_sync_none": CrashConfig(
        "no_eviction_sync_none", 2 * 2**30, strict=True, sync="none"
    ),
    "eviction_sync_none": CrashConfig("eviction_sync_none", 16 * 2**20, strict=False, sync="none"),
}


class CrashFailure(AssertionError):
    """A violation of the crash test's invariants, or a gateway that did not come back."""


@dataclass
class Finding:
    kind: str  # wrong_bytes, lost, resurrected, unexpected_version, index_mismatch, ...
    key: int
    text: str


@dataclass
class Harness:
    """The controller: one gateway, one driver per cycle, the model and the oracle."""

    workdir: Path
    config: CrashConfig
    seed: int
    plant_wrong_bytes: bool = False
    model: Model = field(default_factory=lambda: Model(KEYS))
    history: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    stats: Counter[str] = field(default_factory=Counter)
    cycle: int = 0
    generation: int = 1
    restarts_in_generation: int = 0
    appended_per_database: list[int] = field(default_factory=lambda: [0] * DATABASES)
    driver: Process | None = None
    kill_time: float = 0.0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        config_path = self.workdir / "gateway.yaml"
        config_path.write_text(GATEWAY_YAML + f"sync: {self.config.sync}\n")
        self.gateway = Gateway(
            self.workdir, str(self.config.capacity_bytes), "--config", str(config_path)
        )
        self.log_mark = 0

    # The cycle ------------------------------------------------------------------------------

    def run(self, cycles: int) -> None:
        started = time.monotonic()
        for _ in range(cycles):
            self.cycle += 1
            budget = self._budget()
            self.start_gateway()
            self.fail_on(self.check())
            self.drive_until_kill(budget)
        self.cycle += 1
        self.start_gateway()
        self.fail_on(self.check())
        self.gateway.stop()
        self.check_disk()
        self.stats["seconds"] = round(time.monotonic() - started)
        # Not crash-consistency violations, but bugs worth seeing: ring protocol errors between
        # the real plugin and the real gateway that dropped a session (its ops failed).
        self.stats["ring_errors_gateway"] = self.gateway.log().count(GATEWAY_RING_ERROR)
        driver_log = _text(self.workdir / "driver.log")
        self.stats["ring_errors_driver"] = driver_log.count(PLUGIN_RING_ERROR)
        self.stats["zero_copy_sessions"] = self.gateway.log().count("(zero-copy to its L1)")
        # Records a kill cut short (a valid header, a torn payload) that a restart dropped.
        self.stats["torn_records_dropped"] = self.gateway.log().count(TORN_LINE)

    def check_disk(self) -> None:
        """After the last restart (which recovered and sealed what the kills left) and a clean
        stop, `adp-gateway check` must find every record intact and every footer right: the
        index a restart builds matches the disk."""
        config = str(self.workdir / "gateway.yaml")
        argv = [str(BIN / "adp-gateway"), "check", "--config", config]
        result = subprocess.run(
            [*argv, "--data-dir", str(self.gateway.data_dir)], capture_output=True, text=True
        )
        summary = result.stdout.strip().splitlines()[-1:] or [result.stderr]
        self.stats["check_records"] = (
            int(summary[0].split(": ")[1].split()[0]) if result.stdout else 0
        )
        if result.returncode != 0 or " 0 damaged" not in summary[0]:
            raise CrashFailure(
                self._where() + f"adp-gateway check after the last restart:\n{result.stdout}"
                f"{result.stderr}"
            )

    def start_gateway(self) -> None:
        self.log_mark = len(self.gateway.log())
        try:
            self.gateway.start()
        except (AssertionError, TimeoutError) as exc:
            why = str(exc).splitlines()[0]  # the helper's message, then the whole log
            raise CrashFailure(
                self._where() + f"the gateway did not come back after the kill ({why})"
                f"\n{self._tails()}"
            ) from None
        self.restarts_in_generation += 1

    def drive_until_kill(self, budget: int) -> None:
        state = {"model": self.model.to_json(), "strict": self.config.strict, "budget": budget}
        state_path = self.workdir / "state.json"
        state_path.write_text(json.dumps(state))
        events_path = self.workdir / f"events-{self.cycle:04d}.jsonl"
        self.driver = Process("driver", self.workdir / "driver.log")
        argv = [sys.executable, "-m", "tests.support.crash_driver", "--socket"]
        argv += [str(self.gateway.socket_path), "--state", str(state_path)]
        argv += ["--events", str(events_path), "--seed", str(self.rng.randrange(2**32))]
        if self.plant_wrong_bytes:
            argv.append("--plant-wrong-bytes")
        if self.config.shared_l1:
            argv.append("--shared-l1")
        env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"}
        self.driver.spawn(argv, env=env)
        driver = self.driver
        try:
            wait_until(
                lambda: '"ev":"ready"' in _text(events_path) or not driver.alive,
                60,
                "the driver to reach the gateway",
            )
        except TimeoutError as exc:
            raise CrashFailure(self._where() + f"{exc}\n{self._tails()}") from None
        if driver.alive:
            time.sleep(self.rng.uniform(*RUN_S))
        driver_died = not driver.alive
        self.kill_time = time.time()
        self.gateway.kill()
        time.sleep(self.rng.uniform(*OUTAGE_S))
        code = driver.stop(signal.SIGTERM, timeout_s=30)
        self.driver = None
        events = read_events(events_path)
        self._record(events)
        replay(self.model, events)
        self.model.end_lifetime()
        findings = [
            Finding(e["kind"], e["key"], f"(driver, live) {e['text']}")
            for e in events
            if e["ev"] == "violation"
        ]
        findings += [  # a wrong load the driver did not flag itself
            Finding("wrong_bytes", e["key"], f"(driver, live) a load of {e['len']} hit wrong bytes")
            for e in events
            if e["ev"] == "ack" and e["op"] == "load" and e.get("match") is False
            if e["key"] not in {f.key for f in findings}
        ]
        self.fail_on(findings)
        if code != 0 or driver_died:
            detail = "died before the kill" if driver_died else f"exited with {code}"
            raise CrashFailure(
                self._where() + f"the driver {detail} (violation exit is {EXIT_VIOLATION})"
                f"\n{self._tails()}"
            )
        reclaims = self.gateway.log()[self.log_mark :].count(RECLAIM_LINE)
        self.stats["regions_reclaimed"] += reclaims
        if self.config.strict and reclaims:
            raise CrashFailure(
                self._where() + f"{reclaims} region(s) were evicted in the no-eviction config: "
                "the test's write budget is wrong, its presence checks would not hold"
                f"\n{self._tails()}"
            )

    def _budget(self) -> int:
        """Bytes the next driver may append without any eviction; -1 when eviction is fine.

        Per database (the gateway's own placement, adp_wire/fragmenter.py): a region is sealed
        with less than one record and its overhead free, and every restart leaves each
        database's open region behind. The driver counts what it appends over all databases,
        so it stays within the room of the fullest one. The DEBUG log of reclaimed regions
        backs this up: any in this configuration fails the test.
        """
        if not self.config.strict:
            return -1
        regions = (self.config.capacity_bytes // DATABASES - PAGE) // REGION_BYTES
        usable = REGION_BYTES - FRAGMENT_BYTES - REGION_OVERHEAD_BYTES
        for _ in range(2):
            fullest = max(self.appended_per_database)
            needed = -(-fullest // usable) + self.restarts_in_generation + 2
            budget = (regions - needed - 1) * usable
            if budget >= 64 * 2**20:
                return budget
            self._new_generation()
        raise AssertionError("the no-eviction capacity is too small for one cycle")

    def _new_generation(self) -> None:
        """Start over on an empty data dir (only where the next cycle could evict)."""
        remove_tree(self.gateway.data_dir)
        self.model = Model(KEYS)
        self.generation += 1
        self.restarts_in_generation = 0
        self.appended_per_database = [0] * DATABASES
        self.history.clear()

    def _record(self, events: list[dict[str, Any]]) -> None:
        for e in events:
            if e["ev"] == "submit":
                self._count_appended(e["key"], e.get("len", 0))
            if e["ev"] not in ("submit", "ack") or e["op"] not in ("store", "delete"):
                continue
            what = f"{e['ev']} {e['op']}" + (f" {e['len']}" if "len" in e else "")
            if e["ev"] == "ack":
                what += " ok" if e["ok"] else " FAILED"
                self.stats[f"{e['op']}_{'acked' if e['ok'] else 'failed'}"] += 1
            self._note(e["key"], f"{what} at kill{e['t'] - self.kill_time:+.3f}s")
        self.stats["load_hits_verified"] += sum(
            1 for e in events if e["ev"] == "ack" and e["op"] == "load" and e.get("match")
        )

    def _count_appended(self, key: int, length: int) -> None:
        """Add what a store (or a delete: length 0) may append to each database."""
        plan = fragmenter.plan(
            max(length, 1), FRAGMENT_BYTES, DATABASES, key_hash("default", key_name(key))
        )
        self.appended_per_database[plan[0].database] += PAGE  # a tombstone
        if length:
            for fragment in plan:
                self.appended_per_database[fragment.database] += PAGE + align_up(fragment.length)

    def _note(self, key: int, text: str) -> None:
        notes = self.history[key]
        notes.append(f"c{self.cycle}: {text}")
        del notes[:-14]

    # The check after a restart --------------------------------------------------------------

    def check(self) -> list[Finding]:
        """Compare every key with the model (nothing else in flight), then record what was seen."""
        connector = ADPConnector(**self.gateway.adapter_params(reconnect_interval_s=0.05))
        try:
            return self._check(connector)
        finally:
            connector.close()

    def _check(self, connector: ADPConnector) -> list[Finding]:
        names = [key_name(k) for k in range(KEYS)]
        found = self._answered(connector, lambda: connector.submit_batch_exists(names), "EXISTS")
        states = self.model.states
        candidates = [
            (k, length)
            for k in range(KEYS)
            for length in sorted((states[k].possible | states[k].legit) - {ABSENT})
        ]
        hits: dict[int, list[int]] = defaultdict(list)
        findings: list[Finding] = []
        for at in range(0, len(candidates), LOAD_BATCH):
            chunk = candidates[at : at + LOAD_BATCH]
            results = self._load_chunk(connector, chunk, findings)
            for (k, length), hit in zip(chunk, results, strict=True):
                if hit:
                    hits[k].append(length)
                    self.stats["check_hits_verified"] += 1
        for k in range(KEYS):
            finding = self._judge(k, found[k], hits[k])
            if finding is not None:
                findings.append(finding)
        return findings

    def _load_chunk(
        self, connector: ADPConnector, chunk: list[tuple[int, int]], findings: list[Finding]
    ) -> list[bool]:
        """Load each (key, length) of ``chunk``; a hit with wrong bytes is added to findings."""
        buffers: list[bytearray] = []

        def load() -> int:
            buffers[:] = [bytearray(b"\xa5" * length) for _, length in chunk]
            return connector.submit_batch_get(
                [key_name(k) for k, _ in chunk], [memoryview(b) for b in buffers]
            )

        def verify(results: list[bool]) -> None:
            for (k, length), hit, buffer in zip(chunk, results, buffers, strict=True):
                if hit and buffer != content(k, length):
                    findings.append(
                        Finding(
                            "wrong_bytes",
                            k,
                            f"a load of length {length} hit with wrong bytes: "
                            f"{describe_mismatch(k, length, buffer)}",
                        )
                    )

        results = self._answered(connector, load, "GET", verify)
        verify(results)
        return results

    def _answered(
        self,
        connector: ADPConnector,
        submit: Callable[[], int],
        what: str,
        on_failure: Callable[[list[bool]], None] | None = None,
    ) -> list[bool]:
        """The per-key results of the first attempt that the gateway answered (ok).

        An attempt that failed has no verdict (a miss is ok with False): the plugin may have
        lost its session (it reconnects by itself), so the op is retried. Hits of a failed
        attempt are still checked for wrong bytes by ``on_failure``.
        """
        deadline = time.monotonic() + 30
        while True:
            item = wait_for_future(connector, submit())
            if item[1]:
                return list(item[3])
            if on_failure is not None:
                on_failure(list(item[3]))
            if time.monotonic() > deadline:
                raise CrashFailure(
                    self._where() + f"a check {what} kept failing for 30 s: {item}\n{self._tails()}"
                )
            self.stats["check_ops_retried"] += 1
            time.sleep(0.05)

    def _judge(self, key: int, present: bool, hits: list[int]) -> Finding | None:
        state = self.model.states[key]
        observed = hits[0] if hits else ABSENT
        candidates = states_text((state.possible | state.legit) - {ABSENT})
        seen = (
            f"present with length {observed}"
            if present and hits
            else f"EXISTS true but loads of every length it may hold {candidates} missed"
            if present
            else f"EXISTS false but a load of length {observed} hit"
            if hits
            else "absent"
        )
        kind = ""
        if len(hits) > 1:
            kind, seen = "several_versions", f"loads of lengths {hits} all hit"
        elif present != bool(hits):
            kind = "index_mismatch"
        if self.config.strict:
            expected = f"a state in {states_text(state.possible)}"
            if not kind and observed not in state.possible:
                kind = (
                    "lost"
                    if observed == ABSENT
                    else "resurrected"
                    if state.possible == {ABSENT}
                    else "unexpected_version"
                )
        else:
            lengths = states_text(state.possible - {ABSENT})
            expected = f"absent (evicted) or a length in {lengths}"
            if not kind and observed != ABSENT and observed not in state.possible:
                # An older version back: one shadowed by a delete, or by an overwrite with
                # another length (the store buries the old version before it writes the new).
                kind = "resurrected" if observed not in state.legit else "overwritten_came_back"
        if len(state.possible) > 1:
            self.stats["uncertain_resolved_" + ("absent" if observed == ABSENT else "present")] += 1
        self.stats["present_at_check"] += observed != ABSENT
        self.model.observe(key, observed)
        self._note(key, f"check: {seen}")
        if not kind:
            return None
        return Finding(kind, key, f"expected {expected}; seen {seen}")

    # Reporting ------------------------------------------------------------------------------

    def fail_on(self, findings: list[Finding]) -> None:
        if not findings:
            return
        lines = [
            self._where() + f"{len(findings)} violation(s) after {self.cycle - 1} survived kill(s)"
        ]
        for f in findings[:8]:
            history = "\n      ".join(self.history.get(f.key, []))
            lines.append(f"  [{f.kind}] key {f.key} ({key_name(f.key)}): {f.text}")
            lines.append(f"    history of key {f.key}:\n      {history}")
        raise CrashFailure("\n".join(lines) + "\n" + self._tails())

    def _where(self) -> str:
        return (
            f"cycle {self.cycle} ({self.config.name}, generation {self.generation}, "
            f"seed {self.seed}): "
        )

    def _tails(self) -> str:
        gateway_tail = "\n".join(self.gateway.log().splitlines()[-40:])
        driver_log = self.workdir / "driver.log"
        driver_tail = "\n".join(_text(driver_log).splitlines()[-15:])
        return f"--- gateway log tail ---\n{gateway_tail}\n--- driver log tail ---\n{driver_tail}"

    def close(self) -> None:
        if self.driver is not None:
            self.driver.kill()
        self.gateway.kill()


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def cycles(default: int) -> int:
    return int(os.environ.get("ADP_CRASH_CYCLES", default))


@pytest.fixture
def make_harness() -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []
    workdirs: list[Path] = []

    def make(config: str, **kwargs: Any) -> Harness:
        seed = int(os.environ.get("ADP_CRASH_SEED", random.randrange(2**32)))
        workdirs.append(short_tmpdir())
        harness = Harness(workdirs[-1], CONFIGS[config], seed, **kwargs)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()
    for workdir in workdirs:
        if os.environ.get("ADP_CRASH_KEEP"):  # for a post-mortem: logs, events, data dir
            print(f"crash test workdir kept: {workdir}")
        else:
            remove_tree(workdir)


def run_and_report(harness: Harness, count: int, capsys: pytest.CaptureFixture[str]) -> None:
    harness.run(count)
    stats = ", ".join(f"{k}={v}" for k, v in sorted(harness.stats.items()))
    with capsys.disabled():
        print(
            f"\ncrash test {harness.config.name}: survived {count} kill cycles "
            f"(seed {harness.seed}, {harness.generation} generation(s)): {stats}"
        )
    if not harness.config.strict and count >= 3:
        assert harness.stats["regions_reclaimed"] > 0, "the eviction config never evicted"
    if harness.config.shared_l1:  # the driver's stores of whole pages went zero-copy
        assert harness.stats["zero_copy_sessions"] >= count, "the gateway never took the L1"


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_crash_short(
    make_harness: Callable[..., Harness], capsys: pytest.CaptureFixture[str], config: str
) -> None:
    run_and_report(make_harness(config), cycles(SHORT_CYCLES), capsys)


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_crash_long(
    make_harness: Callable[..., Harness], capsys: pytest.CaptureFixture[str], config: str
) -> None:
    run_and_report(make_harness(config), cycles(LONG_CYCLES), capsys)


# The oracle can fail -------------------------------------------------------------------------


def test_oracle_reports_a_load_with_wrong_bytes(make_harness: Callable[..., Harness]) -> None:
    """A planted bug (the driver flips a byte of a load hit) fails the run, naming the key."""
    harness = make_harness("no_eviction", plant_wrong_bytes=True)
    with pytest.raises(CrashFailure, match=r"\[wrong_bytes\] key \d+") as failure:
        harness.run(4)
    assert "bytes differ, the first at offset" in str(failure.value)
    assert "--- gateway log tail ---" in str(failure.value)


def test_oracle_reports_corrupted_objects_as_lost_not_as_wrong_bytes(
    make_harness: Callable[..., Harness],
) -> None:
    """A byte flipped on disk in every record's payload, with the gateway down: every object
    that must be there is reported missing (the gateway verifies and misses), never wrong."""
    harness = make_harness("no_eviction")
    harness.run(2)  # ends with the gateway killed after its last check
    required = {
        k: next(iter(s.possible))
        for k, s in enumerate(harness.model.states)
        if len(s.possible) == 1 and ABSENT not in s.possible
    }
    assert required, "no acknowledged object to corrupt"
    flipped = flip_a_payload_byte_of_every_record(harness.gateway.data_dir)
    assert flipped > 0
    harness.cycle += 1
    harness.start_gateway()
    findings = harness.check()
    harness.gateway.kill()
    assert not [f for f in findings if f.kind == "wrong_bytes"], findings
    reported = {f.key for f in findings if f.kind in ("lost", "index_mismatch")}
    assert set(required) <= reported, (sorted(required), findings)
    with pytest.raises(CrashFailure, match=r"\[(lost|index_mismatch)\] key \d+"):
        harness.fail_on(findings)


def flip_a_payload_byte_of_every_record(data_dir: Path) -> int:
    """Flip a byte in the first payload page after every record header; returns how many."""
    magic = np.frombuffer(b"ADPFRAG1", np.uint8)
    flipped = 0
    for path in sorted(data_dir.glob("db*.adp")):
        disk = np.memmap(path, dtype=np.uint8, mode="r+")
        pages = disk[: len(disk) // PAGE * PAGE].reshape(-1, PAGE)
        header = (pages[:, : len(magic)] == magic).all(axis=1)
        payload = np.flatnonzero(header[:-1] & ~header[1:]) + 1
        pages[payload, 100] ^= 0x01
        disk.flush()
        flipped += len(payload)
        del pages, disk
    return flipped
