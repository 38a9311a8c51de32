"""The three toy trainers (target, draft, adapter) and ``eventspec toy train``.

Torch training code lives only here: the nodes load the trained directories and never
import a trainer.
"""
