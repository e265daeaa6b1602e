#!/usr/bin/env bash
# Generate common/rpc from proto/; with --check, generate into a temp dir and
# fail if the committed code differs (drift).
set -euo pipefail
check=0
if [[ "${1:-}" == "--check" ]]; then check=1; shift; fi
out=${1:-common/rpc}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
py=${PYTHON:-.venv/bin/python}
export PATH="$(dirname "$py"):$PATH"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m grpc_tools.protoc -I proto/txrepl/v1 \
  --python_out="$tmp" --grpc_python_out="$tmp" \
  --mypy_out="$tmp" --mypy_grpc_out="$tmp" \
  proto/txrepl/v1/txrepl.proto
# The generated service module imports its messages as a top-level module;
# make it a package-relative import so common.rpc is self-contained.
sed -i 's/^import txrepl_pb2 as/from common.rpc import txrepl_pb2 as/' "$tmp/txrepl_pb2_grpc.py"
sed -i "s/^import txrepl_pb2 as _txrepl_pb2/from common.rpc import txrepl_pb2 as _txrepl_pb2/" "$tmp/txrepl_pb2_grpc.pyi"
if [[ $check == 1 ]]; then
  status=0
  for f in "$tmp"/*; do
    name=$(basename "$f")
    if ! diff -q "$f" "$out/$name" >/dev/null 2>&1; then
      echo "generated code has drifted from proto/: $out/$name (run 'make proto')" >&2
      status=1
    fi
  done
  exit $status
fi
cp "$tmp"/* "$out"/
echo "generated $(ls "$tmp" | tr '\n' ' ')into $out"
