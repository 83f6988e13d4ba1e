#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) on a machine whose image lacks some of batchlab's packages.
#
#   bash benchmarks/gpu_check.sh                      # on the GPU machine: ~7 min on one H200
#   bash benchmarks/gpu_check.sh --device cpu --dry-run --out /tmp/gpu-dry   # here: every phase, tiny
#
# What the image lacks travels as wheels in .whl/ (made here by benchmarks/gpu_wheels.sh, 64 MiB at most;
# nothing can be downloaded there). They are listed, installed with --no-index --no-deps into /tmp/site
# and put on PYTHONPATH with this checkout (as the `batchlab` package: a link, nothing is built).
# The tokenizer of tiny-mistral and of NAME:random models is Mistral's SentencePiece file inside the
# mistral_common wheel: BATCHLAB_MISTRAL_TOKENIZER names it, so mistral_common itself is never imported.
# Extra arguments go to gpu_check.py; GPU_CHECK_TIMEOUT_S (default 470) bounds the whole check.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
SITE="${GPU_CHECK_SITE:-/tmp/site}"
SRC="${GPU_CHECK_SRC:-/tmp/batchlab-src}"

# 1. the carried wheels: listed, then installed into $SITE
WHEELS="${GPU_CHECK_WHEELS:-$ROOT/.whl}"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    echo "carried wheels ($(du -ch "$WHEELS"/*.whl | tail -1 | cut -f1)):"
    ls -1 "$WHEELS"/*.whl | xargs -n1 basename | sed 's/^/  /'
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
else
    echo "no .whl/ folder: using the packages installed here"
fi

# 2. this checkout as the batchlab package, the wheels' site, the tokenizer file
mkdir -p "$SRC"
ln -sfn "$ROOT" "$SRC/batchlab"
export PYTHONPATH="$SRC:$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${BATCHLAB_MISTRAL_TOKENIZER:-}" ] && [ -f "$SITE/mistral_common/data/tokenizer.model.v1" ]; then
    export BATCHLAB_MISTRAL_TOKENIZER="$SITE/mistral_common/data/tokenizer.model.v1"
fi
export BATCHLAB_HOME="${BATCHLAB_HOME:-$HOME/.cache/batchlab}"  # NAME:random folders (config + tokenizer)

# 3. the check itself, bounded
exec timeout --kill-after=20 "${GPU_CHECK_TIMEOUT_S:-470}" "$PY" "$ROOT/benchmarks/gpu_check.py" "$@"
