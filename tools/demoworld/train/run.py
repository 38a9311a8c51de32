"""``eventspec toy train``: the toy trainers in order.

Target, then draft, then the adapter between them (it needs both: the ones trained
in this run, or the models ``TrainRun.target_in`` / ``draft_in`` name), then, when
asked for, the misaligned drafter (fine-tuned from that draft on other wording).
"""

from __future__ import annotations

import json
import logging
import time

from eventspec.demoworld.train.adapter import train_adapter
from eventspec.demoworld.train.draft import train_draft
from eventspec.demoworld.train.misaligned import train_misaligned
from eventspec.demoworld.train.settings import TrainRun
from eventspec.demoworld.train.target import train_target

log = logging.getLogger("eventspec.toy")


def train(run: TrainRun) -> dict[str, object]:
    """Run the stages in order; returns each stage's metrics and the output directories."""
    t0 = time.perf_counter()
    results: dict[str, object] = {}
    target_dir, draft_dir = run.target_in, run.draft_in
    if "target" in run.stages:
        results["target"] = train_target(run.target, run.outputs["target"])
        target_dir = run.outputs["target"]
    if "draft" in run.stages:
        results["draft"] = train_draft(run.draft, run.outputs["draft"])
        draft_dir = run.outputs["draft"]
    if "adapter" in run.stages:
        results["adapter"] = train_adapter(run.adapter, target_dir, draft_dir,
                                           run.outputs["adapter"])
    if "misaligned" in run.stages:
        results["misaligned"] = train_misaligned(run.misaligned, draft_dir,
                                                 run.outputs["misaligned"])
    results["outputs"] = {stage: str(run.outputs[stage]) for stage in run.stages}
    results["total_seconds"] = round(time.perf_counter() - t0, 1)
    log.info("trained %s: %s", ", ".join(run.stages), json.dumps(results["outputs"]))
    return results
