"""Test tiers: under BATCHLAB_REQUIRE_VLLM=1 (`make test`) a missing vllm fails the run instead of skipping
its tests; without it (plain pytest, `make test-fast`) they are skipped."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent / "conftest.py"
NO_VLLM = "import sys\nimport pytest\n\nsys.modules['vllm'] = None  # as if vllm were not installed\n"
FILES = {
    "test_module_level.py": NO_VLLM + "pytest.importorskip('vllm')\n\n\ndef test_engine():\n    pass\n",
    "test_in_a_test.py": NO_VLLM.replace("sys.modules['vllm'] = None", "") +
    "\ndef test_engine(monkeypatch):\n    monkeypatch.setitem(sys.modules, 'vllm', None)\n"
    "    pytest.importorskip('vllm')\n\n\ndef test_other_skip():\n    pytest.skip('not about vllm')\n",
}


def _pytest(folder: Path, require: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "BATCHLAB_REQUIRE_VLLM"}
    if require:
        env["BATCHLAB_REQUIRE_VLLM"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                           str(folder / "pytest.ini"), str(folder)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)


def _suite(tmp_path: Path) -> Path:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_missing_vllm_skips_its_tests_by_default(tmp_path):
    proc = _pytest(_suite(tmp_path), require=False)
    assert proc.returncode == 0, proc.stdout
    assert "3 skipped" in proc.stdout


def test_a_missing_vllm_fails_make_test(tmp_path):
    proc = _pytest(_suite(tmp_path), require=True)
    assert proc.returncode == 1, proc.stdout
    assert "FAILED test_module_level.py: vllm cannot be imported" in proc.stdout
    assert "1 failed, 2 skipped" in proc.stdout  # the other skip stays a skip
