"""Make caller-supplied strings safe to log, and strip internal addresses from errors.

A ``request_id`` comes from the peer: a newline in it would forge a log line, an escape
sequence would repaint an operator's terminal, and a megabyte of it would flood the log.
Both nodes pass such ids through ``safe_request_id`` before anything logs them.

Errors relayed to end users must not reveal where the internal services live: gRPC's own
UNAVAILABLE details name the address it tried ("ipv4:10.1.2.3:50061: Connection
refused"). ``scrub_addresses`` replaces host:port forms with a neutral word, and
``scrub_operator_hints`` drops advice meant for whoever runs the server ("raise
--max-sessions"): an end user cannot act on it. The full detail stays in the operator's
log.
"""

from __future__ import annotations

import re

#: Longest request id kept (longer ids are cut, with the original length noted).
MAX_REQUEST_ID_CHARS = 64

#: Characters kept in a request id; anything else (control characters, newlines,
#: spaces, quotes, non-ASCII) becomes ``_``.
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._:@/+=-]")

_ADDRESS = re.compile(
    r"(?:(?:ipv[46]|dns|unix|unix-abstract):(?:///?)?)?"  # gRPC target schemes
    r"(?:\[[0-9A-Fa-f:.%]+\]"  # [IPv6]
    r"|\d{1,3}(?:\.\d{1,3}){3}"  # IPv4
    r"|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*)"  # host name
    r":\d{1,5}\b"
)
#: A parenthesis that names a flag: "(--max-sessions-per-principal 2)".
_FLAG_PARENTHESIS = re.compile(r"\s*\([^()]*--[a-z][^()]*\)")
#: Advice to change a flag, with what joins it to the sentence: "or raise --kv-cache-gb",
#: "or lower --max-seq-len".
_FLAG_ADVICE = re.compile(
    r"\s*(?:\bor\s+|\band\s+)?\b(?:raise|lower|increase|decrease)\s+"
    r"--[a-z][a-z0-9-]*(?:\s+(?:or|and)\s+(?:raise|lower|increase|decrease)\s+"
    r"--[a-z][a-z0-9-]*)*(?:\s+\d+)?"
)
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")
_BARE_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|\[[0-9A-Fa-f:.%]+\]")


def safe_request_id(raw: str) -> str:
    """``raw`` reduced to at most ``MAX_REQUEST_ID_CHARS`` safe characters (``-`` if empty).

    A cut id ends with ``…(N chars)`` so the log still says it was longer.
    """
    clean = _ID_UNSAFE.sub("_", raw)
    if not clean:
        return "-"
    if len(clean) <= MAX_REQUEST_ID_CHARS:
        return clean
    return f"{clean[:MAX_REQUEST_ID_CHARS]}…({len(raw)} chars)"


def scrub_addresses(text: str) -> str:
    """``text`` with every host:port, gRPC target and bare IP address replaced by
    ``<address>``."""
    return _BARE_IP.sub("<address>", _ADDRESS.sub("<address>", text))


def scrub_operator_hints(text: str) -> str:
    """``text`` without advice about server flags: parentheses naming a flag and "or raise
    --flag" clauses are dropped, and any flag left is called "a server setting"."""
    text = _FLAG_PARENTHESIS.sub("", text)
    text = _FLAG_ADVICE.sub("", text)
    text = _FLAG.sub("a server setting", text)
    return re.sub(r"\s+([;,.])", r"\1", text).strip().rstrip(";,")
