"""runner.procs: a child's whole process group is reaped when stopped, even when a second Ctrl-C comes while
it waits for the children to exit."""
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from batchlab.runner import procs

pytestmark = pytest.mark.slow  # a spawned process group

SLEEPER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def stubborn(stop_asked, ready) -> None:
    """A role that ignores SIGTERM and has a grandchild that ignores it too."""
    procs.become_group_leader(stop_asked)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", SLEEPER])
    ready.set()
    time.sleep(600)


def test_a_ctrl_c_while_stopping_ends_the_grace_and_every_process_of_the_group_is_still_reaped():
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = procs.start(ctx, "stubborn", stubborn, ready)
    try:
        assert ready.wait(120), "the child did not start"
        before = signal.getsignal(signal.SIGINT)
        timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))  # stop is waiting by then
        timer.start()
        started = time.monotonic()
        procs.stop([child], signal.SIGTERM, grace_s=300)  # without the Ctrl-C it would wait all of it
        elapsed = time.monotonic() - started
        timer.join()
        assert elapsed < 150 and not child.proc.is_alive() and not procs.group_alive(child.proc.pid)
        assert signal.getsignal(signal.SIGINT) is before  # the handler is restored
    finally:
        procs.reap([child])
