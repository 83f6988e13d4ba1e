"""`batchlab sweep --ray` on a local two-node Ray cluster on loopback (custom resources stand in for
GPUs): points split over both nodes and report as a local sweep's; a node killed mid-sweep loses no
point; Ctrl-C leaves no actor or batchlab process on any node."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

pytest.importorskip("ray")
from batchlab.lab.ray_cluster import LocalCluster  # noqa: E402
from batchlab.collector.layout import point_dir  # noqa: E402
from tests.conftest import ROOT, default_sigint, run_cli  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]
BASE = {"backend": "sim", "preset": "cpu-tiny-mistral", "dataset": "synthetic", "max_new_tokens": 16,
        "max_prompt_len": 128, "batch_size": 4, "max_batch_size": 8, "max_wait_ms": 50, "warmup_requests": 0}
DEADLINE_S = 600.0  # a hang guard: two 2 s points, but Ray and its workers start slowly on a loaded machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and a second node, one CPU each (so two groups run at once, one per node). HOME is a folder
    holding a stray ~/.ray/auth_token (what a local `sweep --ray` of Ray's default leaves): the cluster
    and its drivers carry their own auth setting, so it cannot break them."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("a-token-no-cluster-here-expects")
    c = LocalCluster()  # its own short folder under /tmp: Ray's socket paths must stay under 108 bytes
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        try:
            c.start_head(num_cpus=1)
            c.add_node(num_cpus=1, resources={"fakegpu": 1})
            yield c
        finally:
            c.stop()


def sweep_config(tmp_path: Path, duration_s: float, rates: list[float], strategies: list[str]) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": {**BASE, "duration_s": duration_s},
                                    "grid": {"strategies": strategies, "rates": rates, "repeats": 1}}))
    return path


def points(out: Path) -> list[dict]:
    return json.loads((out / "sweep.json").read_text())["points"]


def node_tree(node) -> list[psutil.Process]:
    """Every live process under one node's daemons."""
    found = []
    for pid in node.pids:
        try:
            top = psutil.Process(pid)
            found += [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return found


def command(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def actors(node) -> list[psutil.Process]:
    """The sweep's actors on one node."""
    return [p for p in node_tree(node) if "GroupRunner" in command(p)]


def running_point(node) -> bool:
    """Whether an actor on this node has started a point's processes."""
    return any(p.children() for p in actors(node) if p.is_running())


def role_pids(out: Path) -> dict[int, float]:
    """Every process the points of a sweep started (each run folder's pids.json), with its start time."""
    found = {}
    for path in out.glob("sweep_label=*/sweep_rate=*/sweep_repeat=*/pids.json"):
        for pid in json.loads(path.read_text()).values():
            found[pid] = path.stat().st_mtime
    return found


def alive(pid: int, started_before: float) -> bool:
    """The process is still there (not a new one that reused its pid)."""
    try:
        return psutil.Process(pid).create_time() <= started_before + 1.0
    except psutil.NoSuchProcess:
        return False


def wait_for(condition, what: str, deadline_s: float = DEADLINE_S):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def sweep_proc(config: Path, out: Path, cluster: LocalCluster) -> subprocess.Popen:
    """The sweep's driver, with SIGINT at its default even when this test runs as a background job."""
    return subprocess.Popen([sys.executable, "-m", "batchlab.cli.main", "sweep", str(config), "--out", str(out),
                             "--ray", cluster.address], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint, env={**os.environ, **cluster.env})


def test_a_sweep_splits_over_both_nodes_and_reports_as_a_local_sweep(cluster, tmp_path):
    config = sweep_config(tmp_path, 2.0, [6.0], ["naive", "dynamic"])
    on_ray, local = tmp_path / "ray", tmp_path / "local"
    run_cli("sweep", str(config), "--out", str(on_ray), "--ray", cluster.address, timeout_s=DEADLINE_S,
            env=cluster.env)
    run_cli("sweep", str(config), "--out", str(local), timeout_s=DEADLINE_S)
    remote = points(on_ray)
    assert {p["status"] for p in remote} == {"done"}
    assert len({p["node"]["node_id"] for p in remote}) == 2  # one group on each node
    for p in remote:
        a, b = (pd.read_parquet(root / p["dir"] / "requests.parquet") for root in (on_ray, local))
        cols = ["request_id", "status", "prompt_len", "output_len", "n_tokens"]
        pd.testing.assert_frame_equal(a[cols], b[cols])  # the same requests, each finished alike
        assert json.loads((on_ray / p["dir"] / "run.json").read_text())["config_hash"] == \
            json.loads((local / p["dir"] / "run.json").read_text())["config_hash"]
    naive = [pd.read_parquet(root / point_dir("naive", 6, 0) / "requests.parquet") for root in (on_ray, local)]
    batches = [df.groupby("batch_id")["request_id"].apply(tuple).tolist() for df in naive]
    assert batches[0] == batches[1]  # naive launches exactly 4 in arrival order: the same batches
    from batchlab.report.build import run_report

    for root in (on_ray, local):  # in-process: the report's CLI exits are tested on local sweeps
        assert run_report(str(root)).path.is_file()
    assert run_cli("sweep", str(config), "--out", str(on_ray), "--ray", cluster.address,
                   env=cluster.env).returncode == 0
    assert {p["status"] for p in points(on_ray)} == {"skipped"}  # resume reads the landed folders


def test_ctrl_c_leaves_no_actor_or_batchlab_process_on_any_node(cluster, tmp_path):
    config = sweep_config(tmp_path, 60.0, [4.0], ["naive", "dynamic"])
    out = tmp_path / "out"
    proc = sweep_proc(config, out, cluster)
    try:
        wait_for(lambda: len(list(out.glob("sweep_label=*/sweep_rate=*/sweep_repeat=*/pids.json"))) == 2,
                 "a point running on each node")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 130, output[-3000:]
        assert "Unhandled error" not in output, output[-3000:]  # the stopped points' replies are fetched, not printed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    started = role_pids(out)
    assert len(started) >= 6  # collector, scheduler, traffic and a worker per point
    wait_for(lambda: not any(actors(n) for n in cluster.nodes), "every actor gone", 60.0)
    wait_for(lambda: not any(alive(pid, t) for pid, t in started.items()), "every point's process gone", 60.0)


def test_a_node_killed_mid_sweep_loses_no_point(cluster, tmp_path):
    config = sweep_config(tmp_path, 4.0, [4.0], ["naive", "dynamic"])  # one point a node
    out = tmp_path / "out"
    proc = sweep_proc(config, out, cluster)
    try:
        second = cluster.nodes[1]
        wait_for(lambda: running_point(second), "a point running on the second node")
        cluster.kill_node(second)
        output, _ = proc.communicate(timeout=DEADLINE_S * 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output[-3000:]
    assert "running it again on another node" in output
    done = points(out)
    assert len(done) == 2 and {p["status"] for p in done} == {"done"}
    retried = [p for p in done if p.get("attempts")]
    assert retried and all(a["status"] == "failed" and a["data"] is False for p in retried for a in p["attempts"])
    for p in done:
        summary = json.loads((out / p["dir"] / "summary.json").read_text())
        assert summary["finished"] == summary["submitted"] > 0
