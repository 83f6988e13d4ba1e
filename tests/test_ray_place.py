"""What a sweep's worker groups ask of a Ray node and which no node can hold (pure: nodes as ray.nodes()
gives them), tarballs of run folders, and the fan-out's map in order (in process and in processes)."""
import pytest

from batchlab.runner.preflight import checked_config
from batchlab.lab.fanout import Fanout
from batchlab.lab.ray_actor import GPU_MEMORY, Ask, ask, declares_gpu_memory, pack, refusals, unpack
from batchlab.lab.ray_cluster import is_loopback


def cfg(**values):
    return checked_config({"out": ".", **values}, {})


def node(alive: bool = True, **resources) -> dict:
    return {"Alive": alive, "Resources": resources}


def test_a_sim_point_asks_only_cpus():
    a = ask(cfg(backend="sim"), cpus=2)
    assert a.resources == {"CPU": 2.0} and a.actor_options() == {"num_cpus": 2.0, "num_gpus": 0}


def test_a_gpu_point_asks_a_gpu_per_worker_and_parallel_rank_in_the_stand_in_resource():
    a = ask(cfg(backend="vllm", device="cuda", workers=2, tensor_parallel_size=2), gpu_resource="fakegpu")
    assert a.resources == {"CPU": 1.0, "fakegpu": 4.0}
    assert a.actor_options() == {"num_cpus": 1.0, "num_gpus": 0, "resources": {"fakegpu": 4.0}}


def test_weights_ask_gpu_memory_where_nodes_state_it(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 2**20)
    on_gpu = ask(cfg(backend="hf", device="cuda", model=str(tmp_path)), gpu_memory_known=True)
    assert on_gpu.weights_bytes == 2**20 and on_gpu.resources[GPU_MEMORY] == 1  # ceil(1.2 MiB in GiB)
    on_cpu = ask(cfg(backend="hf", device="cpu", model=str(tmp_path)))
    assert on_cpu.resources["memory"] == int(2**20 * 1.2) and "GPU" not in on_cpu.resources


def test_a_group_no_live_node_can_hold_is_refused_naming_what_it_lacks():
    nodes = [node(CPU=8.0, GPU=1.0), node(alive=False, CPU=8.0, GPU=4.0), node(CPU=2.0)]
    fits, too_big = Ask({"CPU": 1.0, "GPU": 1.0}), Ask({"CPU": 1.0, "GPU": 2.0}, weights_bytes=3 * 2**30)
    lines = refusals({"small": fits, "big": too_big}, nodes)
    assert len(lines) == 1 and lines[0].startswith("big:")
    assert "GPU 2 (largest node: 1)" in lines[0] and "3.0 GiB" in lines[0]  # the dead 4-GPU node is no offer


def test_a_model_over_every_nodes_gpu_memory_is_refused():
    nodes = [node(CPU=8.0, GPU=1.0, **{GPU_MEMORY: 24.0}), node(CPU=8.0, GPU=1.0, **{GPU_MEMORY: 80.0})]
    assert declares_gpu_memory(nodes)
    assert refusals({"7b": Ask({"CPU": 1.0, "GPU": 1.0, GPU_MEMORY: 17.0})}, nodes) == []
    [line] = refusals({"70b": Ask({"CPU": 1.0, "GPU": 1.0, GPU_MEMORY: 168.0})}, nodes)
    assert f"{GPU_MEMORY} 168 (largest node: 80)" in line


def test_a_packed_run_folder_unpacks_to_the_same_files(tmp_path):
    src = tmp_path / "a"
    (src / "logs").mkdir(parents=True)
    (src / "summary.json").write_text("{}")
    (src / "logs" / "worker-0.out").write_bytes(b"x" * 1000)
    dest = tmp_path / "b"
    (dest / "stale").mkdir(parents=True)
    unpack(pack(src), dest)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == \
        ["logs", "logs/worker-0.out", "summary.json"]
    assert (dest / "logs" / "worker-0.out").read_bytes() == b"x" * 1000


@pytest.mark.parametrize("address, loop", [(None, True), ("local", True), ("127.0.0.1:6379", True),
                                           ("localhost:6379", True), ("10.0.0.5:6379", False), ("auto", False)])
def test_only_local_and_loopback_addresses_keep_the_driver_on_loopback(address, loop):
    assert is_loopback(address) is loop


def _scaled(shared: int, item: int) -> tuple[int, int]:
    import os

    return shared * item, os.getpid()


def test_a_fanout_maps_in_order_with_the_shared_argument():
    assert [r for r, _ in Fanout().map(_scaled, [3, 1, 2], 10)] == [30, 10, 20]


@pytest.mark.slow  # starts two processes
def test_a_fanout_over_processes_maps_in_order_in_other_processes():
    import os

    results = Fanout(processes=2).map(_scaled, list(range(40)), 3)
    assert [r for r, _ in results] == [3 * i for i in range(40)]
    assert os.getpid() not in {pid for _, pid in results}


class _View:
    def __init__(self) -> None:
        self.ended = []

    def finished(self, point, record) -> None:
        self.ended.append(record["status"])


def test_a_group_no_live_node_can_hold_any_more_fails_its_points_instead_of_waiting(tmp_path):
    from types import SimpleNamespace

    from batchlab.lab.ray_sweep import WorkerGroup, _give_up_unplaceable
    from batchlab.lab.sweep_plan import Entry, Point

    entry = Entry("big", {"strategy": "naive", "backend": "vllm"})
    points = [Point(entry, r, 0, 0, tmp_path / f"rate-{r:g}") for r in (1.0, 2.0)]
    killed = []
    ray = SimpleNamespace(nodes=lambda: [node(CPU=4.0), node(alive=False, CPU=4.0, GPU=1.0)],
                          kill=lambda actor, no_restart: killed.append(actor))
    fits = WorkerGroup("small", Ask({"CPU": 1.0}), [])
    lost = WorkerGroup("big", Ask({"CPU": 1.0, "GPU": 1.0}), [0, 1], actor="actor-1")
    flight, index, view = {"ref": (lost, 0)}, {"points": [p.record("pending") for p in points]}, _View()
    _give_up_unplaceable(ray, [fits, lost], flight, points, index, view)
    assert flight == {} and killed == ["actor-1"] and lost.todo == [] and view.ended == ["failed", "failed"]
    assert all("no live node can hold it now" in p["reason"] for p in index["points"])


@pytest.mark.parametrize("args, expected", [
    (["sweep", "c.yaml", "--ray"], ["sweep", "c.yaml", "--ray", "local"]),
    (["sweep", "c.yaml", "--ray", "--out", "o"], ["sweep", "c.yaml", "--ray", "local", "--out", "o"]),
    (["sweep", "c.yaml", "--ray", "127.0.0.1:6379"], ["sweep", "c.yaml", "--ray", "127.0.0.1:6379"]),
    (["sweep", "c.yaml", "--ray-cpus", "2"], ["sweep", "c.yaml", "--ray-cpus", "2"])])
def test_a_bare_ray_option_means_a_local_ray(args, expected):
    from batchlab.cli.grammar import with_ray_value

    assert with_ray_value(args) == expected
