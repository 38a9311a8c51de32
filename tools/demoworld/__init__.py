"""The embedded demo world: everything that exists so eventspec runs with no downloads.

Not product code. The product is the contract (``shared``), the edge (``edge``) and
the cloud (``cloud``), which serve real EventGPT-7b and Video-LLaVA-7B checkpoints from
directories. The demo world supplies small stand-ins and the world they live in:

- the toy world: scenes (:mod:`.scenes`) rendered to RGB clips and, through a DVS
  simulator (:mod:`.events`), to event streams; templated questions with parseable
  answers (:mod:`.qa`) and attribute labels for training (:mod:`.labels`);
- tokenizers in the LLaMA id layout (:mod:`.tokenizer`): the frozen ``tiny`` one of
  the random test models (:mod:`.tiny_tokenizer`) and the ``toy`` one the trained
  demo pair shares (:mod:`.toy_tokenizer`);
- the ``tiny-random`` models, built in code (:mod:`.tiny_target`, :mod:`.tiny_draft`);
- the trainers of the shipped toy pair and their adapter (:mod:`.train`), with
  ``eventspec toy train|eval`` (:mod:`.cli`, :mod:`.evaluate`) and ``eventspec demo``
  (:mod:`.demo`).

It may import the nodes' model classes (it builds and trains them). The nodes import
only the toy world's scenes and simulator (the edge's ``toy`` source plays them back),
and the node CLIs the tiny-random builders, lazily, for ``--model tiny-random``; they
load every model from a directory and never import a trainer or a tokenizer builder.
This package imports nothing itself, so importing the scenes loads no torch.
"""
