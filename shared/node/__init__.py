"""What both nodes stand on: serving a node from its CLI, the one node-CLI
helper, metrics, tracing, safe logging, the vocabulary fingerprint, image preprocessing
and the KV-cache helper.

This is the floor that may import torch and transformers; the contract below it may not.
Neither node is imported from here (``make lint`` checks).
"""
