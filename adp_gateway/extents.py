"""Where a data op's bytes lie, from its descriptor: a range of the session's window, or (a
zero-copy store) pages of the client's L1; and where a zero-copy store's checksums lie in its
arena. Everything the client writes is untrusted: a descriptor that points outside what it may
use raises ProtocolError, and the session is dropped."""

from __future__ import annotations

from adp_gateway.errors import ProtocolError
from adp_gateway.l1 import L1Segment
from adp_wire.protocol import CHECKSUM_BYTES, checksums_at
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


def checksums_offset(submission: Submission, count: int, arena_bytes: int) -> int:
    """Where a zero-copy store's ``count`` checksums lie in its arena: after its keys."""
    at = checksums_at(submission.request_bytes)
    if at + count * CHECKSUM_BYTES > arena_bytes:
        raise ProtocolError(
            f"the checksums of a {submission.data_bytes}-byte object do not fit the arena"
        )
    return at
