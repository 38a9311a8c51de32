"""Draft trees over real gRPC (issue 36): the limits are advertised; a tree sent during
the prefill whose likeliest branch is wrong still pays, because the target's correction
is a branch the edge drafted and the cloud continues down it with no further message;
a malformed tree is INVALID_ARGUMENT naming the field, and the server keeps serving."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio

from eventspec.cloud.server import VerifierServer
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.convert_verifier import drafts_to_pb
from eventspec.shared.contract.types import ROOT, DraftNode, DraftTail
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from tests.support import cloud_harness as h

pytestmark = pytest.mark.asyncio

Q, N = "What is moving?", 12


def tree_msg(*nodes: DraftNode, base: int = 0) -> verifier_pb2.EdgeMessage:
    return verifier_pb2.EdgeMessage(drafts=drafts_to_pb(DraftTail(base, (), nodes=nodes)))


async def test_a_drafted_correction_pays_and_a_bad_tree_names_its_field() -> None:
    target = build_tiny_random_target(seed=0)
    server: VerifierServer = await h.start_verifier(target)
    try:
        frames = h.make_frames(1)
        truth = h.target_greedy(target, Q, frames, N)
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            info = await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
                verifier_pb2.GetServerInfoRequest(), timeout=10)
        assert info.limits.max_tree_nodes > 0 and info.limits.max_tree_depth > 0
        wrong = (truth[0] + 1) % 500
        nodes = [DraftNode(0, ROOT, wrong, -0.1),  # the likeliest guess, wrong
                 DraftNode(1, ROOT, truth[0], -2.0)]  # the runner-up, right
        for i, tok in enumerate(truth[1:8], start=2):  # the truth under the runner-up
            nodes.append(DraftNode(i, i - 1, tok, -0.3))
        out = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=N),
                                   extra=[tree_msg(*nodes)])
        assert out.tokens == truth
        assert out.done.stats.accepted >= 6, "the runner-up's branch was verified"
        bad = tree_msg(DraftNode(0, ROOT, truth[0]), DraftNode(1, 5, truth[1]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=N),
                                 extra=[bad])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Drafts.node_parents[1] 5" in (err.value.details() or "")
        as_messages = verifier_pb2.EdgeMessage(drafts=verifier_pb2.Drafts(base=0, nodes=[
            verifier_pb2.DraftNode(id=0, parent=ROOT, token_id=truth[0]),
            verifier_pb2.DraftNode(id=1, parent=5, token_id=truth[1])]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=N),
                                 extra=[as_messages])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Drafts.nodes[1].parent 5" in (err.value.details() or "")
        ragged = tree_msg(DraftNode(0, ROOT, truth[0]), DraftNode(1, 0, truth[1]))
        ragged.drafts.node_tokens.pop()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=N),
                                 extra=[ragged])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Drafts.node_tokens has 1 entries" in (err.value.details() or "")
        again = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=N))
        assert again.tokens == truth
    finally:
        await server.stop()
