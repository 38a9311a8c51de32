"""``--max-sessions auto`` (issue 35): on a GPU the verifier runs as many sessions as its
KV holds at the default answer cap and queues the rest; explicit caps keep their meaning;
the CPU default stays 8. The arithmetic is pure, so the GPU path is tested here."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspec.cloud.cli import build_parser, settings_from_args
from eventspec.cloud.config import CloudSettings, SettingsError
from eventspec.cloud.engine.kv import GIB, fit_arena
from eventspec.cloud.requests.session_capacity import (
    AUTO_SESSIONS,
    CPU_AUTO_SESSIONS,
    GPU_SESSION_CEILING,
    auto_kv_sessions,
    parse_max_sessions,
    session_capacity,
)

#: Video-LLaVA-7B's KV per position in bf16: 2 x 32 layers x 32 heads x 128 x 2 bytes.
KV_BYTES_7B = 2 * 32 * 32 * 128 * 2


def test_an_h100s_budget_holds_over_40_sessions_of_2_2k_tokens() -> None:
    """The budget the issue's H100 log printed (90% of 64.8 GiB free), the default
    2,851-position session window and 2,083 + 512 positions per request at the default
    answer cap: 40+ sessions run, not 8."""
    kv = fit_arena(int(58.35 * GIB), "test", bytes_per_token=KV_BYTES_7B, max_seq_len=2851,
                   max_sessions=GPU_SESSION_CEILING)
    running = auto_kv_sessions(kv_positions=kv.arena_positions, request_positions=2083 + 512,
                               ceiling=GPU_SESSION_CEILING)
    assert running == kv.arena_positions // (2083 + 512) and running >= 40
    cap = session_capacity(requested=AUTO_SESSIONS, on_gpu=True, kv_sessions=running,
                           kv_queue=64, request_positions=2595, kv_holds=running)
    assert cap.admitted == running + 64
    assert f"{running} sessions run at once" in cap.describe()
    assert "2595 positions" in cap.describe()
    assert "64 more may wait for KV" in cap.describe()


@given(positions=st.integers(1, 10**7), request=st.integers(1, 10**5),
       ceiling=st.integers(1, 256))
def test_auto_sessions_fit_the_arena_and_the_ceiling(positions: int, request: int,
                                                     ceiling: int) -> None:
    n = auto_kv_sessions(kv_positions=positions, request_positions=request, ceiling=ceiling)
    assert 1 <= n <= ceiling
    if positions >= request:
        assert n * request <= positions, "every counted session has its positions"
        assert n == ceiling or (n + 1) * request > positions, "no room for one more is left"


@given(requested=st.integers(1, 1000), kv=st.integers(1, 64), queue=st.integers(0, 100),
       on_gpu=st.booleans())
def test_an_explicit_cap_is_kept(requested: int, kv: int, queue: int, on_gpu: bool) -> None:
    cap = session_capacity(requested=requested, on_gpu=on_gpu, kv_sessions=kv, kv_queue=queue,
                           request_positions=100, kv_holds=kv)
    assert (cap.running, cap.admitted) == (kv, requested)


def test_auto_on_a_cpu_runs_8_and_queues_the_rest() -> None:
    cap = session_capacity(requested=AUTO_SESSIONS, on_gpu=False, kv_sessions=CPU_AUTO_SESSIONS,
                           kv_queue=64, request_positions=100, kv_holds=500)
    assert (cap.running, cap.admitted) == (CPU_AUTO_SESSIONS, CPU_AUTO_SESSIONS + 64)
    assert "64 more may wait for KV" in cap.describe() and "auto on a CPU" in cap.describe()


def test_a_ceiling_says_so() -> None:
    cap = session_capacity(requested=AUTO_SESSIONS, on_gpu=True, kv_sessions=64, kv_queue=0,
                           request_positions=100, kv_holds=90)
    assert "holds 90 requests" in cap.describe() and "at most 64" in cap.describe()


def test_max_sessions_auto_is_the_default_and_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CloudSettings().limits.max_sessions == AUTO_SESSIONS
    assert settings_from_args(build_parser().parse_args(["serve"])).limits.max_sessions == 0
    args = build_parser().parse_args(["serve", "--max-sessions", "auto"])
    assert settings_from_args(args).limits.max_sessions == AUTO_SESSIONS
    assert parse_max_sessions(" 12 ") == 12
    with pytest.raises(ValueError, match="auto or an integer"):
        parse_max_sessions("many")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-sessions", "many"])
    monkeypatch.setenv("EVENTSPEC_CLOUD_MAX_SESSIONS", "auto")
    assert CloudSettings.from_env().limits.max_sessions == AUTO_SESSIONS
    monkeypatch.setenv("EVENTSPEC_CLOUD_MAX_SESSIONS", "lots")
    with pytest.raises(SettingsError, match="EVENTSPEC_CLOUD_MAX_SESSIONS"):
        CloudSettings.from_env()


def test_the_rpc_limit_covers_what_auto_may_admit() -> None:
    settings = CloudSettings()
    assert settings.admission_ceiling == GPU_SESSION_CEILING + settings.kv_queue
    assert CloudSettings(kv_queue=0).per_principal_cap == GPU_SESSION_CEILING - 1
