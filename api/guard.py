"""The script guard. batchlab starts its processes with multiprocessing's spawn, which imports the caller's
script in each new process; a script that calls batchlab at its top level, without `if __name__ ==
"__main__":`, would run its calls again there (a second run into the same folder, duplicated output). A
spawned process that finds itself doing so stops at once with one line naming the guard, and its exit code
(UNGUARDED_MAIN_EXIT) tells the launcher to say the same (runner.outcome.death_line)."""
import multiprocessing
import sys

from batchlab.protocol.errors import UNGUARDED_MAIN, UNGUARDED_MAIN_EXIT


def importing_main() -> bool:
    """True in a spawned process while it imports the caller's script (multiprocessing's bootstrap)."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def refuse_unguarded_main() -> None:
    """Stop this process with the guard's one line when it is re-running the caller's top level."""
    if importing_main():
        print(f"error: {UNGUARDED_MAIN}", file=sys.stderr, flush=True)
        raise SystemExit(UNGUARDED_MAIN_EXIT)
