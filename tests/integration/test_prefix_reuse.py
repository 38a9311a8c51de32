"""``--prefix-cache-gb``: through the real server on CPU (static engine, tiny target), a
second question about the same frames reuses the first's prompt prefix, says so in its
statistics, and gets exactly the tokens a cold prefill gives; other frames miss. A clip
the cache holds skips its frames' preprocessing; one evicted between that guess and
the engine's lookup is preprocessed there and answers the same."""

from __future__ import annotations

from dataclasses import replace

from eventspec.cloud.server import VerifierServer
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.client.status_view import fetch_status
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.verifier_stats import VerifierStats
from tests.support import cloud_harness as h

ASKS = [("What is moving?", 0), ("How many objects are there?", 0),
        ("What is moving?", 1), ("Which way does it go?", 0)]


async def _answers(prefix_gb: float, chunk: str, preprocessed: list[int] | None = None,
                   evict_before_lookup: bool = False,
                   ) -> tuple[list[tuple[list[int], str, int]], VerifierStats]:
    settings = replace(h.settings(kv_cache_gb=0.05), engine="static",
                       prefix_cache_gb=prefix_gb, prefill_chunk=chunk)
    target = build_tiny_random_target(seed=0)
    if preprocessed is not None:  # count the frames' preprocessing
        real = target.preprocess_frames

        def counted(frames):  # type: ignore[no-untyped-def]
            preprocessed.append(len(frames))
            return real(frames)

        target.preprocess_frames = counted  # type: ignore[method-assign]
    server = VerifierServer(settings, target=target, cost=h.TEST_COST)
    await server.start()
    cache = server.runtime.scheduler.prefix_cache if server.runtime is not None else None
    if evict_before_lookup and cache is not None:
        # The request's guess says "held", the engine's lookup then misses: the race.
        cache.may_hold = lambda key: True  # type: ignore[method-assign]
    try:
        out = []
        for question, clip in ASKS:
            got = await h.run_generate(server.port, h.open_msg(question, h.make_frames(clip),
                                                               max_new_tokens=10))
            s = got.done.stats
            out.append((got.tokens, s.prefix_cache, s.prefix_reused_tokens))
        status = await fetch_status(f"127.0.0.1:{server.port}")
        return out, convert_verifier.verifier_stats_from_pb(status.message)  # type: ignore[arg-type]
    finally:
        await server.stop()


async def test_a_repeated_clip_reuses_its_prefix_and_answers_as_a_cold_prefill() -> None:
    cold, cold_view = await _answers(0.0, "off")
    assert [(c, n) for _, c, n in cold] == [("", 0)] * len(ASKS)  # the cache is off
    assert (cold_view.prefill, cold_view.prefix_cache_budget_bytes) == ("whole", 0)
    for chunk in ("off", "8"):
        warm, view = await _answers(0.01, chunk)
        # GetStats (eventspec status): two clips kept, two hits, two misses.
        assert view.prefill == ("whole" if chunk == "off" else "chunks of 8")
        assert (view.prefix_cache_entries, view.prefix_cache_hits,
                view.prefix_cache_misses) == (2, 2, 2)
        assert 0 < view.prefix_cache_bytes <= view.prefix_cache_budget_bytes
        assert [t for t, _, _ in warm] == [t for t, _, _ in cold], chunk
        verdicts = [c for _, c, _ in warm]
        assert verdicts == ["miss", "hit", "miss", "hit"], chunk
        reused = [n for _, _, n in warm]
        assert reused[0] == reused[2] == 0 and reused[1] == reused[3] > 0


async def test_a_held_clip_skips_its_preprocessing_and_a_lost_bet_still_answers() -> None:
    cold, _ = await _answers(0.0, "off")
    preprocessed: list[int] = []
    warm, _ = await _answers(0.01, "8", preprocessed)
    assert [t for t, _, _ in warm] == [t for t, _, _ in cold]
    assert len(preprocessed) == 2  # the two misses; the hits used the cached prefix
    # Every request bets on a hit; the first question of each clip loses the bet (the
    # cache is empty for it), so the engine thread preprocesses its frames then.
    preprocessed.clear()
    raced, _ = await _answers(0.01, "8", preprocessed, evict_before_lookup=True)
    assert [t for t, _, _ in raced] == [t for t, _, _ in cold]
    assert [c for _, c, _ in raced] == ["miss", "hit", "miss", "hit"]
    assert len(preprocessed) == 2
