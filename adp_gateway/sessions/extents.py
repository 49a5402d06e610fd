"""Where a data op's bytes lie, from its descriptor: a range of the session's window, or (a
zero-copy store) pages of the client's L1, with the store's checksums and given-up word, or (a
remote-copy store) a range of the window the gateway fills from the client's memory first.
Everything the client writes is untrusted: a descriptor that points outside what it may use
raises ProtocolError, and the session is dropped."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from adp_gateway.errors import ProtocolError
from adp_gateway.sessions.client_l1 import L1Segment
from adp_gateway.sessions.client_process import ClientProcess
from adp_wire.protocol import given_up_span, source_span
from adp_wire.ring.layout import PAGE_BYTES, Submission, align_up


def window_range(window: memoryview, submission: Submission) -> memoryview:
    """The page-aligned window range the op reads or writes."""
    start = submission.data_offset
    end = start + align_up(submission.data_bytes)
    if start % PAGE_BYTES or end > len(window):
        raise ProtocolError(
            f"window range [{start}, {end}) is unaligned or outside the {len(window)}-byte window"
        )
    return window[start:end]


def l1_pages(l1: L1Segment | None, object_bytes_max: int, submission: Submission) -> memoryview:
    """A zero-copy store's pages in L1: whole pages only, so no byte of L1 beyond the object
    ever reaches the disk."""
    if l1 is None:
        raise ProtocolError("a zero-copy store on a session without an L1 segment")
    if submission.data_bytes % PAGE_BYTES:
        raise ProtocolError(f"a zero-copy store of {submission.data_bytes} bytes, not whole pages")
    if submission.data_bytes > object_bytes_max:
        raise ProtocolError(
            f"an object of {submission.data_bytes} bytes exceeds the session's "
            f"{object_bytes_max}-byte object limit"
        )
    return l1.pages(submission.data_offset, submission.data_bytes)


def given_up_word(submission: Submission, arena: memoryview) -> memoryview:
    """The given-up word of a store read from L1, in its arena after its keys
    (adp_wire/protocol.py)."""
    span = given_up_span(submission.request_bytes)
    if span.stop > len(arena):
        raise ProtocolError("a store's given-up word does not fit its arena")
    return arena[span]


def source_address(submission: Submission, arena: memoryview) -> int:
    """A remote-copy store's buffer address in the client, in its arena after its given-up
    word; only ever read through the kernel (adp_gateway/sessions/client_process.py)."""
    span = source_span(submission.request_bytes)
    if span.stop > len(arena):
        raise ProtocolError("a remote-copy store's address does not fit its arena")
    return int.from_bytes(arena[span], "little")


@dataclass(frozen=True)
class L1Object:
    """A zero-copy store's object, at ``offset`` in the client's L1: checksummed through the
    kernel (L1Segment.checksum) and written to disk from L1 itself; ``word_set`` says whether
    the client gave the store up."""

    segment: L1Segment
    offset: int
    word_set: Callable[[], bool]
    written_from_l1 = True  # the card reads L1 as it writes: ask again once it has

    def checksums(self, extent: memoryview, spans: list[tuple[int, int]]) -> list[int]:
        return [self.segment.checksum(self.offset + offset, length) for offset, length in spans]

    def given_up(self) -> bool:
        return self.word_set()


@dataclass(frozen=True)
class RemoteObject:
    """A remote-copy store's object, at ``address`` in the client's private memory: copied
    into its window extent and hashed a piece at a time (ClientProcess.checksums); from then on
    the window is what the card writes, so once ``word_set`` has been found clear after the
    copy, the bytes are the ones LMCache stored whatever the client does next."""

    process: ClientProcess
    address: int
    word_set: Callable[[], bool]
    written_from_l1 = False

    def checksums(self, extent: memoryview, spans: list[tuple[int, int]]) -> list[int]:
        return self.process.checksums(self.address, extent, spans)

    def given_up(self) -> bool:
        return self.word_set()
