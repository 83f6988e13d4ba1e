"""Socket factory: loopback by default, keys off loopback, bounded queues that block instead of dropping."""
import pytest
import zmq

from batchlab.protocol import addresses, sockets
from batchlab.protocol.security import InsecureAddress, check_bind, generate_keys, is_loopback


@pytest.mark.parametrize("address, loopback", [
    ("tcp://127.0.0.1:5557", True), ("tcp://127.9.9.9:1", True), ("tcp://localhost:1", True),
    ("tcp://[::1]:5557", True), ("ipc:///tmp/x.sock", True), ("tcp://0.0.0.0:5557", False),
    ("tcp://*:5557", False), ("tcp://10.1.2.3:5557", False), ("tcp://gpu-box:5557", False),
])
def test_loopback_detection(address, loopback):
    assert is_loopback(address) is loopback


def test_binding_off_loopback_without_keys_is_refused_before_any_socket_exists():
    with pytest.raises(InsecureAddress, match="batchlab keys generate"):
        check_bind("tcp://0.0.0.0:5557", None)
    check_bind("tcp://0.0.0.0:5557", "/some/keys")  # with keys it is allowed


def test_default_addresses_are_loopback():
    a = addresses.Addresses()
    assert is_loopback(a.scheduler) and is_loopback(a.collector)


def test_a_client_with_the_keys_gets_through_a_curve_server(tmp_path):
    from batchlab.protocol.security import start_authenticator

    keys = str(generate_keys(tmp_path / "keys"))
    ctx = zmq.Context()
    auth = start_authenticator(ctx, keys)
    try:
        server = sockets.make_socket(ctx, zmq.PULL, "tcp://127.0.0.1:0", bind=True, keys=keys)
        address = server.getsockopt_string(zmq.LAST_ENDPOINT)
        good = sockets.make_socket(ctx, zmq.PUSH, address, bind=False, keys=keys)
        bad = sockets.make_socket(ctx, zmq.PUSH, address, bind=False)
        bad.send(b"intruder")
        good.send(b"friend")
        assert server.poll(5000) and server.recv() == b"friend"
        assert not server.poll(500)
        for s in (server, good, bad):
            s.close(linger=0)
    finally:
        auth.stop()
        ctx.term()


def test_a_slow_receiver_makes_the_sender_block_at_the_high_water_mark_and_loses_nothing(monkeypatch):
    """Events to the collector go over PUSH: at the HWM a send blocks (back-pressure), it never drops."""
    monkeypatch.setattr(sockets, "SEND_HWM", 10)
    monkeypatch.setattr(sockets, "RECV_HWM", 10)
    ctx = zmq.Context()
    pull = sockets.make_socket(ctx, zmq.PULL, "inproc://hwm", bind=True)
    push = sockets.make_socket(ctx, zmq.PUSH, "inproc://hwm", bind=False)
    sent = 0
    with pytest.raises(zmq.Again):  # nobody reads: the queue fills, then send would block
        for sent in range(1000):
            push.send(b"%d" % sent, zmq.NOBLOCK)
    assert 10 <= sent < 100
    received = [pull.recv() for _ in range(sent)]
    assert received == [b"%d" % i for i in range(sent)]
    for s in (push, pull):
        s.close(linger=0)
    ctx.term()


def test_generated_secret_keys_are_readable_by_their_owner_only(tmp_path):
    keys = generate_keys(tmp_path / "keys")
    secrets = sorted(keys.glob("*.key_secret"))
    assert [p.name for p in secrets] == ["client.key_secret", "server.key_secret"]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets)
    assert (keys / "server.key").stat().st_mode & 0o777 == 0o644
