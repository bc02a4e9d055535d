#!/bin/sh
# Regenerates src/sunk/gpus/proto/ from the kubelet's own protos (k8s.io/kubelet
# in the Go module cache), for `sunk gpu-plugin`:
#   deviceplugin/v1beta1/api.proto       -> deviceplugin_pb2{,_grpc}.py{,i}
#   pluginregistration/v1/api.proto      -> pluginregistration_pb2{,_grpc}.py{,i}
# The package names (v1beta1, pluginregistration) are kept, so the gRPC method
# paths are the kubelet's (/v1beta1.DevicePlugin/..., /pluginregistration.Registration/...).
# gogoproto's import and options (older releases have them) are stripped.
# One-off tools, not project dependencies:
#   .venv/bin/pip install grpcio-tools==1.85.1 mypy-protobuf==5.1.0
set -eu
KUBELET_VERSION=${KUBELET_VERSION:-v0.36.3}
apis=${GOMODCACHE:-/root/go/pkg/mod}/k8s.io/kubelet@$KUBELET_VERSION/pkg/apis
root=$(cd "$(dirname "$0")/.." && pwd)
py=$root/.venv/bin/python
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Laid out under sunk/gpus/proto so the _grpc modules import their messages by
# the package path (from sunk.gpus.proto import ...), not as top-level modules.
out=$work/sunk/gpus/proto
mkdir -p "$out"
strip() {
  sed -e '/import "github.com\/gogo\/protobuf\/gogoproto\/gogo.proto";/d' \
      -e '/^option (gogoproto\./d' \
      -e 's/ *\[(gogoproto\.[^]]*\]//g' "$1" > "$2"
}
strip "$apis/deviceplugin/v1beta1/api.proto" "$out/deviceplugin.proto"
strip "$apis/pluginregistration/v1/api.proto" "$out/pluginregistration.proto"
cd "$work"
"$py" -m grpc_tools.protoc -I . \
  --python_out="$root/src" --grpc_python_out="$root/src" \
  --plugin=protoc-gen-mypy="$root/.venv/bin/protoc-gen-mypy" --mypy_out="$root/src" \
  --plugin=protoc-gen-mypy_grpc="$root/.venv/bin/protoc-gen-mypy_grpc" --mypy_grpc_out="$root/src" \
  sunk/gpus/proto/deviceplugin.proto sunk/gpus/proto/pluginregistration.proto
