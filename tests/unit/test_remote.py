"""Goal: the gateway reads a client's memory (remote copy) only as the kernel allows, only from
the process that connected, and never from a process that took its pid: a probe that does not
read back refuses remote copy, and a read of a client that has exited fails, whatever now holds
its pid."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from adp_gateway.errors import StorageError
from adp_gateway.sessions.client_process import ClientProcess
from adp_wire.checksum import checksum

CHILD = """
import ctypes, sys
data = ctypes.create_string_buffer(bytes(range(256)) * 8192)  # 2 MiB
token = ctypes.c_uint64(0x1234567890ABCDEF)
print(ctypes.addressof(data), ctypes.addressof(token), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def child() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A process holding 2 MiB of known bytes and a token; it exits when its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    data, token = map(int, proc.stdout.readline().split())
    with proc:  # closes its pipes
        yield proc, data, token
        proc.kill()


def test_a_client_is_read_at_the_addresses_it_names_and_checksummed_in_pieces(
    child: tuple[subprocess.Popen[str], int, int],
) -> None:
    proc, data, token = child
    process = ClientProcess.attach(proc.pid, token, 0x1234567890ABCDEF)
    assert process is not None
    expected = bytes(range(256)) * 8192
    into = bytearray(len(expected))
    spans = [(0, 2**20 + 5), (2**20 + 5, len(expected) - 2**20 - 5)]
    sums = process.checksums(data, memoryview(into), spans)
    assert bytes(into) == expected
    assert sums == [checksum(expected[offset : offset + length]) for offset, length in spans]
    process.close()


def test_a_probe_that_does_not_read_back_refuses_remote_copy(
    child: tuple[subprocess.Popen[str], int, int],
) -> None:
    proc, _, token = child
    assert ClientProcess.attach(proc.pid, token, 42) is None
    assert ClientProcess.attach(proc.pid, 8, 0x1234567890ABCDEF) is None  # unmapped: EFAULT
    assert ClientProcess.attach(0, token, 0x1234567890ABCDEF) is None  # another namespace


def test_a_client_that_has_exited_is_never_read_again(
    child: tuple[subprocess.Popen[str], int, int],
) -> None:
    proc, data, token = child
    process = ClientProcess.attach(proc.pid, token, 0x1234567890ABCDEF)
    assert process is not None
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait()
    with pytest.raises(StorageError):
        process.read(data, memoryview(bytearray(4096)))
    assert not process.alive()
    process.close()
