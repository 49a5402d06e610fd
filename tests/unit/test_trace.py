"""adp_wire/trace.py: stamps are kept only when asked for, and another process's read back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from adp_wire import trace
from adp_wire.trace import Stage

CHILD = """
import threading
from adp_wire import trace
from adp_wire.trace import Stage
trace.mark(Stage.SUBMIT, 7)
worker = threading.Thread(target=trace.mark, args=(Stage.DEVICE_START, 9))
worker.start()
worker.join()
trace.mark(Stage.REPORT, 7)
"""


def test_nothing_is_kept_while_off() -> None:
    assert os.environ.get(trace.ENV) is None
    trace.taken()
    trace.mark(Stage.SUBMIT, 1)
    assert trace.taken() == []


def test_a_process_with_the_variable_writes_its_stamps_at_exit(tmp_path: Path) -> None:
    prefix = tmp_path / "trace"
    env = {**os.environ, trace.ENV: str(prefix)}
    child = subprocess.run([sys.executable, "-c", CHILD], env=env, timeout=60, check=True)
    assert child.returncode == 0
    [written] = tmp_path.glob("trace.*")
    assert written.name == f"trace.{int(written.suffix[1:])}"
    stamps = trace.read(written)
    assert [(stage, ident) for _, stage, ident, _ in stamps] == [
        (Stage.SUBMIT, 7),
        (Stage.DEVICE_START, 9),
        (Stage.REPORT, 7),
    ]
    times = [ns for ns, *_ in stamps]
    assert times == sorted(times)
    threads = [thread for *_, thread in stamps]
    assert threads[0] == threads[2] != threads[1]  # each stamp names its thread


def test_taken_hands_each_stamp_over_once() -> None:
    prefix_before = trace._prefix
    try:
        trace._prefix = "/nonexistent/never-written"  # on, without registering the exit write
        trace.mark(Stage.SEND, 3)
        marker = threading.get_native_id()
        [(_, stage, ident, thread)] = trace.taken()
        assert (stage, ident, thread) == (Stage.SEND, 3, marker)
        assert trace.taken() == []
    finally:
        trace._prefix = prefix_before
