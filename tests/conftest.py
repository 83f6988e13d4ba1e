"""Shared fixtures: a private BATCHLAB_HOME cache for the session, and a helper to run the CLI; with
BATCHLAB_REQUIRE_VLLM=1 (`make test`) a test skipped because vllm cannot be imported fails instead.

Under pytest-xdist (`make test`: -n 4 --dist loadgroup) each module runs in one worker (its module
fixtures are paid once), and the CPU-bound tests (a real model, vLLM, torch.compile) share one group,
so two of them never fight for the cores while the sleep-bound sim runs fill the other workers (the Ray
cluster's tests, which mostly wait, have their own group). That group's expensive things are session
fixtures below (one vLLM engine, the HF runs), paid once."""
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRE_VLLM_ENV = "BATCHLAB_REQUIRE_VLLM"
VLLM_SKIP = "could not import 'vllm'"  # the reason pytest.importorskip("vllm") gives


_missing_vllm: list[str] = []  # files skipped at collection for a missing vllm (BATCHLAB_REQUIRE_VLLM=1)


def _skipped_for_vllm(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The skip reason when `report` is a skip for a missing vllm under BATCHLAB_REQUIRE_VLLM=1, else ""."""
    if os.environ.get(REQUIRE_VLLM_ENV) != "1" or not report.skipped:
        return ""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason if VLLM_SKIP in reason else ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test's own importorskip("vllm") fails the test."""
    report = (yield).get_result()
    if reason := _skipped_for_vllm(report):
        report.outcome = "failed"
        report.longrepr = f"{reason} ({REQUIRE_VLLM_ENV}=1: install the vllm extra)"


def pytest_collectreport(report):
    """A module-level importorskip("vllm") skips a whole file: the file is noted, the session fails at
    its end (a failed collection would stop every other test). Under xdist the workers collect and send
    their skipped reports to the controller, which calls this hook again: the controller's list is the
    one its summary and exit status read."""
    if _skipped_for_vllm(report) and report.nodeid not in _missing_vllm:
        _missing_vllm.append(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    """Name the files that could not run for a missing vllm."""
    for nodeid in _missing_vllm:
        terminalreporter.write_line(f"FAILED {nodeid}: vllm cannot be imported and {REQUIRE_VLLM_ENV}=1", red=True)


def pytest_sessionfinish(session, exitstatus):
    """A missing vllm fails the run under BATCHLAB_REQUIRE_VLLM=1, even when every collected test passed."""
    if _missing_vllm and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Modules that load a real model (HF tiny-mistral or TinyLlama, calibration on it, torch.compile,
# transformers in a CLI process): whole, so a module fixture holding the model is loaded once; with the
# tests marked `vllm` they form the one xdist group "cpu-heavy" (those marked `ray` form "ray"). The other tests of a module
# with a vllm test (process clean-up's sim runs, say) stay in the module's own group.
CPU_HEAVY_MODULES = {
    "test_archs_e2e.py", "test_calibrate.py", "test_cli_errors.py", "test_gpu_check.py", "test_hf_backend.py",
    "test_hf_continuous.py", "test_hf_continuous_e2e.py", "test_hf_e2e.py", "test_tiny_model.py",
    "test_worker_robustness.py",
}
CPU_HEAVY_GROUP = "cpu-heavy"
# The session fixtures holding a real model's engine or runs (below): every test reading one is in the
# cpu-heavy group, so they all run in one xdist worker and the fixture is paid once.
SHARED_HEAVY_FIXTURES = {"vllm_backend", "hf_static_runs", "hf_continuous_run"}


RAY_GROUP = "ray"  # the Ray cluster's tests: one worker, beside cpu-heavy (measured: about 0.2 of a core, waiting)


def xdist_group_of(item: pytest.Item) -> str:
    """The xdist group a test runs in: ray, cpu-heavy, else its own module."""
    if item.get_closest_marker("ray"):
        return RAY_GROUP
    if item.get_closest_marker("vllm") or item.path.name in CPU_HEAVY_MODULES \
            or SHARED_HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
        return CPU_HEAVY_GROUP
    return item.path.name


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Every test without its own xdist_group gets one (harmless without xdist). In an xdist worker under
    --dist loadgroup the group is also put in the node id, which is what the scheduler groups by: xdist 3.8
    writes it to `item._nodeid`, which pytest 9.2 no longer reads (its node ids are structured), so
    without this every test would be scheduled alone."""
    loadgroup = getattr(config.option, "loadgroup", False)
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))
        if loadgroup and "@" not in item.nodeid and hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(f"{item.nodeid}@{item.get_closest_marker('xdist_group').args[0]}")


@pytest.fixture(scope="session", autouse=True)
def batchlab_home(tmp_path_factory):
    """Tests share one cache (models, parsed ShareGPT) unless BATCHLAB_HOME is already set (CI)."""
    if not os.environ.get("BATCHLAB_HOME"):
        os.environ["BATCHLAB_HOME"] = str(Path.home() / ".cache" / "batchlab")
    return Path(os.environ["BATCHLAB_HOME"])


def default_sigint() -> None:
    """preexec_fn for a child a test will send a stop signal: a shell that starts jobs without job control (a CI
    script's background step) makes them ignore SIGINT, and Python then never raises KeyboardInterrupt; a suite
    started under nohup makes them ignore SIGHUP, which batchlab then rightly leaves alone."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def run_cli(*args: str, timeout_s: float = 300, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m cli.main ARGS` from the repository root (`env` added to this process's); output captured."""
    proc = subprocess.run([sys.executable, "-m", "batchlab.cli.main", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"batchlab {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


# ---- Expensive runs paid once per session (the sim-backend runs many modules only read) ----
# Under xdist a session fixture is built once per worker that asks for it, so each shared run is built
# by the first worker to ask, under a file lock, into a folder every worker of this session sees (the
# workers' base temp folders share a parent: pytest-xdist's recipe for session data); the others wait
# for it and read it. Readers never write into a shared run: a test that changes files copies it first.

def shared_folder(tmp_path_factory, name: str, build) -> Path:
    """The folder `build(folder)` fills, made once for the whole session (every xdist worker)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    root.mkdir(exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            if folder.exists():  # a build that failed in another worker: start again
                import shutil

                shutil.rmtree(folder)
            build(folder)
            done.touch()
    return folder


def sim_run(out: Path, **settings) -> Path:
    """`batchlab run` through the library call (its processes, not a CLI process): sim backend, synthetic prompts."""
    from batchlab.runner.launcher import launch_run
    from batchlab.protocol.settings import build_config

    launch_run(build_config({"backend": "sim", "dataset": "synthetic", **settings, "out": str(out)}, {}))
    return out


@pytest.fixture(scope="session")
def dynamic_sim_run(tmp_path_factory) -> Path:
    """A live sim run (real processes and clocks): dynamic at 20 req/s for 3 s, 32 new tokens, seed 7."""
    return shared_folder(tmp_path_factory, "dynamic-sim-run", lambda out: sim_run(
        out, strategy="dynamic", rate=20, duration_s=3, max_new_tokens=32, seed=7))


LIVE_MODEL_TERMS = ("live", 2e8, 16384, 0.0, 4e-5, 0.02, 8e9, 0.002, 5e-6, 0.002, 6e-8, 0.02)


@pytest.fixture(scope="session")
def continuous_preset_run(tmp_path_factory) -> tuple[Path, Path]:
    """A live sim run (real processes and clocks) played by a known step model with every term non-zero:
    continuous at 4 req/s for 6 s, 24 new tokens. (run folder named rate-4, as a sweep's, and its preset)."""
    from batchlab.worker.stepmodel import StepModel, save_preset

    def build(folder: Path) -> None:
        folder.mkdir(parents=True)
        save_preset(StepModel(*LIVE_MODEL_TERMS), folder / "played.yaml")
        sim_run(folder / "continuous" / "rate-4", strategy="continuous", preset=str(folder / "played.yaml"), rate=4,
                duration_s=6, max_new_tokens=24)

    folder = shared_folder(tmp_path_factory, "continuous-preset-run", build)
    return folder / "continuous" / "rate-4", folder / "played.yaml"


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory) -> tuple[Path, str, str, str]:
    """tests/data/fixed-rates.yaml swept live (3 strategies × 2 rates, 3 s each) by `batchlab sweep`, then reported
    with SLOs (ttft 500 ms, tpot 50 ms): the sweep folder, the report's stdout, the sweep's stdout and stderr.
    CLI processes: what the sweep prints is read as a user sees it."""
    def build(folder: Path) -> None:
        folder.mkdir(parents=True)
        swept = run_cli("sweep", "tests/data/fixed-rates.yaml", "--out", str(folder / "out"), timeout_s=900)
        (folder / "sweep.txt").write_text(swept.stdout)
        (folder / "sweep-stderr.txt").write_text(swept.stderr)
        reported = run_cli("report", str(folder / "out"), "--slo", "ttft=500ms", "--slo", "tpot=50ms")
        (folder / "report.txt").write_text(reported.stdout)

    folder = shared_folder(tmp_path_factory, "smoke-sweep", build)
    return (folder / "out", *((folder / f"{name}.txt").read_text() for name in ("report", "sweep", "sweep-stderr")))


# --- Expensive things paid once: a scaled-down real architecture, one vLLM engine ----------------------
# (real-model fixtures; the sim-run fixtures live in their own section)
SCALED_NAME = "tinyllama-1.1b-scaled"
SCALED_MODEL = f"{SCALED_NAME}:random"


def scaled_tinyllama_arch():
    """TinyLlama's architecture (LlamaForCausalLM, 8 query heads per KV head, head dim 64, its vocabulary and
    tokenizer) at 2 layers and a quarter of its width: the same code paths as `tinyllama-1.1b:random` at a
    fraction of its 1.1e9 random weights."""
    from dataclasses import replace

    from batchlab.models.archs import ARCHS

    full = ARCHS["tinyllama-1.1b"]
    return replace(full, name=SCALED_NAME, published_params=0.0, config={
        **full.config, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 1,
        "intermediate_size": 1408, "num_hidden_layers": 2})


@contextmanager
def scaled_tinyllama():
    """`SCALED_MODEL` resolvable in this process (models.archs.ARCHS) while the block runs; its name."""
    from batchlab.models.archs import ARCHS

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(ARCHS, SCALED_NAME, scaled_tinyllama_arch())
        yield SCALED_MODEL


VLLM_KV_POOL_BYTES = 2**30


@pytest.fixture(scope="session")
def vllm_backend():
    """One in-process vLLM engine for the session (eager, float32 on CPU, a 1 GiB KV pool) on the scaled
    TinyLlama through vLLM's dummy loader: the engine tests and the `NAME:random` test read it, so the
    engine start (tens of seconds on 2 cores) is paid once."""
    pytest.importorskip("vllm")
    from batchlab.worker.vllm_engine import VLLMBackend, VLLMSettings

    with scaled_tinyllama() as model:
        backend = VLLMBackend(VLLMSettings(model=model, max_num_seqs=8, enforce_eager=True,
                                           kv_cache_bytes=VLLM_KV_POOL_BYTES))
        backend.warmup()
        try:
            yield backend
        finally:
            backend.close()


HF_RUN = ("--backend", "hf", "--model", "tiny-mistral", "--device", "cpu", "--max-new-tokens", "8", "--seed", "3")


@pytest.fixture(scope="session")
def hf_static_runs(tmp_path_factory) -> dict[str, Path]:
    """`batchlab run` on tiny-mistral's static HF batches, the same trace under naive and dynamic batching;
    dynamic with a KV budget of a few prompts (4 MiB: 16 KiB a token), so its memory trigger fires. Read by
    the HF end-to-end tests and the GPU check's dry run."""
    outs, budget = {}, {"dynamic": ("--memory-budget", "4MiB"), "naive": ()}
    for strategy in ("dynamic", "naive"):
        outs[strategy] = tmp_path_factory.mktemp(strategy)
        run_cli("run", *HF_RUN, "--strategy", strategy, "--batch-size", "3", "--rate", "4", "--duration", "2",
                *budget[strategy], "--out", str(outs[strategy]), timeout_s=600)
    return outs


@pytest.fixture(scope="session")
def hf_continuous_run(tmp_path_factory) -> Path:
    """`batchlab run --strategy continuous` on tiny-mistral's HF loop, replaying one long request then short
    ones arriving while it runs. Read by the HF continuous end-to-end tests and the GPU check's dry run."""
    from tests.test_hf_continuous_e2e import write_schedule

    out = tmp_path_factory.mktemp("hf-continuous")
    schedule = write_schedule(out / "in.parquet", [0.0, 0.3, 0.35, 0.6, 1.0, 1.05],
                              [40, 12, 30, 5, 60, 20], [120, 4, 9, 1, 6, 12])
    run_cli("run", "--backend", "hf", "--model", "tiny-mistral", "--device", "cpu", "--strategy", "continuous",
            "--max-batch-size", "8", "--schedule", schedule, "--out", str(out / "run"), timeout_s=600)
    return out / "run"
