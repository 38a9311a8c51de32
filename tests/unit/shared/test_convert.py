"""pb <-> domain round trips for every message the nodes exchange."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.shared.contract import convert, convert_ask, convert_verifier
from eventspec.shared.contract.codec import encode_tensor
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timing import CloudCost, EdgeCost, TimingPlan
from eventspec.shared.contract.types import (
    AlignedSpec,
    AskSpec,
    CancelRequest,
    CommitEvent,
    CommittedEvent,
    DoneEvent,
    DraftNode,
    DraftTail,
    FeatureMode,
    FinalEvent,
    FinishReason,
    GenerationSettings,
    Mode,
    OpenRequest,
    PreviewEvent,
    RequestStats,
    ServerInfo,
    ServerLimits,
    TensorChunkData,
    VisualGeometry,
    WindowInfo,
)
from eventspec.shared.contract.verifier_stats import StepKindTimes, VerifierStats
from eventspec.shared.pb.eventspec.v1 import edge_pb2, verifier_pb2

PLAN = TimingPlan(True, 27, 4, 2, False, 0.6, 568.0, 30.0, 1.4, "because")
STATS = RequestStats(drafted=10, accepted=7, hidden_drafted=5, hidden_accepted=3,
                     target_steps=4, ttft_ms=12.5, total_ms=99.0, uplink_bytes=1000,
                     downlink_bytes=200, new_tokens=11, stale_drafts=1,
                     stage_ms={"prefill": 50.0}, prefix_reused_tokens=2103, prefix_cache="hit",
                     drafts_on_offer=9, dry_steps=2, tree_nodes_sent=40, tree_nodes_pruned=25,
                     tree_branch_hits=3, draft_forward_ms=31.5)
EDGE_COST = EdgeCost(66.0, 18.5, 3.0, 1e6, 0.5)


@pytest.mark.parametrize(
    "msg",
    [
        OpenRequest("r1", "What?", GenerationSettings(32, 0.7, 0.9, 5, ("END",)),
                    frames=(b"a", b"bc"), edge_cost=EDGE_COST, deadline_ms=500),
        OpenRequest("r2", "Q", GenerationSettings(), aligned=AlignedSpec("float16", (8, 17, 32)),
                    speculative=False),
        DraftTail(3, (1, 2, 3), 4.5),
        CancelRequest("bye"),
        TensorChunkData("video_features", 2, b"\x00\x01"),
        encode_tensor("video_features", np.ones((2, 3), dtype=np.float32))[0],
    ],
)
def test_edge_messages_round_trip(msg: object) -> None:
    pb = convert_verifier.edge_message_to_pb(msg)  # type: ignore[arg-type]
    back = convert_verifier.edge_message_from_pb(
        verifier_pb2.EdgeMessage.FromString(pb.SerializeToString())
    )
    assert back == msg


@pytest.mark.parametrize(
    "msg",
    [
        PLAN,
        CommitEvent(4, (9, 10), 3, 1, "hello", 12.0),
        DoneEvent(FinishReason.EOS, (1, 2, 2), "hi", STATS, PLAN),
        DoneEvent(FinishReason.CANCELLED, (), "", RequestStats(), None),
    ],
)
def test_cloud_messages_round_trip(msg: object) -> None:
    pb = convert_verifier.cloud_message_to_pb(msg)  # type: ignore[arg-type]
    back = convert_verifier.cloud_message_from_pb(
        verifier_pb2.CloudMessage.FromString(pb.SerializeToString())
    )
    assert back == msg


def test_server_info_round_trip() -> None:
    info = ServerInfo("m", 576, 512, "ab" * 32, 2, VisualGeometry(8, 17, 32, 32),
                      (FeatureMode.FRAMES, FeatureMode.ALIGNED),
                      CloudCost(1.0, 0.1, 0.2, 3.0, 0.05, "cpu"), ServerLimits(), 40)
    assert convert_verifier.server_info_from_pb(convert_verifier.server_info_to_pb(info)) == info


_KIND_TIMES = st.builds(StepKindTimes, kind=st.sampled_from(["plain", "piece", "multi"]),
                        steps=st.integers(0, 10**9),
                        device_ms_p50=st.floats(0, 1e4), device_ms_p99=st.floats(0, 1e4),
                        gap_ms_p50=st.floats(0, 1e4), gap_ms_p99=st.floats(0, 1e4),
                        gaps_in_tail=st.integers(0, 10**9))


@given(kinds=st.lists(_KIND_TIMES, max_size=8),
       principals=st.dictionaries(st.text(min_size=1, max_size=8), st.integers(0, 99),
                                  max_size=3))
def test_verifier_stats_round_trip_with_steps_by_kind(
        kinds: list[StepKindTimes], principals: dict[str, int]) -> None:
    stats = VerifierStats("serving", "m", live_sessions=3,
                          engine_steps=sum(k.steps for k in kinds),
                          sessions_by_principal=principals,
                          prefill="chunks: slack 1.5, pace 200 ms", step_kinds=tuple(kinds))
    pb = convert_verifier.verifier_stats_to_pb(stats)
    assert [k.kind for k in pb.step_kinds] == [k.kind for k in kinds]
    assert convert_verifier.verifier_stats_from_pb(pb) == stats


@pytest.mark.parametrize(
    "event",
    [
        PreviewEvent(2, (5, 6), "ab"),
        CommittedEvent(0, (5,), "a"),
        FinalEvent("ans", (1, 2), Mode.SPECULATIVE, FeatureMode.FRAMES, FinishReason.MAX_TOKENS,
                   STATS, PLAN, WindowInfo(0, 10, 5, 10, 99)),
        FinalEvent("x", (), Mode.DRAFT_ONLY, None, FinishReason.EOS, RequestStats(), None, None),
    ],
)
def test_ask_events_round_trip(event: object) -> None:
    pb = convert_ask.ask_event_to_pb(event)  # type: ignore[arg-type]
    assert convert_ask.ask_event_from_pb(edge_pb2.AskResponse.FromString(pb.SerializeToString())) \
        == event


@pytest.mark.parametrize(
    "spec",
    [
        AskSpec("q"),
        AskSpec("q", latest_ms=None, t0_us=5, t1_us=900, event_window_ms=30,
                mode=Mode.TARGET_ONLY, feature_mode=FeatureMode.ALIGNED, jpeg_quality=70,
                generation=GenerationSettings(10, 0.5, 0.8, 3, ("x",))),
    ],
)
def test_ask_spec_round_trip(spec: AskSpec) -> None:
    assert convert_ask.ask_spec_from_pb(convert_ask.ask_spec_to_pb(spec)) == spec


def test_stats_derived_fields_are_sent() -> None:
    pb = convert.stats_to_pb(STATS)
    assert pb.acceptance_rate == pytest.approx(0.7)
    assert pb.mean_accepted_length == pytest.approx(1 + 7 / 4)


def test_malformed_messages_are_clear_errors() -> None:
    with pytest.raises(InvalidInput, match="no content"):
        convert_verifier.edge_message_from_pb(verifier_pb2.EdgeMessage())
    with pytest.raises(InvalidInput, match="no visual input"):
        convert_verifier.open_from_pb(verifier_pb2.Open(question="q"))
    with pytest.raises(InvalidInput, match="deadline_ms"):
        convert_verifier.open_from_pb(verifier_pb2.Open(question="q", deadline_ms=-1,
                                               frames=verifier_pb2.FramesInput()))
    bad = verifier_pb2.EdgeMessage()
    bad.tensor_header.name = "x"
    bad.tensor_header.dtype = 99  # type: ignore[assignment]
    with pytest.raises(InvalidInput, match="dtype"):
        convert_verifier.edge_message_from_pb(bad)
    with pytest.raises(InvalidInput, match="finite"):
        convert.edge_cost_from_pb(
            convert.edge_cost_to_pb(EDGE_COST).__class__(draft_prefill_ms=float("nan"))
        )
    with pytest.raises(InvalidInput, match="latest_ms"):
        convert_ask.ask_spec_from_pb(edge_pb2.AskRequest(question="q",
                                                     window=edge_pb2.Window(latest_ms=-5)))


def test_generation_settings_validation() -> None:
    assert GenerationSettings(0).validated(100).max_new_tokens == 64
    with pytest.raises(InvalidInput, match="cap"):
        GenerationSettings(200).validated(100)
    with pytest.raises(InvalidInput, match="temperature"):
        GenerationSettings(temperature=-1).validated(100)
    with pytest.raises(InvalidInput, match="top_p"):
        GenerationSettings(top_p=2).validated(100)


# -- trees: the packed columns and the per-node messages --------------------------------

_NODES = st.lists(st.tuples(st.integers(0, 2**40), st.integers(-1, 2**40),
                            st.integers(0, 2**31), st.floats(-50.0, 0.0, width=32)),
                  min_size=1, max_size=40)


@settings(max_examples=100, deadline=None)
@given(nodes=_NODES, base=st.integers(0, 10**6))
def test_a_tree_travels_as_columns_and_either_form_reads_back(
        nodes: list[tuple[int, int, int, float]], base: int) -> None:
    """The sender packs columns; the reader takes columns or messages, to the same nodes."""
    tail = DraftTail(base, (), 1.5, tuple(DraftNode(*n) for n in nodes))
    packed = convert_verifier.drafts_to_pb(tail)
    assert len(packed.nodes) == 0 and list(packed.node_ids) == [n[0] for n in nodes]
    back = convert_verifier.drafts_from_pb(verifier_pb2.Drafts.FromString(
        packed.SerializeToString()))
    assert back.nodes == tail.nodes and back.columns and back.base == base
    as_messages = verifier_pb2.Drafts(base=base, nodes=[
        verifier_pb2.DraftNode(id=i, parent=p, token_id=t, logprob=lp) for i, p, t, lp in nodes])
    plain = convert_verifier.drafts_from_pb(as_messages)
    assert plain.nodes == tail.nodes and not plain.columns


@pytest.mark.parametrize("short", ["node_parents", "node_tokens", "node_logprobs"])
def test_columns_of_unequal_length_name_the_column(short: str) -> None:
    m = verifier_pb2.Drafts(base=0, node_ids=[0, 1], node_parents=[-1, 0],
                            node_tokens=[5, 6], node_logprobs=[-0.1, -0.2])
    getattr(m, short).pop()
    with pytest.raises(InvalidInput, match=rf"Drafts\.{short} has 1 entries, Drafts\.node_ids 2"):
        convert_verifier.drafts_from_pb(m)


def test_missing_logprobs_are_zero_and_both_forms_at_once_are_refused() -> None:
    m = verifier_pb2.Drafts(base=0, node_ids=[0], node_parents=[-1], node_tokens=[5])
    assert convert_verifier.drafts_from_pb(m).nodes == (DraftNode(0, -1, 5, 0.0),)
    m.nodes.append(verifier_pb2.DraftNode(id=1, parent=-1, token_id=6))
    with pytest.raises(InvalidInput, match="both nodes and the node_ids columns"):
        convert_verifier.drafts_from_pb(m)
