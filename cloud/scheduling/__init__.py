"""The engine loop every request shares: what the streams call, the loop's decisions and
plans, the prefill queue, chunking and prefix cache, the KV arena, the sampler, and the
engine thread that runs each plan."""
