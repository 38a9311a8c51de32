"""The edge node.

Its commands print one line per failure, from the node's own log: gRPC's C core is told
to keep quiet before anything imports grpc (``eventspec.shared.node.grpc_quiet``).
"""

from eventspec.shared.node.grpc_quiet import quiet_grpc_core

quiet_grpc_core()
