"""Keep gRPC's C core from printing to stderr in a node's process.

A node's commands print one line per failure, from the node's own log. gRPC's C core
prints its errors to stderr on its own ("E1128 ... add_port.cc:83] Failed to add port"),
before and beside that line, unless told not to, and it reads GRPC_VERBOSITY only once,
when grpc is first imported: so each node's package calls :func:`quiet_grpc_core` as the
first code of any of its processes, which sets it unless the environment already chose
a level (GRPC_VERBOSITY=ERROR brings the lines back). Imports nothing, grpc least of all.
"""

import os


def quiet_grpc_core() -> None:
    """``GRPC_VERBOSITY=NONE`` unless the environment set a level; before grpc is imported."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
