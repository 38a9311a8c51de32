"""Per-request speculative decoding state on the cloud: the committed sequence C. Pure.

No engine calls, no threads, no gRPC: the scheduler asks a session what to feed next
(:meth:`DecodingSession.step_input`), runs the engine and the sampler for every session
at once, and hands each session its verdict (:meth:`DecodingSession.commit`). That keeps
the rules that make speculation lossless testable on their own (DESIGN.md,
"Speculation invariants"):

- The cloud owns C. Each step verifies whatever valid drafts extend C (zero drafts is a
  plain decode step), so speculation can add tokens per step but never waits.
- Drafts are self-validating: a ``DraftTail`` carries the committed length the edge has
  seen (``base``) and its whole tail from there (a chain), or new nodes of a tree; a
  chain whose overlap with C disagrees is dropped as stale. What survives is kept across
  steps in the request's tree (:mod:`eventspec.cloud.speculation.draft_forest`), and each step
  verifies its likeliest path that extends C.
- A bulk commit goes through the stop rules one token at a time, so it ends at exactly
  the token where target-only decoding ends (EOS, stop string, token cap, context).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eventspec.cloud.speculation.draft_forest import DraftForest
from eventspec.cloud.speculation.sit_out import DryState
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.stops import StopMatcher
from eventspec.shared.contract.types import (
    DraftTail,
    FinishReason,
    GenerationSettings,
    RequestStats,
)


def check_tail(tail: DraftTail, *, committed_len: int, max_draft_tokens: int,
               text_vocab_size: int) -> None:
    """Raise InvalidInput for a malformed tail: the edge is broken, not merely late.

    ``committed_len`` is how much of C the stream has received; the edge can only have
    seen what was sent to it, so a larger ``base`` is an error.
    """
    if tail.base < 0 or tail.base > committed_len:
        raise InvalidInput(
            f"Drafts.base {tail.base} is outside the committed answer (length {committed_len})"
        )
    if len(tail.token_ids) > max_draft_tokens:
        raise InvalidInput(
            f"Drafts tail of {len(tail.token_ids)} tokens exceeds the cap of {max_draft_tokens}"
        )
    for tok in tail.token_ids:
        if not 0 <= tok < text_vocab_size:
            raise InvalidInput(
                f"draft token id {tok} is outside the shared text vocabulary "
                f"[0, {text_vocab_size})"
            )


@dataclass(frozen=True)
class StepInput:
    """What a session feeds the next engine step.

    ``tokens`` is C[-1] plus the drafts, written at ``start_position`` of ``slot``.
    """

    slot: int
    start_position: int
    tokens: tuple[int, ...]
    drafts: tuple[int, ...]


@dataclass(frozen=True)
class Committed:
    """What one verdict added to C (after the stop rules) and whether the request ended."""

    start: int
    tokens: tuple[int, ...]
    verified: int
    accepted: int
    finish_reason: FinishReason | None
    #: When the verdict was committed (ms on the session's clock) and how long its
    #: engine step took (0 for the prefill's first token): the request's timeline.
    at_ms: float = 0.0
    step_ms: float = 0.0


@dataclass
class Counters:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    stale: int = 0
    rejections: int = 0
    hidden_drafted: int = 0
    #: Drafts on offer when each step was assembled (before the width rule), and the
    #: steps with none: how well the edge kept ahead (issue 36).
    offered: int = 0
    dry_steps: int = 0
    #: Plans sent after the first (cloud/requests/replanning.py).
    plans_sent: int = 0
    #: Steps the session sat out, dry, while others stepped (``--sit-out``).
    sat_out: int = 0
    stage_ms: dict[str, float] = field(default_factory=dict)

    def add_stage(self, name: str, ms: float) -> None:
        self.stage_ms[name] = self.stage_ms.get(name, 0.0) + ms


class DecodingSession:
    """The committed sequence, the latest draft tail and the stop rules of one request."""

    def __init__(
        self,
        *,
        settings: GenerationSettings,
        slot: int,
        prompt_len: int,
        max_seq_len: int,
        eos_token_id: int,
        max_verify_tokens: int,
        decode: Callable[[Sequence[int]], str],
        speculative: bool,
        deadline_ms: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if prompt_len >= max_seq_len:
            raise InvalidInput(f"prompt of {prompt_len} tokens leaves no room in a slot of "
                               f"{max_seq_len} positions")
        self.settings = settings
        self.slot = slot
        self.prompt_len = prompt_len
        self.max_seq_len = max_seq_len
        self.eos_token_id = eos_token_id
        self.max_verify_tokens = max_verify_tokens
        self.speculative = speculative
        self.deadline_ms = deadline_ms
        self._decode = decode
        self._clock = clock
        self.started = clock()
        self.committed: list[int] = []
        #: The drafts kept across steps (chains and trees alike).
        self.drafts = DraftForest()
        self.finish_reason: FinishReason | None = None
        self.first_token_at: float | None = None
        self.prefilled = False
        #: Set by the engine loop: prompt positions taken from the prefix cache, and its
        #: verdict ("hit" / "miss"; "" with the cache off).
        self.prefix_reused_tokens = 0
        self.prefix_cache = ""
        self._hidden: list[int] = []
        self._stops = StopMatcher(settings.stop)
        #: Where the stop string that ended the answer starts in its text, once one did.
        self.stop_at: int | None = None
        self.counters = Counters()
        self._sat_out_last = False
        self._drafted_last = False

    # -- drafts --------------------------------------------------------------------------

    def offer_drafts(self, tail: DraftTail) -> bool:
        """Keep a (well-formed, see :func:`check_tail` and
        :class:`~eventspec.cloud.speculation.tree_checks.TreeChecks`) chain if its overlap with C
        agrees, or a tree's new nodes; True when drafts ahead of C were added."""
        if not self.speculative or self.finish_reason is not None:
            return False
        if tail.base > len(self.committed):
            return False
        if tail.nodes:
            ahead, late = self.drafts.add_nodes(tail.base, tail.nodes, self.committed)
            self.counters.stale += late
            return ahead > 0
        overlap = self.committed[tail.base :]
        if list(tail.token_ids[: len(overlap)]) != overlap[: len(tail.token_ids)]:
            self.counters.stale += 1
            return False
        if len(tail.token_ids) <= len(overlap):
            return False
        return self.drafts.add_chain(tail.base, tail.token_ids, self.committed) > 0

    def drafts_now(self) -> list[int]:
        """The valid drafts extending C now (possibly none): the likeliest path of the
        kept drafts, within the verify width and the slot's remaining positions."""
        self.drafts.sync(self.committed)
        if not self.committed:
            return self.drafts.path(1)  # the prefill's one row checks one hidden draft
        room = self.max_seq_len - self.prompt_len - len(self.committed)  # positions after C[-1]
        return self.drafts.path(max(0, min(self.max_verify_tokens - 1, room)))

    # -- the scheduler's side ------------------------------------------------------------

    def mark_prefilled(self, ms: float) -> None:
        """The prompt is in the slot; the tail held now was drafted while it ran (hidden)."""
        self.prefilled = True
        self._hidden = self.drafts.path(self.max_seq_len) if not self.committed else []
        self.counters.hidden_drafted = len(self._hidden)
        self.counters.add_stage("prefill", ms)

    def dry_state(self) -> DryState:
        """What ``--sit-out`` reads of this session when a step is planned."""
        return DryState(dry=not self.drafts_now(), speculative=self.speculative,
                        sat_out_last=self._sat_out_last, drafted_last=self._drafted_last)

    def sit_out(self) -> None:
        """This step runs without the session (``eventspec.cloud.speculation.sit_out``)."""
        self._sat_out_last = True
        self.counters.sat_out += 1

    def step_input(self) -> StepInput:
        """C[-1] and the valid drafts, at the position right after what the slot keeps."""
        if not self.committed:
            raise RuntimeError("the first token comes from the prefill's logits, not a step")
        drafts = tuple(self.drafts_now())
        self.counters.offered += len(drafts)
        self.counters.dry_steps += not drafts
        self._sat_out_last = False
        self._drafted_last = bool(drafts)
        return StepInput(
            slot=self.slot,
            start_position=self.prompt_len + len(self.committed) - 1,
            tokens=(self.committed[-1], *drafts),
            drafts=drafts,
        )

    def commit(self, accepted: int, tokens: Sequence[int], verified: int,
               ms: float) -> Committed:
        """Append a verdict's tokens to C one at a time under the stop rules.

        A bulk commit must end at exactly the token where target-only decoding (one token
        per step) would stop, so every stop rule is checked after each token.
        """
        start = len(self.committed)
        new: list[int] = []
        for tok in tokens:
            if self.finish_reason is not None:
                break
            new.append(int(tok))
            self.committed.append(int(tok))
            self.finish_reason = self._stop_after_token(int(tok))
        used = min(accepted, len(new))
        # A stop rule that fired inside the accepted drafts leaves the drafts after it
        # unused: the target agreed with them, so they are no rejection, and they are not
        # in the answer, so they are no acceptance either. They are left out of the
        # verified count; counting them would report a step that accepted fewer drafts
        # than it verified without rejecting any, which the acceptance estimate refuses.
        counted = verified if used == accepted else used
        c = self.counters
        c.drafted += counted
        c.accepted += used
        c.steps += 1
        c.rejections += used < counted
        c.add_stage("verify" if verified else "decode", ms)
        if self.first_token_at is None and new:
            self.first_token_at = self._clock()
        if self.finish_reason is None and self.deadline_passed():
            self.finish_reason = FinishReason.DEADLINE
        return Committed(start, tuple(new), counted, used, self.finish_reason, self.elapsed_ms(),
                         ms)

    def _stop_after_token(self, tok: int) -> FinishReason | None:
        """The stop rule that fires once ``tok`` is the newest committed token, if any.

        Running out of slot positions (the context limit) ends the answer like the
        token cap does, identically for speculative and target-only decoding.
        """
        if tok == self.eos_token_id:
            return FinishReason.EOS
        if self.settings.stop:
            self.stop_at = self._stops.feed(self._decode(self.committed))
            if self.stop_at is not None:
                return FinishReason.STOP_STRING
        if len(self.committed) >= self.settings.max_new_tokens:
            return FinishReason.MAX_TOKENS
        if self.prompt_len + len(self.committed) >= self.max_seq_len:
            return FinishReason.MAX_TOKENS
        return None

    def finish(self, reason: FinishReason) -> None:
        """Stop early (cancel, deadline) if not already finished."""
        if self.finish_reason is None:
            self.finish_reason = reason

    # -- reporting -----------------------------------------------------------------------

    def text(self) -> str:
        """The answer so far as a user sees it (cut before a stop string)."""
        return self.visible(self._decode(self.committed), self.finish_reason)

    def visible(self, text: str, finish: FinishReason | None) -> str:
        """``text`` (a decoded prefix of C that a Commit or Done carries) as a user sees it.

        The stop rules ran after every token, so a prefix that did not end the answer
        holds no stop string; only the one that ended it on a stop string is cut, at the
        place the matcher found, without scanning the answer again.
        """
        if finish == FinishReason.STOP_STRING and self.stop_at is not None:
            return text[: self.stop_at]
        return text

    def elapsed_ms(self) -> float:
        return (self._clock() - self.started) * 1e3

    def deadline_passed(self) -> bool:
        return self.deadline_ms > 0 and self.elapsed_ms() >= self.deadline_ms

    def stats(self, uplink_bytes: int = 0, downlink_bytes: int = 0) -> RequestStats:
        """Statistics so far, in vLLM's vocabulary."""
        hidden_accepted = 0
        for drafted, final in zip(self._hidden, self.committed, strict=False):
            if drafted != final:
                break
            hidden_accepted += 1
        c = self.counters
        hidden_accepted = min(hidden_accepted, c.accepted)
        ttft = (self.first_token_at - self.started) * 1e3 if self.first_token_at else 0.0
        return RequestStats(
            drafted=c.drafted,
            accepted=c.accepted,
            hidden_drafted=c.hidden_drafted,
            hidden_accepted=hidden_accepted,
            target_steps=c.steps,
            ttft_ms=ttft,
            total_ms=self.elapsed_ms(),
            uplink_bytes=uplink_bytes,
            downlink_bytes=downlink_bytes,
            new_tokens=len(self.committed),
            stale_drafts=c.stale,
            stage_ms=dict(c.stage_ms),
            prefix_reused_tokens=self.prefix_reused_tokens,
            prefix_cache=self.prefix_cache,
            drafts_on_offer=c.offered,
            dry_steps=c.dry_steps,
            plans_sent=c.plans_sent,
            steps_sat_out=c.sat_out,
        )
