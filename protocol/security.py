"""CurveZMQ: loopback needs nothing; any other bind address needs keys (`batchlab keys generate DIR`).

Key folder layout: server.key / server.key_secret (the scheduler's and collector's identity),
client.key / client.key_secret (workers and traffic), authorized/ (public keys of allowed clients).
Copy the folder to a remote worker's host; peers without the right keys are refused by the handshake.
"""
import ipaddress
import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from batchlab.protocol.errors import InsecureAddress, term


def is_loopback(address: str) -> bool:
    """ipc://, inproc:// and tcp:// on 127.0.0.0/8, ::1 or localhost."""
    if address.startswith(("ipc://", "inproc://")):
        return True
    host = urlsplit(address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def generate_keys(folder: str | Path) -> Path:
    """Create a server and a client key pair in `folder`, the client authorized."""
    folder = Path(folder)
    (folder / "authorized").mkdir(parents=True, exist_ok=True)
    old_umask = os.umask(0o077)  # a secret key is never readable by others, not even for a moment
    try:
        zmq.auth.create_certificates(folder, "server")
        public, _secret = zmq.auth.create_certificates(folder, "client")
    finally:
        os.umask(old_umask)
    for path in folder.glob("*.key_secret"):  # mode 600 whatever umask pyzmq's writes saw
        path.chmod(0o600)
    for path in folder.glob("*.key"):  # public keys: readable as before
        path.chmod(0o644)
    shutil.copy(public, folder / "authorized" / "client.key")
    return folder


def check_bind(address: str, keys: str | None) -> None:
    """Refuse to bind a reachable address in the clear."""
    if not keys and not is_loopback(address):
        raise InsecureAddress(f"binding {address} (not loopback) needs CurveZMQ keys: "
                              f"run `batchlab keys generate DIR` and pass {term('--keys DIR', 'keys=DIR')}")


def start_authenticator(ctx: zmq.Context, keys: str | Path) -> ThreadAuthenticator:
    """Only clients whose public key is in KEYS/authorized may talk to this context's servers."""
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(Path(keys) / "authorized"))
    return auth


def secure_server(sock: zmq.Socket, keys: str | Path) -> None:
    """Make a binding socket a CURVE server (call before bind)."""
    public, secret = zmq.auth.load_certificate(Path(keys) / "server.key_secret")
    sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True


def secure_client(sock: zmq.Socket, keys: str | Path) -> None:
    """Make a connecting socket a CURVE client of the server in KEYS (call before connect)."""
    public, secret = zmq.auth.load_certificate(Path(keys) / "client.key_secret")
    server_public, _ = zmq.auth.load_certificate(Path(keys) / "server.key")
    sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = secret, public, server_public
