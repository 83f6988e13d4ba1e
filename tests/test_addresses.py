"""Addresses, ports and routing ids are declared once, in protocol/addresses.py: no ZeroMQ address and no
routing id is written as a literal anywhere else in the packages, and the standalone roles' options default
to protocol's addresses."""
import ast
import re

import typer

from batchlab.cli.main import app
from batchlab.protocol.addresses import DEFAULT, Addresses, heartbeat_id
from tests.test_layers import PACKAGES, ROOT

DECLARED_IN = "protocol/addresses.py"
ADDRESS = re.compile(r"\b(tcp|ipc|inproc)://[\w\[*/{]")  # a scheme with a host or a path ({...}: an f-string's)


def _modules() -> dict[str, ast.Module]:
    """Every module of the packages, parsed, by its path from the repository root."""
    return {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text())
            for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def _string_constants(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level to a string literal (`X_ID = "scheduler"`)."""
    return {target.id for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def _literal_identity(value: ast.expr, constants: set[str]) -> bool:
    """Whether a routing id is written in place: a string, an f-string with text of its own, or a module's own
    string constant."""
    if isinstance(value, ast.Name):
        return value.id in constants
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in ast.walk(value))


def _routing_ids(rel: str, tree: ast.Module) -> list[str]:
    """Where a module gives a socket a routing id that is a literal of its own."""
    constants, found = _string_constants(tree), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg == "identity" and _literal_identity(kw.value, constants):
                found.append(f"{rel}:{node.lineno} identity={ast.unparse(kw.value)}")
        if (isinstance(node.func, ast.Attribute) and node.func.attr == "setsockopt" and node.args
                and ast.unparse(node.args[0]).split(".")[-1] in ("IDENTITY", "ROUTING_ID")):
            found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    return found


def _is_text(node: ast.AST) -> bool:
    """A string literal or an f-string."""
    return isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, str)


def _text(node: ast.Constant | ast.JoinedStr) -> str:
    """A string literal's text; an f-string's as written."""
    return node.value if isinstance(node, ast.Constant) else ast.unparse(node)


def test_no_zeromq_address_literal_outside_protocols_declaration():
    found = [f"{rel}:{node.lineno} {_text(node)!r}" for rel, tree in _modules().items() if rel != DECLARED_IN
             for node in ast.walk(tree) if _is_text(node) and ADDRESS.search(_text(node))]
    assert found == []


def test_no_routing_id_literal_outside_protocol():
    found = [hit for rel, tree in _modules().items() if not rel.startswith("protocol/")
             for hit in _routing_ids(rel, tree)]
    assert found == []


def test_the_scan_sees_a_literal_routing_id():
    tree = ast.parse('X_ID = "traffic"\nmake_socket(ctx, k, a, identity=X_ID)\nmake_socket(ctx, k, a, '
                     'identity=f"{w}.hb")\nsock.setsockopt(zmq.ROUTING_ID, b"x")\nmake_socket(identity=TRAFFIC_ID)')
    assert len(_routing_ids("x.py", tree)) == 3


def test_the_standalone_roles_default_to_protocols_addresses():
    commands = typer.main.get_command(app).commands
    defaults = {(name, p.name): p.default for name in ("scheduler", "collector", "worker", "traffic")
                for p in commands[name].params if p.name in ("address", "scheduler", "collector")}
    assert defaults == {("scheduler", "address"): DEFAULT.scheduler, ("scheduler", "collector"): DEFAULT.collector,
                        ("collector", "address"): DEFAULT.collector, ("worker", "scheduler"): DEFAULT.scheduler,
                        ("worker", "collector"): DEFAULT.collector, ("traffic", "scheduler"): DEFAULT.scheduler}
    assert DEFAULT == Addresses() and DEFAULT.scheduler != DEFAULT.collector


def test_a_workers_heartbeat_socket_is_told_apart_from_the_worker():
    assert heartbeat_id("worker-0") != "worker-0" and heartbeat_id("worker-0").startswith("worker-0")
