"""Domain types shared by both nodes and clients: frozen dataclasses, no protobuf.

``eventspec.shared.contract.convert`` (with ``convert_verifier`` and ``convert_ask``, one per
service) maps them to and from the wire messages, so everything above the transport
(sessions, drafter, timing, statistics) is plain Python and testable offline.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timeline import Timeline
from eventspec.shared.contract.timing import CloudCost, EdgeCost, TimingPlan

PROTOCOL = "eventspec.v1"
#: Name of the aligned-features tensor that follows an Open with ``aligned`` set.
VIDEO_FEATURES_TENSOR = "video_features"


class FeatureMode(enum.IntEnum):
    """Visual path to the cloud; values equal the proto enum's."""

    FRAMES = 1
    ALIGNED = 2
    AUTO = 3


class Mode(enum.IntEnum):
    """Who answers; values equal the proto enum's."""

    SPECULATIVE = 1
    TARGET_ONLY = 2
    DRAFT_ONLY = 3


class FinishReason(enum.IntEnum):
    """Why generation stopped; values equal the proto enum's."""

    EOS = 1
    MAX_TOKENS = 2
    STOP_STRING = 3
    DEADLINE = 4
    CANCELLED = 5


#: Sampling temperatures outside this span turn logits / T into inf or 0 and the
#: sampler's probabilities into NaN; 0 means greedy.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 1e3
#: Stop strings one request may carry, and their total length in characters. Each is
#: matched after every committed token, so without a cap one request multiplies the
#: per-token work of the shared engine loop (issue 19: 10^6 stop strings made other
#: clients' answers 12-30x slower). Advertised in GetServerInfo.limits.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024


def check_stop(stop: tuple[str, ...], max_strings: int, max_chars: int) -> None:
    """Refuse more than ``max_strings`` stop strings, empty ones, or more than
    ``max_chars`` characters in all: each is matched after every committed token.

    The count comes first and costs O(1), so a list past it is refused without a pass
    over what the caller sent (issue 38: 10^6 strings took 100 ms to check)."""
    if len(stop) > max_strings:
        raise InvalidInput(
            f"generation.stop: {len(stop)} stop strings exceed the cap of {max_strings} "
            "(GetServerInfo.limits.max_stop_strings)"
        )
    if any(not s for s in stop):
        raise InvalidInput("generation.stop: stop strings must be non-empty")
    chars = sum(len(s) for s in stop)
    if chars > max_chars:
        raise InvalidInput(
            f"generation.stop: {chars} characters of stop strings exceed the cap of "
            f"{max_chars} (GetServerInfo.limits.max_stop_chars)"
        )


@dataclass(frozen=True)
class GenerationSettings:
    """Decoding settings. temperature 0 is greedy (token-identical to target-only)."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()

    def validated(self, max_new_tokens_cap: int, *, max_stop_strings: int = 0,
                  max_stop_chars: int = 0) -> GenerationSettings:
        """Return a copy with defaults filled in, or raise InvalidInput naming the field.

        The stop caps are the server's advertised limits; 0 (an older cloud that does
        not report them) means this build's defaults, ``MAX_STOP_STRINGS`` and
        ``MAX_STOP_CHARS``.
        """
        if self.max_new_tokens < 0:
            raise InvalidInput(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.max_new_tokens > max_new_tokens_cap:
            raise InvalidInput(
                f"max_new_tokens {self.max_new_tokens} exceeds this server's cap of "
                f"{max_new_tokens_cap}"
            )
        if not math.isfinite(self.temperature) or not (
            self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE
        ):
            raise InvalidInput(
                f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, "
                f"{MAX_TEMPERATURE:g}], got {self.temperature}"
            )
        if not math.isfinite(self.top_p) or not 0 <= self.top_p <= 1:
            raise InvalidInput(f"top_p must be in (0, 1], got {self.top_p}")
        check_stop(self.stop, max_stop_strings or MAX_STOP_STRINGS,
                   max_stop_chars or MAX_STOP_CHARS)
        return GenerationSettings(
            max_new_tokens=self.max_new_tokens or min(64, max_new_tokens_cap),
            temperature=self.temperature,
            top_p=self.top_p or 1.0,
            seed=self.seed,
            stop=self.stop,
        )


@dataclass(frozen=True)
class VisualGeometry:
    """Shape of the target's video input, advertised to the edge in ``GetServerInfo``.

    ``feature_dim`` is the hidden size of the video tower's *selected* layer
    (``vision_feature_layer``, -2), before the multi-modal projector: the "aligned"
    feature space the edge may send instead of frames (4x smaller than the projector's
    output at 7B). Real Video-LLaVA-7B: 8 frames x 257 tokens x 1024, 224 px.
    """

    num_frames: int
    tokens_per_frame: int
    feature_dim: int
    image_size: int

    @property
    def visual_tokens(self) -> int:
        """How many ``<video>`` placeholders one clip occupies in the prompt."""
        return self.num_frames * self.tokens_per_frame

    @property
    def feature_shape(self) -> tuple[int, int, int]:
        return (self.num_frames, self.tokens_per_frame, self.feature_dim)


@dataclass(frozen=True)
class ServerLimits:
    """The cloud's caps, advertised in GetServerInfo."""

    max_sessions: int = 8
    max_message_bytes: int = 8 << 20
    max_tensor_bytes: int = 64 << 20
    max_new_tokens: int = 512
    max_draft_tokens: int = 128
    max_frame_bytes: int = 4 << 20
    max_verify_tokens: int = 33
    max_question_chars: int = 4096
    #: KV slots the engine reserved at start-up (0: not reported).
    kv_slots: int = 0
    #: Positions per KV slot (prompt + answer).
    kv_tokens_per_slot: int = 0
    #: Concurrent sessions one authenticated principal may hold (0: not reported).
    max_sessions_per_principal: int = 0
    #: Stop strings per request, and their total characters (0: not reported, an older
    #: cloud; the edge then applies the defaults).
    max_stop_strings: int = MAX_STOP_STRINGS
    max_stop_chars: int = MAX_STOP_CHARS
    #: Draft trees: live nodes per request, and depth below C's end (0: chains only).
    max_tree_nodes: int = 512
    max_tree_depth: int = 64


@dataclass(frozen=True)
class ServerInfo:
    """What a Verifier tells its clients about itself."""

    model_id: str
    vocab_size: int
    text_vocab_size: int
    vocab_fingerprint: str
    eos_token_id: int
    geometry: VisualGeometry
    feature_modes: tuple[FeatureMode, ...]
    cloud_cost: CloudCost
    limits: ServerLimits
    prompt_overhead_tokens: int
    protocol: str = PROTOCOL


@dataclass(frozen=True)
class AlignedSpec:
    """Declares that aligned features follow as a tensor of this dtype name and shape."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class OpenRequest:
    """The first message of a Generate stream. Exactly one of frames / aligned is set."""

    request_id: str
    question: str
    generation: GenerationSettings
    frames: tuple[bytes, ...] | None = None
    aligned: AlignedSpec | None = None
    edge_cost: EdgeCost | None = None
    deadline_ms: int = 0
    speculative: bool = True
    #: Return the cloud's event log for this request in ``DoneEvent.timeline``.
    timeline: bool = False


class DraftNode(NamedTuple):
    """One drafted token of a tree: ``parent`` is an earlier node's id, or ``ROOT`` (-1):
    the token right after the first ``base`` committed tokens of its message. A named
    tuple, not a dataclass: the cloud builds thousands a step under load (issue 36's
    64-client run), and a tuple costs half as much to build."""

    id: int
    parent: int
    token_id: int
    logprob: float = 0.0


#: ``DraftNode.parent`` of a root.
ROOT = -1


@dataclass(frozen=True)
class DraftTail:
    """The edge's drafts from the committed length ``base``: a chain (``token_ids``, the
    whole tail from ``base``, re-sent as it changes) or new tree nodes (``nodes``, only
    those not sent before; docs/trees.md). A chain is a tree with one child per node."""

    base: int
    token_ids: tuple[int, ...]
    sent_at_ms: float = 0.0
    nodes: tuple[DraftNode, ...] = ()
    #: The nodes came as the wire's parallel columns (``node_ids``, ...), not as
    #: ``nodes`` messages: errors name the field the sender filled.
    columns: bool = False


@dataclass(frozen=True)
class CommitEvent:
    """Tokens the cloud made final in one target step."""

    start: int
    token_ids: tuple[int, ...]
    drafts_verified: int
    drafts_accepted: int
    text: str
    at_ms: float


#: ``RequestStats.stage_ms`` key the cloud sets on aligned requests: ms from the
#: features' tensor header to their last chunk, as it received them. The edge feeds its
#: uplink estimate from it: its own clock around its writes times buffers (gRPC's, the
#: kernel's, a proxy's), not the link (through a 10 Mbit/s link it saw 4.2 MB "sent" in
#: 434 ms: 78 Mbit/s; ``benchmarks/results/e2e-h200-uplink-invariant.json``).
UPLOAD_STAGE = "upload"


@dataclass(frozen=True)
class RequestStats:
    """Per-request statistics in vLLM's vocabulary."""

    drafted: int = 0
    accepted: int = 0
    hidden_drafted: int = 0
    hidden_accepted: int = 0
    target_steps: int = 0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    uplink_bytes: int = 0
    downlink_bytes: int = 0
    new_tokens: int = 0
    stale_drafts: int = 0
    stage_ms: dict[str, float] = field(default_factory=dict)
    #: Prompt positions reused from the cloud's prefix cache (0: a miss, or off).
    prefix_reused_tokens: int = 0
    #: "hit", "miss", or "" when the cloud's prefix cache is off.
    prefix_cache: str = ""
    #: Cloud: drafts on offer summed over the verify steps (before the width rule), the
    #: steps that had none (the edge was not ahead), and steps sat out (--sit-out).
    drafts_on_offer: int = 0
    dry_steps: int = 0
    steps_sat_out: int = 0
    #: Edge, trees only (0 for chains): nodes sent, ruled out by a commit, and off-path hits.
    tree_nodes_sent: int = 0
    tree_nodes_pruned: int = 0
    tree_branch_hits: int = 0
    #: Edge: its share of the draft forwards' time, ms (n sessions in one: 1/n each).
    draft_forward_ms: float = 0.0
    #: Cloud: Plans sent after the first, re-planned while the answer decoded.
    plans_sent: int = 0

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted; 0 when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """tau = 1 + accepted / steps (vLLM); 0 before any step."""
        return 1.0 + self.accepted / self.target_steps if self.target_steps else 0.0


@dataclass(frozen=True)
class DoneEvent:
    """The end of a Generate stream."""

    finish_reason: FinishReason
    token_ids: tuple[int, ...]
    text: str
    stats: RequestStats
    final_plan: TimingPlan | None = None
    #: The cloud's event log on its own clock, when ``OpenRequest.timeline`` asked.
    timeline: Timeline | None = None


@dataclass(frozen=True)
class TensorChunkData:
    """One chunk of a tensor stream, as received."""

    name: str
    index: int
    data: bytes


@dataclass(frozen=True)
class CancelRequest:
    """The edge asked the cloud to stop this request."""

    reason: str = ""


@dataclass(frozen=True)
class AskSpec:
    """One question to the edge: what, which moment, who answers, how."""

    question: str
    latest_ms: int | None = None  # None: the edge's default clip (the latest 1000 ms)
    t0_us: int | None = None
    t1_us: int | None = None
    event_window_ms: int = 50
    mode: Mode = Mode.SPECULATIVE
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    feature_mode: FeatureMode = FeatureMode.AUTO
    jpeg_quality: int = 0
    #: Return the request's timeline (both sides, one clock) in ``FinalEvent.timeline``.
    timeline: bool = False


@dataclass(frozen=True)
class WindowInfo:
    """The clip and event window actually used, in the source's clock (µs)."""

    clip_t0_us: int
    clip_t1_us: int
    event_t0_us: int
    event_t1_us: int
    num_events: int


@dataclass(frozen=True)
class PreviewEvent:
    """Unverified draft text after the committed prefix, shown at once."""

    base: int
    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class CommittedEvent:
    """Final tokens, with the whole final text so far."""

    start: int
    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class FinalEvent:
    """The whole answer, who produced it, and the statistics."""

    answer: str
    token_ids: tuple[int, ...]
    mode: Mode
    feature_mode: FeatureMode | None  # None in draft_only: nothing went to the cloud
    finish_reason: FinishReason
    stats: RequestStats
    plan: TimingPlan | None
    window: WindowInfo | None
    #: Both sides' event logs on the edge's clock, when ``AskSpec.timeline`` asked.
    timeline: Timeline | None = None


@dataclass(frozen=True)
class ProgressEvent:
    """What the edge waits for before the answer can start (no answer content)."""

    stage: str
    message: str
    waited_s: float


AskEvent = PreviewEvent | CommittedEvent | FinalEvent | ProgressEvent
