"""The objects a card's values make up, counted while ``adp-gateway check`` walks the card: an
object is whole when every fragment its name promises was seen verified (objects/names.py).
It also names a value as an operator knows it: by the object, the fragment and the version.
The card walks its devices; only this layer knows what the values' names mean."""

from __future__ import annotations

from collections import defaultdict

from adp_gateway.objects.names import Version, parse


class ObjectCensus:
    def __init__(self) -> None:
        self._fragments: dict[tuple[str, str, Version], set[int]] = defaultdict(set)
        self.foreign = 0  # values that are no object's fragment (an older layout)

    def seen(self, namespace: str, name: str) -> None:
        """A value the card found whole and verified."""
        fragment = parse(name)
        if fragment is None:
            self.foreign += 1
        else:
            self._fragments[(namespace, fragment.key, fragment.version)].add(fragment.place)

    def named(self, namespace: str, name: str) -> str:
        fragment = parse(name)
        if fragment is None:
            return f"{namespace}/{name} (an older layout)"
        place, number = fragment.place, fragment.version.number
        return f"{namespace}/{fragment.key} fragment {place} (version {number})"

    @property
    def whole(self) -> int:
        return sum(len(found) == v[2].fragments for v, found in self._fragments.items())

    def summary(self) -> str:
        older = f", {self.foreign} values of an older layout" if self.foreign else ""
        return f"{self.whole} complete objects{older}"
