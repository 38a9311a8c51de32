"""``--prefix-cache-gb``: through the real server on CPU (static engine, tiny target), a
second question about the same frames reuses the first's prompt prefix, says so in its
statistics, and gets exactly the tokens a cold prefill gives; other frames miss."""

from __future__ import annotations

from dataclasses import replace

from eventspec.cloud.server import VerifierServer
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.client.status_view import fetch_status
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.types import VerifierStats
from tests.support import cloud_harness as h

ASKS = [("What is moving?", 0), ("How many objects are there?", 0),
        ("What is moving?", 1), ("Which way does it go?", 0)]


async def _answers(prefix_gb: float, chunk: str
                   ) -> tuple[list[tuple[list[int], str, int]], VerifierStats]:
    settings = replace(h.settings(kv_cache_gb=0.05), engine="static",
                       prefix_cache_gb=prefix_gb, prefill_chunk=chunk)
    server = VerifierServer(settings, target=build_tiny_random_target(seed=0), cost=h.TEST_COST)
    await server.start()
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
