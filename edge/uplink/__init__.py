"""The edge's uplink to the cloud verifier: the link's roles, the gRPC channel and its
streams, the replicas behind `--cloud` and their standing, waiting, failover and
admission."""
