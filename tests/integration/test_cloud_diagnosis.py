"""What the edge says of a cloud whose balanced channel failed but whose probe answers
(issue 38, item 5: every line names the real cause).

The edge's balanced channel follows the cloud's health over a watch, so just after the
cloud turns SERVING a call there can still fail UNAVAILABLE while the probe channel's
GetServerInfo answers. The diagnosis said "it answers but reports NOT_SERVING" then,
of a cloud that was ready (seen in the reliability run: the warning was the edge's
only line about a cloud that had just finished warming up). It now asks the probe
channel's health too: SERVING is ready; NOT_SERVING (a draining cloud) keeps the line.
"""

from __future__ import annotations

import pytest

from eventspec.edge.readiness import CloudState
from eventspec.edge.uplink.channel import CloudLink
from tests.support import cloud_harness as ch
from tests.support.edge_harness import shared_models

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_a_cloud_that_answers_and_is_serving_is_ready_not_a_warning() -> None:
    target, _ = shared_models()
    cloud = await ch.start_verifier(target)
    link = CloudLink(f"127.0.0.1:{cloud.port}")
    try:
        view = await link.diagnose(5.0)
        assert view.state == CloudState.READY, view
        assert cloud._host is not None
        await cloud._host.set_serving(False)  # draining: it answers, health says no
        view = await link.diagnose(5.0)
        assert view.state == CloudState.UNREACHABLE, view
        assert "answers but reports NOT_SERVING" in view.describe()
    finally:
        await link.close()
        await cloud.stop(0)
