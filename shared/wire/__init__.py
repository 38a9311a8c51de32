"""gRPC plumbing both nodes share: the server shell, interceptors, options and health,
and network security (TLS and mutual TLS, bearer tokens and principals, the start-up
rules, client channels).

Only transport code imports this package; the contract layer (types, codec, timing,
errors) stays free of grpc so it can be tested and reused without a network.
``security`` is pure data (node settings hold it) and imports no grpc.
"""
