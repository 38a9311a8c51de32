"""The batched sampler: accept or reject every session's drafts in one call, on the device.

Row layout: each session owns ``rows`` consecutive rows of the logits; row ``j`` of a
session is the target's distribution of the token after its committed sequence plus
``drafts[:j]``. With ``rows > len(drafts)`` the last row gives a bonus token; right after
a prefill a session has one row and may check one hidden draft with it, without bonus.

- **Greedy** (temperature 0): the argmax of every row is taken on the device, compared
  with the drafts on the device, and only the padded argmax ids and the accepted counts
  are copied to the host, never the [k+1, V] float32 rows. ``argmax`` returns the first
  maximal index, as ``generate`` does, so output equals target-only greedy decoding.
- **Sampling** (temperature > 0, optional top-p): rejection sampling vectorised over
  the batch (Leviathan, Kalman, Matias, "Fast Inference from Transformers via
  Speculative Decoding", ICML 2023, Alg. 1; Chen et al., "Accelerating Large Language
  Model Decoding with Speculative Sampling", 2023, Alg. 2). The edge drafts greedily, so
  q is one-hot at the draft x: accept x with probability p(x); on rejection sample from
  p with x removed and renormalised; after all drafts, a bonus sample from the next row.
  Each request has its own seeded generator on the device, from which it draws
  ``len(drafts) + 1`` uniforms per step (acceptance tests, then one inverse-CDF draw),
  so a request's samples replay from its seed when its drafts arrive at the same steps.

**One wait per call** (:meth:`BatchedSampler.launch`): the small index arrays go to the
device through pinned memory without a host sync, so every kernel of the call queues
behind the engine step that made the logits, and the verdicts come back in one
asynchronous copy that :meth:`PendingVerdicts.result` waits for. The engine loop
launches the sampler right after the step and does its other host work before the
wait (vLLM V1 overlaps its host work with the forward the same way). Before, the first
index copy (pageable) waited for the step, and the sampler's launches came after it,
with the device idle: about 0.23 ms a step at one session on an H200
(``tools/pyspy_steps.py`` over a ``py-spy`` profile of ``bench_load``;
docs/results/load-gpu.md).

Ids at or above ``text_vocab_size`` (``<image>``, ``<video>``, padding) are never
chosen: both paths read only the text columns of the logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from eventspec.shared.contract.errors import InvalidInput


@dataclass(frozen=True)
class SampleSpec:
    """One session's share of a sampler call."""

    rows: int  # consecutive logits rows, >= 1
    drafts: Sequence[int]  # len <= rows; drafts[j] is checked against row j
    temperature: float = 0.0
    top_p: float = 1.0
    generator: torch.Generator | None = None  # on the logits' device; needed when T > 0


@dataclass(frozen=True)
class Verdict:
    """``accepted`` drafts were kept; ``tokens`` is them plus the correction or bonus."""

    accepted: int
    tokens: list[int]


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-request generator on ``device``, so its samples replay from its seed alone."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return generator


_Finish = Callable[[list[list[int]]], list[Verdict]]


class _HostRows:
    """A small device tensor on its way to the host: on CUDA an asynchronous copy into
    pinned memory and an event; :meth:`tolist` waits for that event alone."""

    def __init__(self, rows: torch.Tensor) -> None:
        self._event: Any = None
        if rows.device.type == "cuda":
            self._host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
            self._host.copy_(rows, non_blocking=True)
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._event.record()
        else:
            self._host = rows

    def tolist(self) -> list[list[int]]:
        if self._event is not None:
            self._event.synchronize()
        rows: list[list[int]] = self._host.tolist()
        return rows


class PendingVerdicts:
    """A sampler call whose device work is queued; :meth:`result` waits for it, once."""

    def __init__(self, parts: Sequence[tuple[Sequence[int], _HostRows, _Finish]],
                 count: int) -> None:
        self._parts = parts  # (spec indices, their rows on the way, how rows become verdicts)
        self._count = count

    def result(self) -> list[Verdict]:
        """One Verdict per spec, in the specs' order."""
        verdicts: list[Verdict | None] = [None] * self._count
        for indices, rows, finish in self._parts:
            for i, v in zip(indices, finish(rows.tolist()), strict=True):
                verdicts[i] = v
        return [v for v in verdicts if v is not None]


class BatchedSampler:
    """Greedy acceptance and rejection sampling over a whole batch of sessions."""

    def __init__(self, text_vocab_size: int) -> None:
        if text_vocab_size < 1:
            raise InvalidInput(f"text_vocab_size must be >= 1, got {text_vocab_size}")
        self.text_vocab_size = text_vocab_size

    def __call__(self, logits: torch.Tensor, specs: Sequence[SampleSpec]) -> list[Verdict]:
        """logits [N, V] float32 (N = sum of rows), on any device -> one Verdict per spec."""
        return self.launch(logits, specs).result()

    def launch(self, logits: torch.Tensor, specs: Sequence[SampleSpec]) -> PendingVerdicts:
        """Queue the call's device work behind whatever made ``logits`` (no host sync);
        the specs are checked first, before any device work."""
        starts = self._check(logits, specs)
        text = logits[:, : self.text_vocab_size]  # [N, Vt] view: non-text ids never win
        parts = []
        for temperature_zero, part in ((True, self._greedy), (False, self._sample)):
            indices = [i for i, s in enumerate(specs) if (s.temperature == 0) == temperature_zero]
            if indices:
                rows, finish = part(text, [specs[i] for i in indices],
                                    [starts[i] for i in indices])
                parts.append((indices, rows, finish))
        return PendingVerdicts(parts, len(specs))

    # -- greedy --------------------------------------------------------------------------

    def _greedy(self, text: torch.Tensor, specs: Sequence[SampleSpec],
                starts: Sequence[int]) -> tuple[_HostRows, _Finish]:
        device = text.device
        width = max(s.rows for s in specs)
        rows, drafts = _padded_rows_and_drafts(specs, starts, width, device)  # [B, W] each
        best = text.argmax(dim=-1)[rows]  # [B, W] argmax id of each session's rows
        match = best == drafts  # [B, W]; padding (-1) never matches
        accepted = match.long().cumprod(dim=1).sum(dim=1)  # [B]
        host = _HostRows(torch.cat([accepted.unsqueeze(1), best], dim=1))  # [B, 1+W]

        def finish(rows: list[list[int]]) -> list[Verdict]:
            out = []
            for spec, (a, *ids) in zip(specs, rows, strict=True):
                tokens = [int(d) for d in spec.drafts[:a]]
                if a < spec.rows:
                    tokens.append(int(ids[a]))  # correction (a < len(drafts)) or bonus
                out.append(Verdict(int(a), tokens))
            return out

        return host, finish

    # -- rejection sampling --------------------------------------------------------------

    def _sample(self, text: torch.Tensor, specs: Sequence[SampleSpec],
                starts: Sequence[int]) -> tuple[_HostRows, _Finish]:
        device = text.device
        width = max(s.rows for s in specs)
        rows, drafts = _padded_rows_and_drafts(specs, starts, width, device)  # [B, W]
        n_drafts, n_rows = _to_device([[len(s.drafts) for s in specs],
                                       [s.rows for s in specs]], torch.long, device)  # [B] each
        temps, top_ps = _to_device([[s.temperature for s in specs],
                                    [s.top_p if s.top_p < 1.0 else 2.0 for s in specs]],
                                   torch.float32, device)  # [B]; top-p 2.0: no nucleus, exactly
        flat_rows = rows.reshape(-1)  # [B*W]
        probs = nucleus(
            text[flat_rows].float() / temps.repeat_interleave(width).unsqueeze(1),
            top_ps.repeat_interleave(width),
        ).view(len(specs), width, -1)  # [B, W, Vt]
        uniforms = torch.stack([_uniforms(s, width + 1, device) for s in specs])  # [B, W+1]

        valid = drafts >= 0  # [B, W]
        x = drafts.clamp(min=0)  # [B, W]
        p_x = probs.gather(2, x.unsqueeze(2)).squeeze(2)  # [B, W]
        only_x = ((probs > 0).sum(dim=2) == 1) & (p_x > 0)  # [B, W]: nothing else to pick
        accept = valid & ((uniforms[:, :width] < p_x) | only_x)  # [B, W]
        accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [B]

        at = accepted.clamp(max=width - 1)  # [B] row of the correction / bonus
        dist = probs.gather(1, at.view(-1, 1, 1).expand(-1, 1, probs.shape[2])).squeeze(1)
        rejected = accepted < n_drafts  # [B]
        dist = self._residual(dist, x.gather(1, at.unsqueeze(1)), rejected)  # [B, Vt]
        cdf = dist.cumsum(dim=1)  # [B, Vt]
        target = uniforms[:, width:] * cdf[:, -1:]  # [B, 1]
        drawn = torch.searchsorted(cdf, target, right=True).clamp(max=cdf.shape[1] - 1)  # [B,1]
        emits = accepted < n_rows  # [B]
        host = _HostRows(torch.stack([accepted, drawn.squeeze(1), emits.long()], dim=1))  # [B, 3]

        def finish(rows: list[list[int]]) -> list[Verdict]:
            out = []
            for spec, (a, tok, emit) in zip(specs, rows, strict=True):
                tokens = [int(d) for d in spec.drafts[:a]]
                if emit:
                    tokens.append(int(tok))
                out.append(Verdict(int(a), tokens))
            return out

        return host, finish

    @staticmethod
    def _residual(dist: torch.Tensor, draft: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
        """norm(max(0, p - q)) with one-hot q: p with the rejected draft removed.

        dist [B, Vt] (unnormalised is fine: the inverse-CDF draw scales by the total),
        draft [B, 1], rejected [B]; rows that were not rejected are returned unchanged.
        """
        keep = torch.where(rejected.unsqueeze(1), 0.0, dist.gather(1, draft))  # [B, 1]
        return dist.scatter(1, draft, keep)  # [B, Vt]

    # -- checks --------------------------------------------------------------------------

    def _check(self, logits: torch.Tensor, specs: Sequence[SampleSpec]) -> list[int]:
        if logits.dim() != 2 or logits.shape[1] < self.text_vocab_size:
            raise InvalidInput(
                f"logits must be [N, V >= {self.text_vocab_size}], got {list(logits.shape)}"
            )
        starts, offset = [], 0
        for i, s in enumerate(specs):
            if s.rows < 1 or len(s.drafts) > s.rows:
                raise InvalidInput(
                    f"spec {i}: rows must be >= 1 and >= len(drafts), got {s.rows} rows for "
                    f"{len(s.drafts)} drafts"
                )
            if any(not 0 <= int(d) < self.text_vocab_size for d in s.drafts):
                raise InvalidInput(f"spec {i}: draft ids must be text ids below "
                                   f"{self.text_vocab_size}")
            if s.temperature < 0 or not 0 < s.top_p <= 1:
                raise InvalidInput(f"spec {i}: temperature must be >= 0 and top_p in (0, 1]")
            if s.temperature > 0 and s.generator is None:
                raise InvalidInput(f"spec {i}: sampling needs a generator")
            starts.append(offset)
            offset += s.rows
        if offset != logits.shape[0]:
            raise InvalidInput(f"specs cover {offset} rows, logits have {logits.shape[0]}")
        return starts


def _to_device(lists: Sequence[Sequence[float]], dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """Equal-length host lists as one [len(lists), n] tensor on ``device``: on CUDA
    through pinned memory without a host sync (a pageable copy would wait for every
    kernel queued before it). The caching host allocator keeps the pinned block until
    the copy has run."""
    host = torch.tensor(lists, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _padded_rows_and_drafts(
    specs: Sequence[SampleSpec], starts: Sequence[int], width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat row index [B, W] (padding repeats the session's last row) and drafts [B, W]
    (padding -1), built on the host from small lists and moved in one copy."""
    rows = [[st + min(j, s.rows - 1) for j in range(width)] for s, st in zip(specs, starts,
                                                                               strict=True)]
    drafts = [[int(d) for d in s.drafts] + [-1] * (width - len(s.drafts)) for s in specs]
    both = _to_device([*rows, *drafts], torch.long, device)  # [2 B, W]
    return both[: len(specs)], both[len(specs):]


def _uniforms(spec: SampleSpec, n: int, device: torch.device) -> torch.Tensor:
    """``len(drafts)`` acceptance uniforms, then padding, with the inverse-CDF draw last.

    Only ``len(drafts) + 1`` values are drawn from the request's generator, so the
    stream it consumes depends on its own drafts alone, not on the batch it ran in.
    """
    assert spec.generator is not None
    k = len(spec.drafts)
    drawn = torch.rand(k + 1, generator=spec.generator, device=device)  # [k+1]
    out = torch.ones(n, device=device)  # [n]; padding rows are never valid
    out[:k] = drawn[:k]
    out[-1] = drawn[k]
    return out


def nucleus(scaled: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """softmax(scaled) [M, Vt], then top-p per row (``top_p`` [M]; > 1 keeps every id).

    The sampler draws from this (tests compute exact distributions with it). The
    nucleus keeps the most probable ids until their mass reaches ``top_p``, and always
    the most probable id (ties by id, via a stable sort), then renormalises.
    """
    probs = torch.softmax(scaled, dim=-1)  # [M, Vt]
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # [M, Vt]
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # [M, Vt]
    drop = mass_before >= top_p.unsqueeze(1)  # [M, Vt]
    drop[:, 0] = False
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    return kept / kept.sum(dim=-1, keepdim=True)  # [M, Vt]
