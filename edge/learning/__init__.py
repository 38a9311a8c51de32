"""Learning from the cloud's commits: the opt-in commit log, and the token adapter or
draft head trained from it (`eventspec-edge train-adapter`)."""
