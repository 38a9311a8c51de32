"""The toy world: scenes, their DVS event simulator, templated questions and labels.

A numpy-only leaf. The edge's ``toy:`` source plays its scenes back, ``eventspec demo``
asks its questions, and the demo world's trainers learn from it; it imports nothing of
eventspec but the contract's errors.
"""
