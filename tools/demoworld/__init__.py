"""The demo world's builders: everything that makes the embedded models, above the nodes.

Installed as ``eventspec.demoworld`` (from tools/demoworld/). It imports both nodes' model
classes because it builds and trains them, so it sits on the top floor (docs/layout.md):

- tokenizers in the LLaMA id layout (:mod:`.tokenizer`): the frozen ``tiny`` one of the
  random test models (:mod:`.tiny_tokenizer`) and the ``toy`` one the trained demo pair
  shares (:mod:`.toy_tokenizer`);
- the ``tiny-random`` models, built in code (:mod:`.tiny_target`, :mod:`.tiny_draft`);
- the trainers of the shipped toy pair and their adapter (:mod:`.train`), behind
  ``eventspec toy train|eval`` (:mod:`.cli`, :mod:`.evaluate`).

The toy world they learn from (scenes, simulator, questions) is the numpy-only
:mod:`eventspec.shared.toyworld`, and ``eventspec demo`` is the client's
(:mod:`eventspec.shared.client.demo`). The nodes import nothing from here: their CLIs find
the tiny-random builders for ``--model tiny-random`` through the
``eventspec.builtin_models`` entry points (``pyproject.toml``), as the client finds
``eventspec toy`` through ``eventspec.commands``.
"""
