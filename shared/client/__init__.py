"""The client application: :class:`EdgeClient`, ``eventspec ask|status|wait|demo``.

Torch-free: it stands on the contract and the wire plumbing only, so ``pip install
eventspec`` (no extras) is enough to call an edge from anywhere.
"""

import os

# gRPC's C core prints transport errors to stderr itself ("I1128 ...
# ssl_transport_security.cc:2563] Handshake failed ..."), before the command's own line
# that says the same with a hint; it reads GRPC_VERBOSITY once, when grpc is first
# imported, which for every client command is just below. An application that embeds
# the client and wants those lines sets GRPC_VERBOSITY itself.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from eventspec.shared.client.edge_client import AskError, EdgeClient

__all__ = ["AskError", "EdgeClient"]
