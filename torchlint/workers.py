"""Worker processes that cost one file when they crash, and die with their parent.

``concurrent.futures.ProcessPoolExecutor`` loses every pending result when
one worker dies (``BrokenProcessPool``), and its workers outlive a parent
killed by SIGTERM or SIGKILL. Here each worker takes one file at a time over
its own pipe, so the parent always knows which file a dead worker held: that
file gets an error, a fresh worker takes its place, and every other file's
result is kept. Workers ask the kernel to kill them when the parent dies
(``PR_SET_PDEATHSIG`` on Linux; a watchdog thread elsewhere) and leave
Ctrl-C to the parent, which stops them on its way out.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple, TypeVar

_Job = TypeVar("_Job")
_Result = TypeVar("_Result")
_PR_SET_PDEATHSIG = 1


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds: a half-written temporary file is removed


def die_with_parent(parent_pid: int) -> None:
    """Called first thing in a worker. SIGTERM, which is also what the kernel
    sends when the parent dies, ends the worker through an exception, so a
    fix being written is either finished (in-place writes hold the signal
    off) or its temporary file removed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    signal.signal(signal.SIGTERM, _exit_cleanly)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0:
                if os.getppid() != parent_pid:  # the parent died before prctl took effect
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.2)
    os._exit(1)


def _serve(connection: Connection, parent_pid: int, function: Callable) -> None:
    die_with_parent(parent_pid)
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, job = message
        connection.send((index, function(job)))


class _Worker:
    def __init__(self, context, function: Callable) -> None:
        self.connection, child_end = context.Pipe()
        self.process = context.Process(target=_serve, args=(child_end, os.getpid(), function), daemon=True)
        self.process.start()
        child_end.close()
        self.index: Optional[int] = None  # the job it holds

    def give(self, index: int, job) -> None:
        self.index = index
        self.connection.send((index, job))

    def stop(self) -> None:
        try:
            self.connection.send(None)
        except OSError:
            pass
        self.connection.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.connection.close()


def describe_death(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


def run_isolated(
    function: Callable[[_Job], _Result],
    jobs: Sequence[_Job],
    workers: int,
    on_crash: Callable[[_Job, str], _Result],
    on_result: Optional[Callable[[int], None]] = None,
) -> List[_Result]:
    """``[function(job) for job in jobs]`` on ``workers`` processes, in order.
    A worker that dies turns its job's result into ``on_crash(job, why)``;
    ``on_result(done)`` is called as results come in (for progress)."""
    context = multiprocessing.get_context("fork")
    results: List[Optional[_Result]] = [None] * len(jobs)
    pending: Deque[Tuple[int, _Job]] = deque(enumerate(jobs))
    busy: Dict[Connection, _Worker] = {}
    done = 0

    def feed(worker: _Worker) -> None:
        if pending:
            item = pending.popleft()
            try:
                worker.give(*item)
            except OSError:  # it died between two files: nothing of this one was done
                pending.appendleft(item)
                worker.kill()
                feed(_Worker(context, function))
                return
            busy[worker.connection] = worker
        else:
            worker.stop()
            worker.process.join()

    try:
        for _ in range(min(workers, len(jobs))):
            feed(_Worker(context, function))
        while busy:
            sentinels = {w.process.sentinel: w for w in busy.values()}
            for ready in wait(list(busy) + list(sentinels)):
                # wait() returns both kinds of key mixed: a pipe is busy's, a sentinel is sentinels'.
                worker = busy.get(ready) or sentinels.get(ready)  # type: ignore[call-overload]
                if worker is None or worker.connection not in busy:
                    continue  # both its pipe and its sentinel were ready; handled
                del busy[worker.connection]
                try:
                    if not worker.connection.poll():
                        raise EOFError
                    index, result = worker.connection.recv()
                except (EOFError, OSError):
                    worker.process.join()
                    assert worker.index is not None  # a busy worker holds a job
                    index = worker.index
                    result = on_crash(jobs[index], describe_death(worker.process.exitcode))
                    worker.connection.close()
                    worker = _Worker(context, function) if pending else None
                results[index] = result
                done += 1
                if on_result is not None:
                    on_result(done)
                if worker is not None:
                    feed(worker)
    finally:
        for worker in busy.values():
            worker.kill()
    return results  # type: ignore[return-value]
