"""The client application: :class:`EdgeClient`, ``eventspec ask|status|wait|demo``.

Torch-free: it stands on the contract and the wire plumbing only, so ``pip install
eventspec`` (no extras) is enough to call an edge from anywhere.
"""

from eventspec.shared.client.edge_client import AskError, EdgeClient

__all__ = ["AskError", "EdgeClient"]
