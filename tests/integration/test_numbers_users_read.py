"""Numbers users read (issue 38, item 7): the RTT the plan uses is the network's, not
the cloud's time to answer GetServerInfo.

Before, the edge timed GetServerInfo: the first call set up the connection and a cloud
whose loop was busy answered late, so a loopback link read 142 ms and 308 ms and the
plan priced every step with it. Here the cloud takes 300 ms to answer GetServerInfo;
the RTT must stay far below that (a bound with a wide margin, not a timing claim).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from eventspec.cloud.servicer import VerifierServicer
from tests.support import edge_harness as eh

SLOW_INFO_S = 0.3


async def test_the_rtt_excludes_the_clouds_processing(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = VerifierServicer.GetServerInfo

    async def slow(self: VerifierServicer, request: Any, context: Any) -> Any:
        await asyncio.sleep(SLOW_INFO_S)
        return await answer(self, request, context)

    monkeypatch.setattr(VerifierServicer, "GetServerInfo", slow)
    stack = await eh.start_stack()
    try:
        agent = stack.edge.agent
        assert agent is not None and agent.link is not None
        assert agent.link.rtt.samples >= 1
        assert 0 < agent.link.rtt.value < SLOW_INFO_S * 1e3 / 3, agent.link.rtt.value
    finally:
        await stack.stop()
