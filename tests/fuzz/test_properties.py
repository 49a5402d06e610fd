"""Goal: the gateway's parsers of untrusted input keep their properties for any input.

Each property is a target of tests/support/fuzz_parsers.py, whose docstring says what must hold:
handshake frames, hello and welcome maps, request keys, ring queues, session descriptors, two
sessions' isolation, record headers, superblocks, trailers, footers, region walks and recovery.
Hypothesis draws each target's input here; atheris draws the same targets (test_atheris.py).

Short form (default, CI): the ``ci`` profile, 200 derandomized cases per property (13
properties: 2,600 cases, about 30 s). Long form: ``-m slow``, 10,000 randomized cases per
property (130,000 in all, about 25 minutes: a case of isolation, walk or recovery takes some
30 ms); ``HYPOTHESIS_PROFILE=long`` runs the short form with the long profile too.

Every case is bounded: one that runs past ``BOUND_S`` fails as a hang (SIGALRM, raised where it
was stuck), and faulthandler ends the process after ``HARD_BOUND_S`` should it be stuck in C.

The planted-bug tests show each property can fail: with one bug planted in its parser
(fuzz_parsers.PLANTS), the property finds it.
"""

from __future__ import annotations

import faulthandler
import functools
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from adp_wire import protocol
from tests.support.fuzz_parsers import PLANTS, TARGET_NAMES, TARGETS, VALID_HELLO, VALID_WELCOME

BOUND_S = 10.0  # a case takes milliseconds; this is a hang even on a loaded CI machine
HARD_BOUND_S = 120.0
_BOOLEANS, _FLOATS = st.booleans(), st.floats()


@functools.cache
def _integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


class DrawSource:
    """A fuzz_parsers.Source drawing from hypothesis."""

    def __init__(self, data: st.DataObject) -> None:
        self._data = data

    def integer(self, lo: int, hi: int) -> int:
        return self._data.draw(_integers(lo, hi))

    def boolean(self) -> bool:
        return self._data.draw(_BOOLEANS)

    def binary(self, max_size: int) -> bytes:
        return self._data.draw(st.binary(max_size=max_size))

    def text(self, max_size: int) -> str:
        return self._data.draw(st.text(max_size=max_size))

    def floating(self) -> float:
        return self._data.draw(_FLOATS)


class _Hang(BaseException):
    """Raised by SIGALRM; a BaseException, so no ``except Exception`` in a parser eats it."""


@contextmanager
def bounded(seconds: float, what: str) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise _Hang

    previous = signal.signal(signal.SIGALRM, expire)
    faulthandler.dump_traceback_later(HARD_BOUND_S, exit=True)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Hang as exc:
        raise AssertionError(f"{what} did not return within {seconds} s: a hang") from exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


def run_property(target: str, config: settings, bound_s: float = BOUND_S) -> None:
    @config
    @given(st.data())
    def holds(data: st.DataObject) -> None:
        with bounded(bound_s, f"fuzz target {target!r}"):
            TARGETS[target](DrawSource(data))

    holds()


def test_the_valid_handshake_maps_are_valid() -> None:
    assert protocol.parse_hello(VALID_HELLO).tenant == "t"
    assert protocol.parse_welcome(VALID_WELCOME).slots == 4


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_property(target: str) -> None:
    run_property(target, settings())


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGET_NAMES)
def test_property_long(target: str) -> None:
    run_property(target, settings.get_profile("long"))


# Each property can fail ------------------------------------------------------------------------

# Each planted bug is found within a few hundred cases, but which cases a derandomized run draws
# depends on what the process has loaded (hypothesis mines constants from loaded modules): the
# walk bug took 91-753 cases over 15 seeds. 5,000 makes a miss vanishingly rare; a plant that
# is found stops the run at once.
PLANTED = settings(
    max_examples=5000,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_property_catches_a_planted_bug(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plant = PLANTS[target]
    plant.apply(monkeypatch.setattr)
    with pytest.raises(plant.caught_as, match=plant.match):
        run_property(target, PLANTED, bound_s=2.0)
