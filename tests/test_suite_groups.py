"""How `make test` spreads the suite over xdist workers (tests/conftest.py): a module stays in one
worker, the tests that load a real model or vLLM share the one cpu-heavy group, the Ray tests the ray group."""
import os
from pathlib import Path

import pytest

from tests.conftest import CPU_HEAVY_GROUP, CPU_HEAVY_MODULES, RAY_GROUP, SHARED_HEAVY_FIXTURES, xdist_group_of


class FakeItem:
    def __init__(self, module: str, *markers: str, fixtures: tuple[str, ...] = ()) -> None:
        self.path, self.markers, self.fixturenames = Path("tests") / module, set(markers), list(fixtures)

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


def test_model_vllm_and_ray_tests_share_one_group_and_the_rest_run_by_module():
    assert xdist_group_of(FakeItem("test_hf_e2e.py")) == CPU_HEAVY_GROUP
    assert xdist_group_of(FakeItem("test_process_cleanup.py", "slow", "vllm")) == CPU_HEAVY_GROUP
    assert xdist_group_of(FakeItem("test_ray.py", "slow", "ray")) == RAY_GROUP  # mostly waits: beside cpu-heavy
    assert xdist_group_of(FakeItem("test_process_cleanup.py", "slow")) == "test_process_cleanup.py"
    assert all((Path(__file__).parent / m).is_file() for m in CPU_HEAVY_MODULES)  # a renamed file is noticed


def test_a_test_reading_a_shared_real_model_fixture_joins_the_group_that_pays_for_it_once():
    for fixture in SHARED_HEAVY_FIXTURES:
        assert xdist_group_of(FakeItem("test_some_report.py", fixtures=("tmp_path", fixture))) == CPU_HEAVY_GROUP
    assert xdist_group_of(FakeItem("test_some_report.py", fixtures=("tmp_path",))) == "test_some_report.py"


def test_under_loadgroup_a_tests_node_id_names_its_group(request):
    """The scheduler groups by the node id's @suffix; without it every test would be scheduled alone."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest-xdist --dist loadgroup (make test)")
    assert request.node.nodeid.endswith("@test_suite_groups.py")
