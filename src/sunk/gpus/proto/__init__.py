"""Python code generated from the kubelet's own protos, k8s.io/kubelet v0.36.3:

- `deviceplugin_pb2*`: pkg/apis/deviceplugin/v1beta1/api.proto (package
  `v1beta1`: the DevicePlugin service the kubelet calls, `/v1beta1.DevicePlugin/...`);
- `pluginregistration_pb2*`: pkg/apis/pluginregistration/v1/api.proto (package
  `pluginregistration`: the Registration service the kubelet's plugin watcher
  calls, `/pluginregistration.Registration/...`).

Do not edit them: `scripts/gen-kubelet-protos.sh` regenerates them all (with the
one-off tools `pip install grpcio-tools==1.85.1 mypy-protobuf==5.1.0`, which
are not project dependencies); the `.pyi` stubs come from mypy-protobuf.
"""
