"""The sampler on CUDA (``make test-gpu``): its work queues behind the step that made
the logits, with no host wait until ``result``, and gives the synchronous call's
verdicts."""

from __future__ import annotations

import pytest
import torch

from eventspec.cloud.scheduling.sampler import BatchedSampler, SampleSpec, make_generator

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

V = 64


def _specs(device: torch.device) -> list[SampleSpec]:
    return [SampleSpec(3, [5, 9]), SampleSpec(1, []),
            SampleSpec(2, [4], 0.7, 0.9, make_generator(1, device)), SampleSpec(4, [1, 2, 3])]


def test_a_launch_returns_while_the_step_before_it_still_runs() -> None:
    device = torch.device("cuda")
    logits = torch.randn(10, V, device=device)  # [N, V]
    sampler = BatchedSampler(V)
    want = sampler(logits, _specs(device))
    torch.cuda._sleep(1_000_000)  # lazy set-up, untimed
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    torch.cuda._sleep(200_000_000)  # "the step": some 100 ms of device work
    pending = sampler.launch(logits, _specs(device))
    assert not stream.query(), "the launch waited for the work queued before it"
    assert pending.result() == want
    assert stream.query()
