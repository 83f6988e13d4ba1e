"""SLO items ('ttft=500ms', comma lists) to seconds: one grammar for every command."""
import re

SLO_NAMES = ("ttft", "tpot", "e2e", "queue_wait")
UNITS_S = {"ms": 1e-3, "s": 1.0, "us": 1e-6}


def slo_items(items: object) -> list[str]:
    """'ttft=1s,tpot=50ms' or ['ttft=1s,tpot=50ms', 'e2e=5s'] → one item per SLO (comma lists split)."""
    items = [items] if isinstance(items, str) else list(items or [])
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def parse_slos(items: list[str]) -> dict[str, float]:
    """['ttft=500ms', 'tpot=50ms'] or ['ttft=500ms,tpot=50ms'] → {'ttft': 0.5, 'tpot': 0.05} (seconds; no
    unit: ms); ValueError on a bad item, naming it."""
    slos = {}
    for item in slo_items(items):
        match = re.fullmatch(r"\s*(\w+)\s*=\s*([0-9.eE+-]+)\s*(ms|s|us)?\s*", str(item))
        if not match or match.group(1) not in SLO_NAMES:
            raise ValueError(f"--slo {item!r}: expected NAME=VALUE[ms|s|us] with NAME in {', '.join(SLO_NAMES)}")
        try:
            slos[match.group(1)] = float(match.group(2)) * UNITS_S[match.group(3) or "ms"]
        except ValueError:
            raise ValueError(f"--slo {item!r}: {match.group(2)!r} is not a number") from None
    return slos
