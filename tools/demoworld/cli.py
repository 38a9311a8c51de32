"""``eventspec toy train`` and ``eventspec toy eval``: the demo models, end to end.

``train`` runs the three trainers (target, draft, adapter) in this process and writes
the models to a new directory (``--out``; the shipped ones only with ``--install``).
``eval`` judges a set of models (the shipped ones, or a ``train --out`` directory)
through the real system: see :mod:`eventspec.demoworld.evaluate`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from eventspec.demoworld.train.settings import (
    DEFAULT_STAGES,
    MISALIGNED,
    STAGES,
    AdapterTraining,
    ModelTraining,
    TrainRun,
    TrainUsageError,
    check,
    output_dirs,
)
from eventspec.shared.helpfmt import OneLineParser

#: The first evaluation seed, past ``scenes.EVAL_SEED_MIN``: never trained or tested on.
DEFAULT_EVAL_SEED = 2_001_000
_MODEL = ModelTraining()
_ADAPTER = AdapterTraining()


def _quant_list(text: str) -> list[str]:
    """``none,int8,int4`` -> the list, each checked."""
    quants = [q.strip() for q in text.split(",") if q.strip()]
    bad = [q for q in quants if q not in ("none", "int8", "int4")]
    if bad or not quants:
        raise argparse.ArgumentTypeError(
            f"--draft-quant takes a comma-separated list of none, int8, int4; got {text!r}")
    return quants


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="eventspec toy", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="toy_command", required=True)
    tr = sub.add_parser("train",
                        help="train target, draft and adapter (GPU: minutes; CPU: hours)")
    where = tr.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None,
                       help="directory for the new models (default: a new "
                            "toy-models-<UTC time> directory here)")
    where.add_argument("--install", action="store_true",
                       help="replace the shipped models in cloud/models and edge/models")
    tr.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                    help=f"which of {','.join(STAGES)} to train, in that order (default: "
                         "%(default)s; misaligned: the drafter fine-tuned on other wording, "
                         "issue 22)")
    tr.add_argument("--target-model", type=Path, default=None,
                    help="the target the adapter pairs when the target stage does not run "
                         "(default: the shipped toy target)")
    tr.add_argument("--draft-model", type=Path, default=None,
                    help="the draft the adapter pairs, and the misaligned drafter starts "
                         "from, when the draft stage does not run (default: the shipped "
                         "toy draft)")
    tr.add_argument("--misaligned-steps", type=int, default=MISALIGNED.steps,
                    help="fine-tuning steps of the misaligned drafter (default: %(default)s)")
    tr.add_argument("--device", default="", help="cuda or cpu (default: cuda if available)")
    tr.add_argument("--scenes", type=int, default=_MODEL.scenes,
                    help="training scenes of the target and the draft (default: %(default)s)")
    tr.add_argument("--steps", type=int, default=None,
                    help="steps of every stage (default: each stage's own, below)")
    tr.add_argument("--target-steps", type=int, default=None,
                    help=f"target steps (default: --steps, else {_MODEL.steps})")
    tr.add_argument("--draft-steps", type=int, default=None,
                    help=f"draft steps (default: --steps, else {_MODEL.steps})")
    tr.add_argument("--adapter-steps", type=int, default=None,
                    help=f"adapter steps (default: --steps, else {_ADAPTER.steps})")
    tr.add_argument("--batch", type=int, default=_MODEL.batch,
                    help="batch of the target and the draft (default: %(default)s)")
    tr.add_argument("--adapter-batch", type=int, default=_ADAPTER.batch,
                    help="batch of the adapter (default: %(default)s)")
    tr.add_argument("--adapter-scenes", type=int, default=_ADAPTER.scenes,
                    help="paired scenes (seeds 0..N-1) the adapter trains on "
                         "(default: %(default)s)")
    tr.add_argument("--val-scenes", type=int, default=_MODEL.val_scenes,
                    help="validation scenes scored after training (default: %(default)s)")
    tr.add_argument("--seed", type=int, default=0,
                    help="initialisation and sampling seed (default: %(default)s)")
    tr.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="processes rendering scenes (default: %(default)s)")
    tr.add_argument("--log-every", type=int, default=_MODEL.log_every,
                    help="steps between progress lines (default: %(default)s)")
    ev = sub.add_parser("eval",
                        help="accuracy, acceptance and adapter metrics")
    ev.add_argument("--models", type=Path, default=None,
                    help="a toy train --out directory (default: the shipped models)")
    ev.add_argument("--scenes", type=int, default=50,
                    help="scenes to ask about (default: %(default)s)")
    ev.add_argument("--seed", type=int, default=DEFAULT_EVAL_SEED,
                    help="first scene seed; use seeds >= 2,000,000 (never trained or tested on; "
                         "default: %(default)s)")
    ev.add_argument("--max-new-tokens", type=int, default=12,
                    help="answer token cap (default: %(default)s)")
    ev.add_argument("--cloud-prefill-ms", type=float, default=200.0,
                    help="pace the cloud's prefill like an A100-class 7B (0: as fast as it is; "
                         "default: %(default)s)")
    ev.add_argument("--cloud-step-ms", type=float, default=30.0,
                    help="pace the cloud's steps like an A100-class 7B (0: as fast as it is; "
                         "default: %(default)s)")
    ev.add_argument("--speculation", choices=["auto", "always"], default="auto",
                    help="the edge's --speculation (default: %(default)s)")
    ev.add_argument("--draft-quant", type=_quant_list, default=[],
                    help="also ask every question speculatively through a static drafter "
                         "with each of these weights (comma-separated: none,int8,int4) and "
                         "report its acceptance rate and mean accepted length")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def train_run(args: argparse.Namespace, device: str) -> TrainRun:
    """The ``TrainRun`` the flags describe, on ``device`` (not yet checked)."""
    def steps(own: int | None, default: int) -> int:
        return own if own is not None else args.steps if args.steps is not None else default

    model = ModelTraining(scenes=args.scenes, batch=args.batch, seed=args.seed,
                          val_scenes=args.val_scenes, device=device, workers=args.workers,
                          log_every=args.log_every)
    shipped = output_dirs(None, install=True)
    return TrainRun(
        stages=tuple(s.strip() for s in args.stages.split(",") if s.strip()),
        outputs=output_dirs(args.out, args.install),
        target=replace(model, steps=steps(args.target_steps, _MODEL.steps)),
        draft=replace(model, steps=steps(args.draft_steps, _MODEL.steps)),
        adapter=AdapterTraining(scenes=args.adapter_scenes,
                                steps=steps(args.adapter_steps, _ADAPTER.steps),
                                batch=args.adapter_batch, seed=args.seed, device=device,
                                workers=args.workers, log_every=args.log_every),
        misaligned=replace(MISALIGNED, steps=args.misaligned_steps, seed=args.seed,
                           device=device, workers=args.workers),
        target_in=args.target_model or shipped["target"],
        draft_in=args.draft_model or shipped["draft"],
    )


def _train(args: argparse.Namespace) -> int:
    try:
        run = train_run(args, args.device)
        check(run, install=args.install)
    except TrainUsageError as exc:
        print(f"eventspec toy train: {exc}", file=sys.stderr)
        return 2
    import torch

    from eventspec.demoworld.train.run import train

    if not args.device:  # checked first: a bad flag fails before torch loads
        device = "cuda" if torch.cuda.is_available() else "cpu"
        run = replace(run, target=replace(run.target, device=device),
                      draft=replace(run.draft, device=device),
                      adapter=replace(run.adapter, device=device),
                      misaligned=replace(run.misaligned, device=device))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.install:
        replaced = ", ".join(str(run.outputs[stage]) for stage in run.stages)
        print(f"eventspec toy train: --install replaces the shipped {replaced}", file=sys.stderr)
    print(json.dumps(train(run), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.toy_command == "train":
        return _train(args)
    from eventspec.demoworld.evaluate import evaluate

    return evaluate(args)
