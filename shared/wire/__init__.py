"""gRPC plumbing both nodes share: the server shell, interceptors, options and health.

Only transport code imports this package; the contract layer (types, codec, timing,
errors) stays free of grpc so it can be tested and reused without a network.
"""
