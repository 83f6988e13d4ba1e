"""A script that calls batchlab at its top level without `if __name__ == "__main__":` is told so in one line:
each spawned process that re-runs the script stops at once, and the run's error says the same."""
import multiprocessing
import subprocess
import sys

import pytest

from batchlab.api.guard import refuse_unguarded_main
from batchlab.protocol.errors import UNGUARDED_MAIN, UNGUARDED_MAIN_EXIT
from batchlab.runner.outcome import death_line

SCRIPT = """from batchlab import api
print("top level ran")
api.run({{"backend": "sim", "dataset": "synthetic", "duration_s": 1, "rate": 4}}, out={out!r})
"""


def test_a_process_importing_the_callers_script_stops_with_the_guards_line(monkeypatch, capsys):
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(SystemExit) as stopped:
        refuse_unguarded_main()
    assert stopped.value.code == UNGUARDED_MAIN_EXIT
    assert capsys.readouterr().err == f"error: {UNGUARDED_MAIN}\n"
    assert 'if __name__ == "__main__":' in UNGUARDED_MAIN


def test_the_caller_itself_goes_on(capsys):
    refuse_unguarded_main()  # not a spawned process's bootstrap: nothing happens
    assert capsys.readouterr().err == ""


def test_the_launcher_names_the_guard_for_a_role_that_exited_so():
    assert death_line("scheduler", UNGUARDED_MAIN_EXIT, started=False) == (
        f"scheduler stopped during start-up: {UNGUARDED_MAIN}")


@pytest.mark.slow
def test_a_script_without_the_guard_gets_the_line_and_no_second_run(tmp_path):
    script = tmp_path / "noguard.py"
    script.write_text(SCRIPT.format(out=str(tmp_path / "out")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert f"error: {UNGUARDED_MAIN}" in lines  # each spawned process's one line
    assert lines[-1].endswith(f"stopped during start-up: {UNGUARDED_MAIN}")  # and the run's error
    assert "is in use by another run" not in done.stderr
