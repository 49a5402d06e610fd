"""Hostile clients of a gateway, for the hostile-client suite (tests/soak/test_hostile.py):
one process per kind, run for a while, then a JSON line of what it did.

    python -m tests.support.hostile_clients --socket PATH --kind KIND --seconds S
        [--uid U --gid G] [--connections N] [--seed N]

Started as root with ``--uid``/``--gid``, it drops to that user once its imports are done (the
venv need not be readable by it): a stranger the gateway config does not declare.

- ``slow``: N connections that send nothing, each reopened as soon as the gateway drops it;
- ``drip``: N connections that send a frame length, then one byte every 0.5 s;
- ``flood``: connections opened and closed as fast as the gateway takes them (half of them
  after half a hello), at most 200 a second;
- ``garbage``: frames of every wrong kind: random bytes, lengths past the limit, msgpack that
  is no map, hellos of another protocol or an undeclared tenant, status requests;
- ``ring``: a declared client (run it as a tenant's uid) that handshakes, then writes garbage
  into its shared memory and rings: the gateway must drop its session alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import socket
import struct
import sys
import time
from collections import Counter

import msgpack

from adp_wire.protocol import (
    Hello,
    Op,
    hello_body,
    parse_welcome,
    recv_frame,
    send_frame,
    status_request,
)
from adp_wire.ring.layout import SQ_TAIL, SUBMISSION, RingLayout, map_shared

FLOOD_PER_SECOND = 200


def main() -> int:
    args = _parser().parse_args()
    if args.gid is not None:
        os.setgroups([])
        os.setgid(args.gid)
    if args.uid is not None:
        os.setuid(args.uid)
    counts: Counter[str] = Counter()
    deadline = time.monotonic() + args.seconds
    rng = random.Random(args.seed)
    kinds = {"slow": _slow, "drip": _drip, "flood": _flood, "garbage": _garbage, "ring": _ring}
    kinds[args.kind](args.socket, deadline, args.connections, rng, counts)
    print(json.dumps({"kind": args.kind, **counts}), flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--uid", type=int)
    parser.add_argument("--gid", type=int)
    parser.add_argument("--connections", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _connect(path: str, counts: Counter[str]) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        counts["connect refused"] += 1
        return None
    counts["connected"] += 1
    return sock


def _dropped(sock: socket.socket) -> bool:
    """Whether the gateway has answered (a refusal) or closed the connection."""
    return bool(select.select([sock], [], [], 0)[0])


def _held(path: str, deadline: float, count: int, counts: Counter[str], drip: bool) -> None:
    """``count`` connections held open (sending a byte every 0.5 s when ``drip``), each
    reopened once the gateway drops it."""
    held: list[socket.socket] = []
    try:
        while time.monotonic() < deadline:
            for sock in [s for s in held if _dropped(s)]:
                counts["dropped by the gateway"] += 1
                held.remove(sock)
                sock.close()
            while len(held) < count and time.monotonic() < deadline:
                sock = _connect(path, counts)
                if sock is None:
                    break
                if drip:
                    with contextlib.suppress(OSError):
                        sock.send(struct.pack("<I", 4096))
                held.append(sock)
            if drip:
                for sock in held:
                    with contextlib.suppress(OSError):
                        sock.send(b"\x00")
                        counts["bytes dripped"] += 1
            time.sleep(0.5)
    finally:
        for sock in held:
            sock.close()


def _slow(path: str, deadline: float, count: int, rng: random.Random, counts: Counter[str]) -> None:
    _held(path, deadline, count, counts, drip=False)


def _drip(path: str, deadline: float, count: int, rng: random.Random, counts: Counter[str]) -> None:
    _held(path, deadline, count, counts, drip=True)


def _flood(
    path: str, deadline: float, count: int, rng: random.Random, counts: Counter[str]
) -> None:
    while time.monotonic() < deadline:
        started = time.monotonic()
        sock = _connect(path, counts)
        if sock is not None:
            if rng.random() < 0.5:
                with contextlib.suppress(OSError):
                    sock.send(b"\x40\x00")
            sock.close()
        time.sleep(max(0.0, 1 / FLOOD_PER_SECOND - (time.monotonic() - started)))


def _garbage(
    path: str, deadline: float, count: int, rng: random.Random, counts: Counter[str]
) -> None:
    frames = [
        lambda: rng.randbytes(rng.randrange(1, 200)),
        lambda: struct.pack("<I", 2**31) + rng.randbytes(16),
        lambda: _frame(rng.randbytes(rng.randrange(1, 300))),
        lambda: _frame(msgpack.packb([1, 2, 3])),
        lambda: _frame(msgpack.packb({"protocol": 99, "tenant": "default"})),
        lambda: _frame(msgpack.packb(hello_body(Hello(f"stranger-{rng.randrange(9)}")))),
        lambda: _frame(msgpack.packb(hello_body(Hello("default")))),  # not this uid's tenant
        lambda: _frame(msgpack.packb(status_request())),  # not this uid's to ask
    ]
    while time.monotonic() < deadline:
        sock = _connect(path, counts)
        if sock is None:
            time.sleep(0.05)
            continue
        try:
            sock.settimeout(5)
            sock.sendall(rng.choice(frames)())
            counts["answered" if sock.recv(4096) else "closed"] += 1
        except OSError:
            counts["reset"] += 1
        finally:
            sock.close()
        time.sleep(0.01)


def _frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def _ring(path: str, deadline: float, count: int, rng: random.Random, counts: Counter[str]) -> None:
    while time.monotonic() < deadline:
        sock = _connect(path, counts)
        if sock is None:
            time.sleep(0.5)
            continue
        try:
            sock.settimeout(10)
            send_frame(sock, hello_body(Hello("default", client="hostile ring")))
            body, fds = recv_frame(sock, fds_max=4)
            try:
                welcome = parse_welcome(body)
                layout = RingLayout(welcome.slots, welcome.arena_bytes, welcome.window_bytes)
                _scribble(fds[0], fds[1], layout, rng)
                counts["dropped by the gateway" if sock.recv(1) == b"" else "kept"] += 1
            finally:
                for fd in fds:
                    os.close(fd)
        except OSError:
            counts["refused"] += 1
        finally:
            sock.close()
        time.sleep(0.5)


def _scribble(memfd: int, doorbell: int, layout: RingLayout, rng: random.Random) -> None:
    """Garbage in the submission ring: a random entry, a slot out of range, or a runaway
    tail; then ring."""
    mapping = map_shared(memfd, layout)
    memory = memoryview(mapping)
    try:
        way = rng.randrange(3)
        if way == 0:
            memory[layout.sq_offset : layout.sq_offset + 64] = rng.randbytes(64)
        else:
            entry = [1, Op.GET, 0, 0, layout.slots + 5 if way == 1 else 0, 0, 0, 2**63, 0, 4096]
            SUBMISSION.pack_into(memory, layout.sq_offset, *entry)
        struct.pack_into("<Q", memory, SQ_TAIL, 2**40 if way == 2 else 1)
        os.eventfd_write(doorbell, 1)
    finally:
        memory.release()
        mapping.close()


if __name__ == "__main__":
    sys.exit(main())
