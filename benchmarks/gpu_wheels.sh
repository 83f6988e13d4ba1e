#!/usr/bin/env bash
# Fill .whl/ with the wheels benchmarks/gpu_check.sh installs on a GPU machine whose image has torch,
# transformers, msgpack, pyarrow and typer (so numpy, PyYAML, rich, packaging) but not the rest of what
# batchlab imports. Each wheel is the version installed here, for the GPU machine's Python (PYVER,
# default this interpreter's) on manylinux x86_64; no dependencies are followed (the list is complete).
# Refuses past 64 MiB in all (what may travel with the working tree).
#
#   bash benchmarks/gpu_wheels.sh                # then carry .whl (it is git-ignored)
#   PYVER=3.12 bash benchmarks/gpu_wheels.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
PYVER="${PYVER:-$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}"
LIMIT_BYTES=$((64 * 1024 * 1024))
# pyzmq: every process talks over ZeroMQ; mistral_common: the tokenizer file; sentencepiece: the tokenizer;
# pandas (+ dateutil, six, tzdata), psutil: tables and process trees; matplotlib (+ its deps): the report's plots
PACKAGES="pyzmq mistral_common sentencepiece pandas python-dateutil six tzdata psutil matplotlib contourpy
kiwisolver cycler fonttools pyparsing pillow"

mkdir -p "$ROOT/.whl"
for name in $PACKAGES; do
    if ! version="$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null)"; then
        echo "  $name: not installed here, skipped (nothing here needs it)"
        continue
    fi
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$ROOT/.whl" "$name==$version"
done
total=$(cat "$ROOT"/.whl/*.whl | wc -c)
ls -1sh "$ROOT"/.whl/*.whl
echo "total $((total / 1024 / 1024)) MiB in $(ls "$ROOT"/.whl/*.whl | wc -l) wheels for Python $PYVER"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
    echo "error: .whl/ is over 64 MiB: it cannot travel" >&2
    exit 1
fi
