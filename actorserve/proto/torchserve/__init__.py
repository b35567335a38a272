"""TorchServe's gRPC wire format: ``org.pytorch.serve.grpc.inference`` and
``...management`` (``inference.proto``, ``management.proto``, written from TorchServe's
public definitions) and the ``google.rpc.Status`` they carry; the betterproto2 code under
``org/`` and ``google/`` is generated from them (committed; regenerate with
``python -m actorserve.proto.regenerate``)."""
