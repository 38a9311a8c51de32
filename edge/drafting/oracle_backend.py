"""The oracle drafter: for benchmarks only, never for answers anyone reads.

Why: the end-to-end benchmark (issue 26) must separate what the system costs from what
the drafter's quality gives. The oracle drafts the target-only answer of the same
request (precomputed by the benchmark, asking the same stack with mode target_only),
each token wrong with probability 1 - α, at a given pace: the real drafter's measured
ms per token (bf16 / int8 / int4, README "The edge's drafter on a GPU") or any c. Then
the achieved speedup can be held against the reference model
(``tests/support/spec_model.py``), whose drafts are exactly this: right i.i.d. with
probability α against one fixed true answer.

How it knows the request: by the question text given to ``prefill``. The benchmark asks
every question once per mode, so questions are unique per request; the answers file maps
each question to the target-only token ids (EOS included when the answer ended there).
A question the file lacks (the edge's calibration asks "What is moving?") drafts
arbitrary ids (never EOS), right only by chance, and a WARNING names the question once
(INFO for the calibration's own question), so a benchmark that forgot a question sees
it in the edge's log and in a near-zero acceptance.

Position p (0-based: the answer's p-th token) is drafted from a coin that depends only
on (seed, question, p): right with probability α -> ``answer[p]``; wrong -> another id
of the text vocabulary, never EOS and never ``answer[p]``. So re-drafting a position
after a rollback gives the same token, whatever the context (drafts after a wrong one
are stale anyway: the cloud rejects from the first wrong draft). Past the answer's end
every draft is wrong.

Pacing: every ``step`` call (one forward, however many tokens it feeds: a refeed after
a Commit is one forward on a GPU too) takes at least ``ms_per_token``, and ``prefill``
at least ``prefill_ms``; the edge's model thread waits (``time.sleep`` up to a deadline,
so never less, possibly a little more on a busy machine).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eventspec.shared.contract.errors import InvalidInput

log = logging.getLogger(__name__)

#: The label every output of an oracle run carries.
BENCHMARKS_ONLY = "benchmarks only"
#: The question the edge's calibration drafts (``eventspec.edge.calibration``): missing
#: from every answers file, logged at INFO rather than WARNING.
CALIBRATION_QUESTION = "What is moving?"
#: Logit of every id but the drafted one (finite, so softmax and entropy stay defined).
OFF_LOGIT = -1.0e4


@dataclass(frozen=True)
class OracleSettings:
    """What the oracle drafts and how fast: ``alpha`` in [0, 1], ms >= 0."""

    answers: Mapping[str, tuple[int, ...]]
    alpha: float
    ms_per_token: float
    prefill_ms: float
    seed: int = 0
    #: Draft trees (issue 36): the oracle expands several nodes per forward into its
    #: top-k; where its top-1 is wrong, the true token is among the other k - 1 with
    #: probability ``coverage`` (q). 0: chains only.
    coverage: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and 0.0 <= self.alpha <= 1.0):
            raise InvalidInput(f"--oracle-alpha must be in [0, 1], got {self.alpha!r}")
        if not (math.isfinite(self.coverage) and 0.0 <= self.coverage <= 1.0):
            raise InvalidInput(f"--oracle-coverage must be in [0, 1], got {self.coverage!r}")
        for flag, value in (("--oracle-ms-per-token", self.ms_per_token),
                            ("--oracle-prefill-ms", self.prefill_ms)):
            if not (math.isfinite(value) and value >= 0):
                raise InvalidInput(f"{flag} must be finite and >= 0, got {value!r}")

    def label(self) -> str:
        """E.g. "oracle α=0.8, 4.68 ms/token, prefill 36.1 ms — benchmarks only"."""
        trees = f", trees q={self.coverage:g}" if self.coverage > 0 else ""
        return (f"oracle α={self.alpha:g}{trees}, {self.ms_per_token:g} ms/token, prefill "
                f"{self.prefill_ms:g} ms — {BENCHMARKS_ONLY}")


def load_answers(path: Path) -> dict[str, tuple[int, ...]]:
    """``--oracle-answers FILE``: a JSON object, question -> list of token ids.

    Refused with the file and the offending question named when it is not one.
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"--oracle-answers {path}: cannot read it as JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidInput(f"--oracle-answers {path}: expected an object question -> "
                           f"token ids, got {type(raw).__name__}")
    answers: dict[str, tuple[int, ...]] = {}
    for question, ids in raw.items():
        if not (isinstance(ids, list) and all(isinstance(t, int) and t >= 0 for t in ids)):
            raise InvalidInput(f"--oracle-answers {path}: the answer to {question!r} must "
                               "be a list of token ids >= 0")
        answers[question] = tuple(ids)
    return answers


@dataclass
class OracleState:
    """One request: its question and answer, and how many tokens were fed after the
    prompt (the draft position is that length)."""

    question: str
    answer: tuple[int, ...] | None
    fed: int = 0
    prompt_len: int = 1  # a nominal prompt position, so rollback's arithmetic holds


def _pace(start: float, ms: float) -> None:
    """Wait until ``ms`` after ``start`` (perf_counter): never less."""
    end = start + ms / 1e3
    while (left := end - time.perf_counter()) > 0:
        time.sleep(left)


@dataclass
class OracleDraftBackend:
    """``DraftBackend`` (:mod:`eventspec.edge.drafting.cache`) that drafts a known answer."""

    settings: OracleSettings
    text_vocab_size: int
    eos_token_id: int
    _missing: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.text_vocab_size < 3:
            raise InvalidInput("the oracle needs a text vocabulary of at least 3 ids")
        for question, ids in self.settings.answers.items():
            bad = [t for t in ids if t >= self.text_vocab_size]
            if bad:
                raise InvalidInput(f"--oracle-answers: the answer to {question!r} has ids "
                                   f"outside the text vocabulary ({bad[:5]})")

    @property
    def name(self) -> str:
        return self.settings.label()

    def prefill(
        self, question: str, pixel_values: torch.Tensor | None, *,
        clip_features: torch.Tensor | None = None,
    ) -> tuple[OracleState, torch.Tensor]:
        """No model: the request's answer looked up by its question, paced."""
        start = time.perf_counter()
        answer = self.settings.answers.get(question)
        if answer is None and question not in self._missing:
            self._missing.add(question)
            log.log(logging.INFO if question == CALIBRATION_QUESTION else logging.WARNING,
                    "oracle drafter: no answer for question %r: its drafts are arbitrary ids",
                    question)
        state = OracleState(question, answer)
        row = self._row(self.draft_token(state, 0))
        _pace(start, self.settings.prefill_ms)
        return state, row

    def step(self, state: OracleState, tokens: Sequence[int]) -> torch.Tensor:
        """Feed ``tokens`` -> rows [len(tokens), V]: row j drafts the position after
        ``fed + j + 1`` tokens. One forward: paced once."""
        start = time.perf_counter()
        if not tokens:
            raise InvalidInput("step needs at least one token")
        rows = torch.stack([self._row(self.draft_token(state, state.fed + j + 1))
                            for j in range(len(tokens))])  # [k, V]
        state.fed += len(tokens)
        _pace(start, self.settings.ms_per_token)
        return rows

    def step_many(self, items: Sequence[tuple[OracleState, Sequence[int]]]
                  ) -> list[torch.Tensor]:
        """:meth:`step` for several sessions in one forward, paced once: a memory-bound
        drafter reads its weights once for every session's rows (issue 36)."""
        start = time.perf_counter()
        out = []
        for state, tokens in items:
            if not tokens:
                raise InvalidInput("step needs at least one token")
            out.append(torch.stack([self._row(self.draft_token(state, state.fed + j + 1))
                                    for j in range(len(tokens))]))  # [k, V]
            state.fed += len(tokens)
        _pace(start, self.settings.ms_per_token)
        return out

    def rollback(self, state: OracleState, keep_len: int) -> None:
        if not state.prompt_len <= keep_len <= state.prompt_len + state.fed:
            raise InvalidInput(f"rollback to {keep_len} outside {state.prompt_len}.."
                               f"{state.prompt_len + state.fed}")
        state.fed = keep_len - state.prompt_len

    def seq_len(self, state: OracleState) -> int:
        return state.prompt_len + state.fed

    def greedy_next(self, logits_row: torch.Tensor) -> int:
        return int(torch.argmax(logits_row[..., : self.text_vocab_size], dim=-1))

    # -- the draws ------------------------------------------------------------------------

    def draft_token(self, state: OracleState, position: int) -> int:
        """The oracle's draft for answer position ``position`` of this request."""
        answer = state.answer
        u, pick = self._draw(state.question, position)
        if answer is not None and position < len(answer) and u < self.settings.alpha:
            return answer[position]
        right = answer[position] if answer is not None and position < len(answer) else None
        avoid = sorted({self.eos_token_id, *([] if right is None else [right])})
        token = pick % (self.text_vocab_size - len(avoid))
        for skipped in avoid:  # map onto the ids left once ``avoid`` is removed
            if token >= skipped:
                token += 1
        return token

    @property
    def expands_trees(self) -> bool:
        """Whether it drafts trees (``--oracle-coverage`` > 0); q = 0 keeps chains, the
        control of issue 36."""
        return self.settings.coverage > 0

    def expand(self, state: OracleState, contexts: Sequence[Sequence[int]], k: int
               ) -> list[list[tuple[int, float]]]:
        """Top-``k`` children after each context (answer tokens after the prompt), in one
        paced forward (a memory-bound drafter reads its weights once for a few rows).

        Rank 1 is the chain's draft for that position (right with probability α).
        Where the context is the true answer so far and rank 1 is wrong, the true token
        sits at a random rank 2..k with probability q; the other ranks are arbitrary ids
        (never EOS). The log-probabilities are a calibrated drafter's: log α for rank 1,
        log((1 - α) / (k - 1)) for each other rank, whatever the truth."""
        start = time.perf_counter()
        k = max(1, k)
        alpha = min(max(self.settings.alpha, 1e-6), 1 - 1e-6)
        lp_top, lp_other = math.log(alpha), math.log((1 - alpha) / max(k - 1, 1))
        out = [self._children(state, [int(t) for t in ctx], k, lp_top, lp_other)
               for ctx in contexts]
        _pace(start, self.settings.ms_per_token)
        return out

    def expand_many(self, items: Sequence[tuple[OracleState, Sequence[Sequence[int]], int]]
                    ) -> list[list[list[tuple[int, float]]]]:
        """:meth:`expand` for several sessions' trees in one paced forward."""
        start = time.perf_counter()
        alpha = min(max(self.settings.alpha, 1e-6), 1 - 1e-6)
        out = []
        for state, contexts, k in items:
            k = max(1, k)
            lp_top, lp_other = math.log(alpha), math.log((1 - alpha) / max(k - 1, 1))
            out.append([self._children(state, [int(t) for t in ctx], k, lp_top, lp_other)
                        for ctx in contexts])
        _pace(start, self.settings.ms_per_token)
        return out

    def _children(self, state: OracleState, ctx: list[int], k: int, lp_top: float,
                  lp_other: float) -> list[tuple[int, float]]:
        p, answer = len(ctx), state.answer
        top = self.draft_token(state, p)
        tokens = [top]
        on_truth = answer is not None and p < len(answer) and tuple(ctx) == answer[:p]
        truth = answer[p] if on_truth and answer is not None else None
        covered = (truth is not None and truth != top and k > 1
                   and self._draw(state.question, p, "cover")[0] < self.settings.coverage)
        rank = 1 + self._draw(state.question, p, "rank")[1] % (k - 1) if covered else -1
        taken = {top, self.eos_token_id, *([] if truth is None else [truth])}
        for r in range(1, min(k, self.text_vocab_size - 2)):
            if r == rank:
                assert truth is not None
                tokens.append(truth)
                continue
            tok = self._draw(state.question, p, f"other{r}")[1] % self.text_vocab_size
            while tok in taken:
                tok = (tok + 1) % self.text_vocab_size
            taken.add(tok)
            tokens.append(tok)
        return [(t, lp_top if i == 0 else lp_other) for i, t in enumerate(tokens)]

    def _draw(self, question: str, position: int, purpose: str = "") -> tuple[float, int]:
        """(u in [0, 1), an integer) from (seed, question, position[, purpose]) alone."""
        salt = f"\0{purpose}" if purpose else ""
        digest = hashlib.blake2b(f"{self.settings.seed}\0{question}\0{position}{salt}".encode(),
                                 digest_size=16).digest()
        u = int.from_bytes(digest[:8], "little") / 2.0**64
        return u, int.from_bytes(digest[8:], "little")

    def _row(self, token: int) -> torch.Tensor:
        row = torch.full((self.text_vocab_size,), OFF_LOGIT, dtype=torch.float32)  # [V]
        row[token] = 0.0
        return row


def oracle_backend(settings: OracleSettings, *, text_vocab_size: int,
                   eos_token_id: int) -> OracleDraftBackend:
    """The oracle for ``--draft-engine oracle``; logs its label (benchmarks only)."""
    backend = OracleDraftBackend(settings, text_vocab_size, eos_token_id)
    log.warning("drafting with the %s: it drafts precomputed target answers (%d questions)",
                backend.name, len(settings.answers))
    return backend
