"""The contract: what both nodes and every client agree on.

The request and event types, their wire conversion and tensor codec, the timing model and
its estimators, the error codes and the one request plan. Pure Python and numpy: it
imports no torch, no transformers, no gRPC and nothing above it (``make lint`` checks).
The generated messages it converts to and from are in :mod:`eventspec.shared.pb`.
"""
