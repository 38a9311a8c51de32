"""The pure security rules: loopback detection, start-up refusals, token files."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventspec.shared.wire.auth import TokenStore, parse_tokens
from eventspec.shared.wire.security import (
    SecurityConfigError,
    ServerSecurity,
    ServerTls,
    check_server_start,
    is_loopback,
)

TLS = ServerTls(Path("c.pem"), Path("k.pem"), Path("ca.pem"), "none")
MTLS = ServerTls(Path("c.pem"), Path("k.pem"), Path("ca.pem"), "require")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"])
def test_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "example.internal", ""])
def test_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_off_loopback_needs_tls_and_auth_or_insecure() -> None:
    check_server_start("127.0.0.1", 0, ServerSecurity())
    check_server_start("0.0.0.0", 0, ServerSecurity(insecure=True))
    check_server_start("0.0.0.0", 0, ServerSecurity(tls=MTLS))
    check_server_start("0.0.0.0", 0, ServerSecurity(tls=TLS, tokens=(("a", "x" * 16),)))
    with pytest.raises(SecurityConfigError, match="plaintext"):
        check_server_start("0.0.0.0", 0, ServerSecurity(tokens=(("a", "x" * 16),)))
    with pytest.raises(SecurityConfigError, match="anonymous"):
        check_server_start("0.0.0.0", 0, ServerSecurity(tls=TLS))


def test_client_auth_needs_a_ca() -> None:
    no_ca = ServerTls(Path("c.pem"), Path("k.pem"), None, "require")
    with pytest.raises(SecurityConfigError, match="--tls-client-auth require needs --tls-ca"):
        check_server_start("127.0.0.1", 0, ServerSecurity(tls=no_ca))


def test_token_file_errors_name_the_entry_never_the_token() -> None:
    assert parse_tokens(["# c", "", "a:0123456789abcdef", " b : fedcba9876543210 "], "f") == {
        "a": "0123456789abcdef", "b": "fedcba9876543210"}
    for lines, match in [(["nocolon"], "entry 1: expected NAME:TOKEN"),
                         (["a:short"], r"entry 1 \(a\): the token must be at least 16"),
                         (["a:0123456789abcdef", "a:0123456789abcdeX"], "appears twice"),
                         (["bad name:0123456789abcdef"], "expected NAME:TOKEN")]:
        with pytest.raises(SecurityConfigError, match=match) as err:
            parse_tokens(lines, "f")
        assert "0123456789abcde" not in str(err.value)


def test_token_store_matches_by_name(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("a:0123456789abcdef\nb:fedcba9876543210\n")
    store = TokenStore(f, inline=(("c", "cccccccccccccccc"),))
    assert store.match("fedcba9876543210") == "b"
    assert store.match("cccccccccccccccc") == "c"
    assert store.match("0123456789abcdeF") is None
    assert store.match("") is None


@pytest.mark.parametrize("how", ["removed", "emptied", "comments only"])
def test_a_removed_or_emptied_token_file_revokes_its_tokens_but_not_inline_ones(
    tmp_path: Path, how: str) -> None:
    f = tmp_path / "tokens"
    f.write_text("a:aaaaaaaaaaaaaaaa\n")
    store = TokenStore(f, inline=(("c", "cccccccccccccccc"),))
    assert store.match("aaaaaaaaaaaaaaaa") == "a"
    if how == "removed":
        f.unlink()
    else:
        f.write_text("" if how == "emptied" else "# rotated out\n")
    assert store.match("aaaaaaaaaaaaaaaa") is None
    assert store.match("cccccccccccccccc") == "c"
