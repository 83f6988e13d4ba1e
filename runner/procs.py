"""Process trees a launcher owns: each child leads its own process group, and the whole group is
reaped on every exit path, so nothing a run started (vLLM's engine processes included) outlives it.

Why a group per child: a role may start processes of its own (a vLLM engine core, tokenizer pools,
compiler workers); they inherit the group, so one `killpg` reaches them even after their parent died
and they were re-parented to init. A group of its own also keeps the terminal's Ctrl-C away from the
children: it reaches only the launcher, which then stops the roles in order (producers first).
"""
import logging
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from batchlab.protocol.signals import (Hurry, die_with_parent, link_spawned_child, release_spawn_hold,
                                       sigint_as_python, sigint_deferred, signals_held)
from batchlab.runner import TEMP_MARKER, TEMP_PREFIX, remove_temp_of, temp_owner

log = logging.getLogger("batchlab.procs")
REAP_WAIT_S = 5.0  # after SIGKILL to a group, how long to wait for its members to be gone
MKDTEMP_RANDOM_CHARS = 8  # the random part tempfile.mkdtemp adds to a name
SPAWN_STOP_GRACE_S = 60.0  # a child stopped as it spawns ends once it has imported (seconds on a busy host)


@dataclass
class Child:
    """One launched role: its process leads a process group of the same id."""

    name: str
    proc: mp.process.BaseProcess
    stop_asked: object = None  # a multiprocessing Event: the launcher's stop, for a child not yet leading its group


def become_group_leader(stop_asked, *, outlives_group_signals: bool = False) -> None:
    """In a child, first thing: linked to the launcher (protocol.signals.link_spawned_child: SIGTERM when it ends),
    then lead a new process group; SIGINT, blocked since the spawn (`start`), drops a Ctrl-C that came meanwhile
    (the launcher got it too) and is Python's own again once the terminal's Ctrl-C cannot reach us.
    A SIGTERM or SIGHUP that came while the child was still in its launcher's group waited (held since
    the spawn) and ends it now, as it would have then; but a child that `outlives_group_signals` (the
    collector: killed at spawn by a signal to the whole group, a terminal's hangup or `kill -TERM -PGID`,
    it would leave every request without a row) drops it: the launcher got it too and stops the roles
    in order. The launcher's own stop is `stop_asked` (an event), looked at once signals go through."""
    if launcher_pid() is None:  # not a multiprocessing child: only its death follows its parent's
        die_with_parent()
    else:  # ends it now when the launcher is already gone
        link_spawned_child(launcher_pid(), _remove_launchers_temp)
    os.setpgid(0, 0)
    held = release_spawn_hold(ends_on_held=not outlives_group_signals)
    if held is not None:  # a SIGTERM or SIGHUP to the launcher's group at spawn: it ends now, as it would have then
        if orphaned():  # the held signal was its death's (PR_SET_PDEATHSIG): nobody else cleans up
            _remove_launchers_temp()
        os._exit(128 + held)
    if orphaned() or stop_asked.is_set():  # the launcher died or stopped us meanwhile: its signal was held
        _remove_launchers_temp() if orphaned() else None
        os._exit(128 + signal.SIGTERM)
    sigint_as_python()


def _remove_launchers_temp() -> None:
    """The run temp folders of the launcher (a child outliving it removes them: nobody else will)."""
    remove_temp_of(launcher_pid())


def launcher_pid() -> int | None:
    """The pid of the process that spawned this one (None outside a multiprocessing child)."""
    parent = mp.parent_process()
    return None if parent is None else parent.pid


def orphaned() -> bool:
    """True in a spawned child whose launcher is gone (this process was re-parented)."""
    pid = launcher_pid()
    return pid is not None and os.getppid() != pid


def run_temp_folder() -> str:
    """A private folder for a run's ipc sockets, named by its owner's pid and marked inside (runner.TEMP_MARKER:
    the pid again), so that whoever finds it with the owner dead (a SIGKILLed launcher) may remove it, and
    nothing else: see runner.remove_temp_of, clean_stale_temp."""
    folder = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
    try:
        Path(folder, TEMP_MARKER).write_text(str(os.getpid()), encoding="ascii")
    except BaseException:  # unmarked it would never be removed by anyone: remove it now
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def run_socket_paths() -> list[str]:
    """The paths this process's run would give its ipc:// sockets (run_temp_folder, Addresses.ipc), with
    the longest random part mkdtemp adds, so their length can be checked before anything starts."""
    from batchlab.protocol.addresses import Addresses

    folder = os.path.join(tempfile.gettempdir(), f"{TEMP_PREFIX}{os.getpid()}-{'x' * MKDTEMP_RANDOM_CHARS}")
    addrs = Addresses.ipc(folder)
    return [a.removeprefix("ipc://") for a in (addrs.scheduler, addrs.collector)]


def clean_stale_temp() -> None:
    """Remove run folders whose owner process is gone (a launcher killed before it could clean up): only
    folders batchlab marked as its own (runner.temp_owner), never one by its name alone (a user's
    `batchlab-2024-12-results` stays)."""
    import psutil

    for folder in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        owner = temp_owner(folder)
        if owner is not None and not psutil.pid_exists(owner):
            shutil.rmtree(folder, ignore_errors=True)


def redirect_output(log_file: Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so C libraries' prints and
    Python warnings too) to `log_file`: the terminal keeps batchlab's own progress only."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def start(ctx, name: str, entry, *args) -> Child:
    """Start `entry(stop_asked, *args)` as a process (which must call become_group_leader(stop_asked)
    first). Until it leads its own group the child holds SIGINT, SIGTERM and SIGHUP (a signal
    mask survives fork and exec): a signal to the launcher's whole group at spawn is the launcher's."""
    stop_asked = ctx.Event()
    proc = ctx.Process(target=entry, args=(stop_asked, *args), name=name, daemon=False)
    child = Child(name, proc, stop_asked)
    try:
        with signals_held(), sigint_deferred():  # a Ctrl-C before the child leads its own group misses it
            proc.start()
    except KeyboardInterrupt:  # a Ctrl-C or a SIGTERM held during the spawn came as it ended: the caller
        if proc.pid is not None:  # never gets this child, so it is stopped here (it sees stop_asked at once)
            stop([child], signal.SIGTERM, SPAWN_STOP_GRACE_S)
        raise
    return child


def start_resource_tracker() -> None:
    """multiprocessing's resource tracker (one process in the launcher's group; every Event of a run is
    registered with it), started holding SIGHUP for good: it ignores SIGINT and SIGTERM itself, and a
    terminal's hangup to the group must not kill it under a launcher that is still writing the run."""
    from multiprocessing import resource_tracker

    with signals_held():
        resource_tracker.ensure_running()


def signal_group(child: Child, sig: int) -> None:
    """Send `sig` to the child's whole group (to the child alone before it has made its group)."""
    pid = child.proc.pid
    if pid is None:
        return
    for send in (lambda: os.killpg(pid, sig), lambda: os.kill(pid, sig)):
        try:
            send()
            return
        except (ProcessLookupError, PermissionError):
            continue


def is_stopped(child: Child) -> bool:
    """True while the child is stopped (SIGSTOP, SIGTSTP, a tracer): it acts on no signal but SIGKILL."""
    import psutil

    try:
        return child.proc.pid is not None and psutil.Process(child.proc.pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` exists (zombies of our own children excepted)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def reap(children: list[Child]) -> None:
    """Kill whatever is left of each child's group (grandchildren included) and wait until it is gone."""
    for c in children:
        if c.proc.pid is None:
            continue
        if c.proc.is_alive():
            c.proc.kill()
        c.proc.join(timeout=REAP_WAIT_S)
        try:
            os.killpg(c.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        deadline = time.monotonic() + REAP_WAIT_S
        while group_alive(c.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if group_alive(c.proc.pid):
            log.error("processes of %s's group %d survived SIGKILL", c.name, c.proc.pid)


def stop(children: list[Child], sig: int, grace_s: float) -> None:
    """Signal each live child, wait up to grace_s for all, then SIGKILL the rest and reap every group. A Ctrl-C
    meanwhile (an impatient second one) ends the grace at once; nothing cuts the reaping short."""
    with Hurry(lambda: log.warning("interrupted again: stopping without waiting")) as hurry:
        for c in children:
            if c.stop_asked is not None:  # first: a child still holding signals (at spawn) looks at it after
                c.stop_asked.set()
            if c.proc.is_alive():
                signal_group(c, sig)
        deadline = time.monotonic() + grace_s
        for c in children:
            while c.proc.is_alive() and not hurry.pressed and time.monotonic() < deadline:
                c.proc.join(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
        reap(children)
