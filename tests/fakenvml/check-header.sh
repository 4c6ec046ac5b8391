#!/bin/sh
# Compile the fake NVML against NVIDIA's real nvml.h (PyPI wheel nvidia-nvml-dev, which
# ships only nvidia/cu13/include/nvml.h). Exits non-zero when a prototype, struct layout
# or clock-reason bit in fake_nvml.c disagrees with the header, or the wheel is missing.
# Usage: tests/fakenvml/check-header.sh [python]   (python with pip; default python3)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=${1:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" nvidia-nvml-dev
wheel=$(ls "$tmp"/nvidia_nvml_dev-*.whl)
"$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$tmp/x"
header=$(find "$tmp/x" -name nvml.h | head -n 1)
test -n "$header" || { echo "check-header: no nvml.h in $wheel" >&2; exit 1; }
echo "check-header: $(basename "$wheel")"
make -s -C "$here" check-header NVML_INCLUDE="$(dirname "$header")"
echo "check-header: fake_nvml.c agrees with $(basename "$wheel")'s nvml.h"
