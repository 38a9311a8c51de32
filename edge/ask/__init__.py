"""One Ask on the edge, end to end: the agent, its checks, the speculative session, one
attempt with the cloud or the edge alone (draft_only), and the request's timeline."""
