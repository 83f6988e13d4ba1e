"""What starting the vLLM worker backend costs, and which setting cuts it.

Each configuration starts `worker.vllm_engine.VLLMBackend` in a fresh process (the way a worker does:
in-process engine core), then warms it up; it prints import, engine start (vLLM's own profile, KV pool
allocation and graph compilation) and warm-up seconds:

- compiled, cold: vLLM's default torch.compile with an empty compile cache (a fresh machine);
- compiled, cached: the same again, its compile cache now filled (a second start on that machine);
- eager: `enforce_eager` (no torch.compile).

    python benchmarks/vllm_startup.py [--model tiny-mistral] [--kv-bytes 1073741824]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, time
t0 = time.monotonic()
from batchlab.worker.vllm_engine import VLLMBackend, VLLMSettings
t1 = time.monotonic()
be = VLLMBackend(VLLMSettings(model={model!r}, max_num_seqs=8, enforce_eager={eager!r}, kv_cache_bytes={kv!r}))
t2 = time.monotonic()
be.warmup()
t3 = time.monotonic()
be.close()
print(json.dumps({{"import_s": t1 - t0, "engine_s": t2 - t1, "engine_start_s": be.info.facts["engine_start_s"],
                  "warmup_s": t3 - t2, "total_s": t3 - t0}}))
"""


def start_once(model: str, eager: bool, kv_bytes: int, cache_root: str) -> dict:
    """One backend start in a fresh interpreter with its own vLLM cache folder; its timings."""
    code = CHILD.format(model=model, eager=eager, kv=kv_bytes)
    env = {**os.environ, "VLLM_CACHE_ROOT": cache_root, "VLLM_LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"start failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-mistral")
    parser.add_argument("--kv-bytes", type=int, default=2**30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache:
        rows = [("compiled, cold cache", start_once(args.model, False, args.kv_bytes, cache)),
                ("compiled, cached", start_once(args.model, False, args.kv_bytes, cache)),
                ("eager", start_once(args.model, True, args.kv_bytes, cache))]
    print(f"{'configuration':22} {'import s':>9} {'engine s':>9} {'warm-up s':>10} {'total s':>8}")
    for name, r in rows:
        print(f"{name:22} {r['import_s']:9.1f} {r['engine_s']:9.1f} {r['warmup_s']:10.1f} {r['total_s']:8.1f}")


if __name__ == "__main__":
    main()
