"""Server reflection under both ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``.

grpcio-reflection ships only v1alpha, while current tools (grpcurl, Postman, grpcui)
try v1 first. The two protocols are the same messages under another package name, so
v1 is served by the v1alpha servicer through a generic handler, and the v1 file
descriptor (v1alpha's, renamed) is added to the pool so v1 itself can be described.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc import aio
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
V1 = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _register_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Add the v1 reflection file to ``pool`` (once): v1alpha's, with the package renamed."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    old, new = fdp.package, "grpc.reflection.v1"
    fdp.name, fdp.package = _V1_FILE, new
    for msg in fdp.message_type:
        for f in msg.field:
            if f.type_name:
                f.type_name = f.type_name.replace(f".{old}.", f".{new}.")
    for svc in fdp.service:
        for m in svc.method:
            m.input_type = m.input_type.replace(f".{old}.", f".{new}.")
            m.output_type = m.output_type.replace(f".{old}.", f".{new}.")
    fdp.ClearField("options")
    pool.AddSerializedFile(fdp.SerializeToString())


def enable_reflection(server: aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection v1alpha and v1 for ``service_names`` (plus both reflection services)."""
    pool = descriptor_pool.Default()
    _register_v1_descriptor(pool)
    names = (*service_names, V1ALPHA, V1)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc_add = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    for service in (V1ALPHA, V1):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            service, {"ServerReflectionInfo": reflection_pb2_grpc_add}),))
