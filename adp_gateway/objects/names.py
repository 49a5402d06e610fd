"""The name of each fragment of an object on the card: the object's key, then its version and
the fragment's place, ``key#version.place.fragments.fragment_bytes.object_bytes``.

The name says all a recovery needs to put an object back together from the card's values alone:
which version a fragment belongs to, how many fragments that version has, and where this one lies
in it. Keys may hold any character; the name is read from its last ``#``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from adp_wire import fragmenter


class Version(NamedTuple):
    """One stored version of an object: fragment ``i`` holds bytes ``i * fragment_bytes`` on,
    up to ``fragment_bytes`` of them."""

    number: int
    object_bytes: int
    fragment_bytes: int
    fragments: int

    def names(self, key: str) -> list[str]:
        return [fragment_name(key, self, place) for place in range(self.fragments)]

    def span(self, place: int) -> tuple[int, int]:
        """Where fragment ``place`` lies in the object: (offset, length)."""
        offset = place * self.fragment_bytes
        return offset, min(self.fragment_bytes, self.object_bytes - offset)


class FragmentId(NamedTuple):
    """What a fragment's name says."""

    key: str
    version: Version
    place: int


def fragment_name(key: str, version: Version, place: int) -> str:
    number, object_bytes, fragment_bytes, fragments = version
    return f"{key}#{number}.{place}.{fragments}.{fragment_bytes}.{object_bytes}"


# After the last "#": version number, place, fragments, fragment bytes, object bytes
# The same, of an object's only fragment (place 0 of 1): what most names are
ONLY_FRAGMENT = re.compile(r"(\d+)\.0\.1\.\d+\.\d+", re.ASCII)
SUFFIX = re.compile(r"(\d+)\.(\d+)\.(\d+)\.(\d+)\.(\d+)", re.ASCII)


def parse(name: str) -> FragmentId | None:
    """What ``name`` says, or None when it is not a fragment's name (a value of another layout,
    or bytes no store wrote) or does not describe a place in a well-formed object."""
    key, separator, suffix = name.rpartition("#")
    found = SUFFIX.fullmatch(suffix) if separator else None
    if found is None:
        return None
    number, place, fragments, fragment_bytes, object_bytes = map(int, found.groups())
    version = Version(number, object_bytes, fragment_bytes, fragments)
    return FragmentId(key, version, place) if well_formed(version, place) else None


def whole(suffix: str) -> Version | None:
    """The version a name's ``suffix`` (after its last ``#``) says, when it is the one fragment
    of its object; else None."""
    fragment = parse(f"#{suffix}")
    return fragment.version if fragment is not None and fragment.version.fragments == 1 else None


def well_formed(version: Version, place: int) -> bool:
    """Whether ``place`` is in ``version``, split as adp_wire/fragmenter.py splits objects."""
    if not (0 <= place < version.fragments and version.fragment_bytes > 0):
        return False
    return version.fragments == fragmenter.count(version.object_bytes, version.fragment_bytes)
