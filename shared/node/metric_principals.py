"""How ``/metrics`` shows who calls: the per-edge label under ``--metrics-principals``.

The metrics endpoint has no authentication (``eventspec.shared.node.metrics``), so
whatever its labels say, anyone who can reach it reads: with ``name`` the per-edge series
list every authenticated caller's token name or certificate SAN, which tells a scraper
which edges exist and which of them are busy (red-team finding 9, issue 38).

- ``name`` (the default): the principal's name. The endpoint binds loopback unless
  ``--metrics-host`` says otherwise, so by default nothing leaves the machine; names are
  identities the operator chose, not secrets (the tokens are); and dashboards and alerts
  built on the names keep working after an upgrade. A non-loopback endpoint with names
  is logged as a warning that names this setting.
- ``hash``: the first :data:`DIGEST_HEX` hex digits of the name's SHA-256. Unsalted, so
  the same caller has the same label after a restart and on every replica (dashboards,
  alerts and ``rate()`` across restarts work), and an operator can find a known caller's
  series with ``printf %s NAME | sha256sum | cut -c1-12``. The same property means that
  someone who can guess a name can confirm the guess: ``hash`` hides names from a casual
  scraper, not from one who already knows the candidates; use ``none`` for that.
- ``none``: every authenticated caller is counted under one value, :data:`REDACTED`:
  the totals stay, who called does not.

``anonymous`` (a server without authentication) names no one and is kept under every
policy, so a dashboard still shows that callers are unauthenticated.
"""

from __future__ import annotations

import hashlib

from eventspec.shared.contract.principal import ANONYMOUS, Principal

#: ``--metrics-principals`` choices, the default first.
PRINCIPAL_LABELS = ("name", "hash", "none")
#: Hex digits of SHA-256 kept under ``hash``: 48 bits, so the 32 names a server labels
#: (``MAX_EDGE_LABELS``) collide with odds under 1 in 10^11.
DIGEST_HEX = 12
#: The one label every authenticated caller shares under ``none``.
REDACTED = "redacted"


def name_digest(name: str) -> str:
    """The stable short digest of a principal's name (the ``hash`` label)."""
    return hashlib.sha256(name.encode()).hexdigest()[:DIGEST_HEX]


def principal_label(principal: Principal, policy: str) -> str:
    """The label value for ``principal`` under ``policy`` (one of :data:`PRINCIPAL_LABELS`).

    A caller without authentication (method ``none``) is ``anonymous`` under every
    policy; a token that happens to be named ``anonymous`` is still hashed or redacted.
    """
    if principal.method == "none":
        return ANONYMOUS
    if policy == "hash":
        return name_digest(principal.name)
    if policy == "none":
        return REDACTED
    return principal.name
