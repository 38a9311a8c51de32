"""What a failed connection's gRPC text means for the person at the command line.

gRPC reports every transport failure as UNAVAILABLE with the C core's own words: a
plaintext client at a TLS port reads "Socket closed", a TLS client at a plaintext port
"WRONG_VERSION_NUMBER", an untrusted certificate "CERTIFICATE_VERIFY_FAILED". Those are
true but say nothing about the fix (``--tls``, ``--tls-ca``), so every client command
adds the hint this module finds. ``eventspec wait`` also uses ``permanent``: a TLS
mismatch or an HTTP server will not turn into a SERVING node however long it waits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransportFault:
    """``kind``: ``refused``, ``closed``, ``plaintext_server``, ``untrusted_certificate``,
    ``tls_handshake``, ``not_grpc``. ``permanent``: retrying the same way cannot help
    (``refused`` and ``closed`` may: a node may be starting)."""

    kind: str
    hint: str
    permanent: bool

    @property
    def cause(self) -> str:
        """A few words for a log line: ``connection refused``, ``not a gRPC server``..."""
        return _CAUSES[self.kind]


_CAUSES = {
    "refused": "connection refused", "closed": "connection closed by the server",
    "plaintext_server": "it speaks plaintext, not TLS", "not_grpc": "not a gRPC server",
    "untrusted_certificate": "its TLS certificate is not trusted",
    "tls_handshake": "TLS handshake failed",
}


def transport_fault(details: str, *, tls: bool) -> TransportFault | None:
    """The fault behind an UNAVAILABLE's ``details``, or None when it is none of these
    (a deadline, a server that answered)."""
    if "Connection refused" in details:
        return TransportFault("refused", "nothing listens at that address (is the node "
                                         "started, and is the port right?)", False)
    if "Failed parsing HTTP/2" in details:
        return TransportFault("not_grpc", "the server there is not a gRPC server (it "
                                          "answered in HTTP/1.x): check the port", True)
    if "WRONG_VERSION_NUMBER" in details:
        return TransportFault("plaintext_server", "the server speaks plaintext, not TLS: "
                                                  "drop --tls/--tls-ca", True)
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return TransportFault("untrusted_certificate",
                              "the server's TLS certificate is not signed by a CA this "
                              "client trusts: pass --tls-ca with the CA that signed it", True)
    if "andshake failed" in details or "TSI_" in details:
        return TransportFault("tls_handshake", "the TLS handshake failed: check --tls-ca, "
                                               "--tls-cert/--tls-key and --tls-server-name",
                              True)
    if "Socket closed" in details or "Connection reset" in details:
        if tls:
            return TransportFault("closed", "the server closed the connection during the "
                                            "TLS handshake: does it want a client "
                                            "certificate (--tls-cert/--tls-key)?", False)
        return TransportFault("closed", "the server closed the connection: if it serves "
                                        "TLS, add --tls (and --tls-ca CA.pem for a private "
                                        "CA)", False)
    return None


def with_hint(message: str, details: str, *, tls: bool) -> str:
    """``message``, with the fault's hint appended when ``details`` shows one."""
    fault = transport_fault(details, tls=tls)
    return message if fault is None else f"{message} (hint: {fault.hint})"
