"""The cloud node.

Its commands print one line per failure, from the node's own log. gRPC's C core prints
its errors to stderr on its own ("E1128 ... add_port.cc:83] Failed to add port"), before
and beside that line, unless told not to, and it reads GRPC_VERBOSITY only once, when
grpc is first imported: so it is set here, the first code of any cloud process, unless
the environment already chose a level (GRPC_VERBOSITY=ERROR brings the lines back).
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")
