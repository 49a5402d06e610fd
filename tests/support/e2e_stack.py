"""vLLM for the end-to-end suite: `run_vllm.py --stdin` in the e2e venv, one engine per process,
fed one JSON request per line, and the ``Stack`` of processes one test starts, with
``owned_stack``, which stops them at the end and removes what they left in /dev/shm and nothing
else. The gateway and the LMCache server come from tests.support."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.support import ROOT, Gateway, LMCacheServer, Process, wait_until

E2E_VENV = Path(os.environ.get("ADP_E2E_VENV", ROOT / ".venv-e2e"))
E2E_BIN = E2E_VENV / "bin"
HERE = Path(__file__).resolve().parent
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT),
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


class Vllm(Process):
    def __init__(self, workdir: Path, tag: str) -> None:
        super().__init__("vllm", workdir / f"vllm-{tag}.log")
        self.lines: queue.Queue[str] = queue.Queue()

    def start(self, model: Path, lmcache_port: int | None, *extra: str) -> Vllm:
        """Start the engine (``extra``: more run_vllm.py flags) and wait until it is ready."""
        argv = [str(E2E_BIN / "python"), str(HERE / "run_vllm.py"), "--model", str(model)]
        argv += ["--stdin", "--mq-timeout", "30", *extra]
        if lmcache_port:
            argv += ["--lmcache-port", str(lmcache_port)]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=ENV,
            cwd=HERE,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        self._next("E2E_READY", 300)
        return self

    def request(
        self,
        seed: int,
        salt: str | None = None,
        length: int = 2048,
        timeout_s: float = 180,
        max_tokens: int | None = None,
    ) -> dict[str, Any]:
        """Send one greedy request of ``length`` deterministic token ids; return its result."""
        assert self.proc is not None and self.proc.stdin is not None
        request = {"seed": seed, "len": length, "salt": salt, "max_tokens": max_tokens}
        line = json.dumps(request) + "\n"
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()
        return self._next("E2E_RESULT", timeout_s)

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 30) -> int | None:
        """Close stdin so vLLM shuts its workers down itself; signals only if it does not."""
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        return super().stop(signum, 10)

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "a") as log, self.proc.stdout:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                log.write(line)
                log.flush()
                if line.startswith("E2E_"):
                    self.lines.put(line)

    def _next(self, tag: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                if not self.alive:
                    raise RuntimeError(f"vLLM exited:\n{self.log()[-4000:]}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {tag} from vLLM in {timeout_s} s") from None
                continue
            if line.startswith(tag + " "):
                return dict(json.loads(line[len(tag) + 1 :]))


class Stack:
    """Starts gateways, LMCache servers and vLLM engines, and remembers them all."""

    def __init__(self, workdir: Path, model: Path) -> None:
        self.workdir = workdir
        self.model = model
        self.processes: list[Process] = []

    def gateway(self) -> Gateway:
        gateway = Gateway(self.workdir, "2GiB")
        self.processes.append(gateway)
        return gateway.start()

    def server(self, gateway: Gateway, shared_l1: bool = False, **params: object) -> LMCacheServer:
        """An lmcache server with the plugin; ``shared_l1`` puts its L1 in shared memory, as
        configs/lmcache-server.sh does by default, so its stores go zero-copy."""
        tag = f"-{len(self.processes)}"
        server = LMCacheServer(
            self.workdir,
            gateway.l2_adapter_json(**params),
            tag=tag,
            bin_dir=E2E_BIN,
            shm_name=f"adp-e2e-{os.getpid()}{tag}" if shared_l1 else None,
        )
        self.processes.append(server)
        return server.start()

    def vllm(self, server: LMCacheServer | None) -> Vllm:
        engine = Vllm(self.workdir, str(len(self.processes)))
        self.processes.append(engine)
        return engine.start(self.model, server.port if server else None)

    def sessions(self) -> set[int]:
        """The sessions of every process started: each is its own session's leader, and its
        workers and helpers stay in that session."""
        return {p.proc.pid for p in self.processes if p.proc is not None}

    def stop_all(self) -> None:
        """Stop everything and wait until no process of theirs is left."""
        for process in reversed(self.processes):
            process.stop(signal.SIGKILL if process.name == "vllm" else signal.SIGTERM, 30)
        groups = [p.proc.pid for p in self.processes if p.proc is not None]
        for group in groups:  # workers, resource trackers: whatever a process left in its group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        wait_until(lambda: not any(map(_group_alive, groups)), 30, "every process to be gone")


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def owned_stack(workdir: Path, model: Path) -> Iterator[Stack]:
    """A ``Stack`` whose processes are all stopped at the end, pass or fail; then whatever they
    left in /dev/shm (L1 segments, vLLM's psm_* and sem.mp-* files) is removed and the test
    fails naming it. Only files the stack's own processes were seen holding count: another
    process's files, such as the L1 of a user's `lmcache server` on the same host, are never
    touched, even when they appear while the test runs."""
    before = set(SHM.iterdir())
    stack = Stack(workdir, model)
    watch = SharedMemoryWatch(stack.sessions)
    watch.start()
    try:
        yield stack
    finally:
        try:
            watch.sample()  # what the processes hold as they are stopped
            stack.stop_all()
        finally:
            watch.stop()
        leaked = sorted(path for path in watch.seen - before if path.exists())
        for path in leaked:
            path.unlink(missing_ok=True)
        assert not leaked, f"shared memory left behind: {list(map(str, leaked))}"


SHM = Path("/dev/shm")


class SharedMemoryWatch:
    """Which /dev/shm files the processes of some sessions hold (mapped or open), sampled from
    /proc every ``interval_s`` while they run: the files they made, and only those, can be
    theirs to clean up. A file made and let go of between two samples goes unseen."""

    def __init__(self, sessions: Callable[[], set[int]], interval_s: float = 0.5) -> None:
        self.sessions = sessions
        self.interval_s = interval_s
        self.seen: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shm-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sample()

    def sample(self) -> None:
        sessions = self.sessions()
        if sessions:
            for pid in _pids_of(sessions):
                self.seen |= _shm_files_of(pid)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()


def _pids_of(sessions: set[int]) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
        if int(stat.rsplit(")", 1)[1].split()[3]) in sessions:
            pids.append(int(entry.name))
    return pids


def _shm_files_of(pid: int) -> set[Path]:
    held: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6:
                held.add(fields[5])
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                held.add(os.readlink(fd.path))
    prefix = f"{SHM}/"
    return {Path(name.removesuffix(" (deleted)")) for name in held if name.startswith(prefix)}
