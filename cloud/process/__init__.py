"""Interpreter settings a verifier process holds while its servers run: the startup heap
frozen out of the garbage collector, and the thread switch interval, each held by count."""
