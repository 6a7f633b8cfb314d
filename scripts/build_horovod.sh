#!/usr/bin/env bash
# Install Horovod 0.28.1 (PyTorch + Gloo, no MPI) into a virtualenv, building it once.
#
# Horovod 0.28.1 on PyPI compiles with C++14, which PyTorch >= 2.1 rejects; the fix (C++17) is
# merged upstream but unreleased. So: build the 0.28.1 source with the standard set to 17 in
# CMakeLists.txt and horovod/torch/CMakeLists.txt (about nine minutes on two cores), and keep
# the wheel in a cache so that later installs take seconds.
#
#   scripts/build_horovod.sh [PYTHON]        (default: .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
CACHE=${PILOTFILL_WHEEL_CACHE:-$HOME/.cache/pilotfill/wheels}
mkdir -p "$CACHE"
wheel=$(ls "$CACHE"/horovod-0.28.1-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    # Build needs: torch already installed (headers), a setuptools that builds wheels, and cmake.
    "$PY" -c 'import torch' || { echo "install torch==2.13.0 first" >&2; exit 1; }
    "$PY" -m pip install --quiet --disable-pip-version-check "setuptools>=70" wheel cloudpickle psutil pyyaml packaging
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PY" -m pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps horovod==0.28.1 -d "$work"
    tar -xzf "$work"/horovod-0.28.1.tar.gz -C "$work"
    src="$work/horovod-0.28.1"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt"
    echo "building Horovod 0.28.1 with C++17 (about nine minutes)…" >&2
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps "$src" -w "$work/dist"
    cp "$work"/dist/horovod-0.28.1-*.whl "$CACHE"/
    wheel=$(ls "$CACHE"/horovod-0.28.1-*.whl | head -n 1)
fi
"$PY" -m pip install --quiet --disable-pip-version-check "$wheel"
# Read the whole report before looking in it: `| grep -q` exits at the first match, Horovod then dies
# of a broken pipe, and pipefail takes that for a failed check.
report=$("$PY" -m horovod.runner.launch --check-build)
grep -q '\[X\] PyTorch' <<<"$report" || { echo "Horovod was built without PyTorch" >&2; exit 1; }
