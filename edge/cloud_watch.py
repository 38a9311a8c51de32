"""The edge's view of its cloud verifier, kept fresh: asked often while it is not ready
and seldom after, each state logged once by its real cause and then once a minute with
a count, and readiness (so health) told what the cloud said.

Kept apart from ``eventspec.edge.server``, which starts and stops the edge's parts; this
is the one that follows the cloud for as long as the edge runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from eventspec.edge.readiness import CloudState, CloudView, Readiness
from eventspec.edge.uplink.channel import CloudLink
from eventspec.shared.contract.errors import ErrorCode, EventSpecError
from eventspec.shared.node.repeat_log import RepeatLog

log = logging.getLogger(__name__)

#: How often the edge asks the cloud how it is: while it is ready, and while it is not.
WATCH_READY_S = 5.0
WATCH_WAITING_S = 0.5


def warn_on_vocab_mismatch(cloud: str, cloud_fingerprint: str, draft_fingerprint: str) -> bool:
    """Log a loud WARNING when the cloud's text vocabulary is not the draft's.

    Such a cloud still answers target_only requests, so it is "reachable"; but every
    speculative request to it is refused (drafts in another vocabulary would be
    meaningless), which an operator must learn at start-up, not from clients. Returns
    whether they differ.
    """
    if cloud_fingerprint == draft_fingerprint:
        return False
    log.warning(
        "VOCABULARY MISMATCH: the cloud %s's text vocabulary (fingerprint %s) differs from "
        "the draft model's (%s); speculative requests will be refused, only target_only "
        "(and draft_only) work. Pair the draft with a target of the same tokenizer.",
        cloud, cloud_fingerprint[:12], draft_fingerprint[:12],
    )
    return True


@dataclass
class CloudWatch:
    """Follows one cloud link for the edge whose ``readiness`` it updates."""

    link: CloudLink
    readiness: Readiness
    #: The draft model's text-vocabulary fingerprint, checked against the cloud's.
    draft_fingerprint: str
    rpc_timeout_s: float
    #: The cloud's state in the log: one line per change, then one a minute with a count.
    cloud_log: RepeatLog = field(default_factory=lambda: RepeatLog(log))

    async def check(self, *, first: bool) -> None:
        """Ask the cloud how it is once, and tell readiness (and health) what it said."""
        link = self.link
        was_ready = self.readiness.cloud.state == CloudState.READY
        try:
            info = await link.server_info(self.rpc_timeout_s)
        except EventSpecError as exc:
            view = (await link.diagnose(self.rpc_timeout_s)
                    if exc.code in (ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED)
                    else CloudView(CloudState.UNREACHABLE, exc.message))
        else:
            view = CloudView(CloudState.READY)
            await link.sample_rtt(self.rpc_timeout_s)  # the plan's rtt, every 5 s
            self.cloud_log.flush()
            if first or not was_ready:
                log.info("cloud %s ready: %s", link.address, info.model_id)
                warn_on_vocab_mismatch(link.address, info.vocab_fingerprint,
                                       self.draft_fingerprint)
        if view.state != CloudState.READY:
            self.log_view(link.address, view)
        self.readiness.set_cloud(view)

    def log_view(self, address: str, view: CloudView) -> None:
        """The cloud's state, by its real cause, once when it starts and then once a
        minute with a count (the watcher polls every 0.5 s; each poll logged a raw
        "GetServerInfo failed: UNAVAILABLE ... backend unhealthy" before)."""
        if view.state == CloudState.WARMING_UP:
            # Keyed on the state, not the phase: each new phase is already one line of
            # its own ("edge agent NOT_SERVING: waiting for the cloud verifier: ...").
            self.cloud_log.report(logging.INFO, view.state, "cloud verifier at %s is warming "
                                  "up: %s", address, view.detail or "starting")
        elif view.state == CloudState.NOT_A_VERIFIER:
            self.cloud_log.report(logging.ERROR, view, "the server at %s is not an eventspec "
                                  "Verifier (GetServerInfo: UNIMPLEMENTED; another edge's "
                                  "port?); check --cloud", address)
        elif view.state == CloudState.REFUSED:
            self.cloud_log.report(logging.ERROR, view, "the cloud verifier at %s refused this "
                                  "edge (%s): check --cloud-tls-cert and --cloud-token-file "
                                  "against its --allow-principal", address, view.detail)
        else:  # answering while NOT_SERVING (draining, its engine down)
            level = logging.INFO if view.detail.startswith("it answers") else logging.WARNING
            self.cloud_log.report(level, view, "cloud verifier at %s is unreachable: %s",
                                  address, view.detail or "no answer")

    async def run(self) -> None:
        """Keep the view of the cloud fresh: often while it is not ready, seldom after."""
        while True:
            ready = self.readiness.cloud.state == CloudState.READY
            await self.readiness.next_change(WATCH_READY_S if ready else WATCH_WAITING_S)
            await self.check(first=False)

    def flush(self) -> None:
        """Log how long the last cloud condition held (at stop)."""
        self.cloud_log.flush()
