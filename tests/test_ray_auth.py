"""Ray on this machine's loopback says its own auth setting: a stray ~/.ray/auth_token (which Ray's
default for a new local cluster writes) must not turn token authentication on for a cluster started
here or for its drivers. Ray itself is faked: what is checked is the environment each one starts with."""
import subprocess

import pytest

from batchlab.lab import ray_cluster


class EnvRecordingRay:
    """ray.init that records RAY_AUTH_MODE as the processes it would start inherit it."""

    def __init__(self) -> None:
        self.auth_modes: list[str | None] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, **_kwargs) -> None:
        import os

        self.auth_modes.append(os.environ.get(ray_cluster.AUTH_MODE_ENV))

    def shutdown(self) -> None:  # the at-exit clean-up of a local Ray
        pass


@pytest.fixture
def fake_ray(monkeypatch):
    fake, at_exit = EnvRecordingRay(), []
    monkeypatch.setattr(ray_cluster, "import_ray", lambda: fake)
    monkeypatch.setattr(ray_cluster, "keep_on_loopback", lambda: None)  # it would patch the real Ray
    monkeypatch.setattr(ray_cluster.atexit, "register", lambda fn, *args: at_exit.append((fn, args)))
    monkeypatch.delenv(ray_cluster.AUTH_MODE_ENV, raising=False)
    yield fake
    for fn, args in at_exit:  # now: an xdist worker ends without running atexit (the local Ray's temp folder)
        fn(*args)


def test_a_local_ray_starts_with_token_auth_off(fake_ray):
    ray_cluster.connect(None)
    assert fake_ray.auth_modes == ["disabled"]


def test_a_users_own_auth_setting_is_kept_for_a_local_ray(fake_ray, monkeypatch):
    monkeypatch.setenv(ray_cluster.AUTH_MODE_ENV, "token")
    ray_cluster.connect("local")
    assert fake_ray.auth_modes == ["token"]


def test_connecting_to_an_address_follows_rays_own_rules(fake_ray):
    ray_cluster.connect("10.0.0.1:6379")
    assert fake_ray.auth_modes == [None]


def test_a_local_clusters_nodes_and_drivers_carry_its_auth_setting(monkeypatch, tmp_path):
    monkeypatch.setenv(ray_cluster.AUTH_MODE_ENV, "token")  # even a user's choice: the cluster is the test's
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(kwargs["env"])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(ray_cluster.subprocess, "run", fake_run)
    monkeypatch.setattr(ray_cluster, "_node_pids", lambda _temp_dir: [])
    cluster = ray_cluster.LocalCluster(tmp_path)
    cluster.start_head()
    cluster.add_node()
    assert [env[ray_cluster.AUTH_MODE_ENV] for env in seen] == ["disabled", "disabled"]
    assert cluster.env == {ray_cluster.AUTH_MODE_ENV: "disabled"}
