#!/usr/bin/env bash
# The GPU check (benchmarks/device_check.py; docs/performance.md, "The GPU check"), run on the GPU machine from
# the checkout's root with the wheels folder beside it:
#
#     bash benchmarks/device_check.sh                # tests, fine-tuning and timings on the GPU, under 8 minutes
#     bash benchmarks/device_check.sh --cpu-smoke    # the same script on the CPU with tiny sizes
#
# That machine has torch, jax, timm and pytest but no keras: the wheels of `make device-wheels`
# (.device-wheels/) are installed into a temporary directory put first on PYTHONPATH, with this checkout
# (keras_vit is not installed there). PYTHON picks the interpreter (default: python3, the machine's).
set -u
cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
smoke=0
for argument in "$@"; do [ "$argument" = --cpu-smoke ] && smoke=1; done

# Refuse before any work where there is no GPU: one line, exit 3.
if [ $smoke = 0 ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "device_check: no GPU here (nvidia-smi is not installed); run it on the GPU machine, or pass --cpu-smoke" >&2
        exit 3
    fi
    if ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
        echo "device_check: no GPU here (nvidia-smi -L lists none); run it on the GPU machine, or pass --cpu-smoke" >&2
        exit 3
    fi
fi

site=$(mktemp -d "${TMPDIR:-/tmp}/keras_vit-device-site-XXXXXX") || exit 2
trap 'rm -rf "$site"' EXIT
# The wheels are CPython 3.12's (the GPU machine's Python); the CPU smoke elsewhere uses the keras it finds.
is_312=0
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && is_312=1
if ls .device-wheels/*.whl >/dev/null 2>&1 && { [ $is_312 = 1 ] || [ $smoke = 0 ]; }; then
    if ! "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
            --target "$site" .device-wheels/*.whl; then
        echo "device_check: the wheels of .device-wheels/ did not install (pip's message is above)" >&2
        exit 1
    fi
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    # find_spec, not an import: importing Keras starts its backend, seconds of CPU for a yes or no.
    if ! "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('keras') is None)" \
            >/dev/null 2>&1; then
        echo "device_check: no keras and no .device-wheels/: run \`make device-wheels\` and carry .device-wheels" >&2
        exit 1
    fi
fi
"$PYTHON" benchmarks/device_check.py "$@"
