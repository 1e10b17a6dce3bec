"""The handshake's MAC comparison: a MAC wrong in one byte (or in its length) is refused both ways.

Each test here fails if the check it names is removed or weakened (issue 12 found that such a
breakage passed the whole suite): it drives the real code path with inputs only that check can refuse,
and computes the right answer by itself, never through the product.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers.secret import SECRET

from overlay.auth import AuthError, Handshake

pytestmark = pytest.mark.unit


# --- the handshake's MAC comparison --------------------------------------------------------------------
def tamper(mac: bytes, how: str) -> bytes:
    b = bytearray(mac)
    if how == "last byte":
        b[-1] ^= 0x01
    elif how == "first byte":
        b[0] ^= 0x80
    elif how == "middle byte":
        b[len(b) // 2] ^= 0xFF
    elif how == "only the first byte":
        del b[1:]
    elif how == "one byte appended":
        b.append(0)
    out = bytes(b)
    assert out != mac
    return out


HOW = ["last byte", "first byte", "middle byte", "only the first byte", "one byte appended"]


def opened() -> tuple[Handshake, Handshake, dict[str, Any]]:
    """A dialer and an acceptor with the same secret, run up to the dialer's AUTH (not yet delivered)."""
    d = Handshake("bite", 0, "agent", dialer=True, secret=SECRET, expect=1, peer_role="agent")
    a = Handshake("bite", 1, "agent", dialer=False, secret=SECRET, peer_role="agent")
    [hello_a] = a.receive(d.start())
    [auth_d] = d.receive(hello_a)
    assert auth_d["t"] == "AUTH" and len(auth_d["mac"]) == 32
    return d, a, auth_d


@pytest.mark.parametrize("how", HOW)
def test_the_acceptor_refuses_a_mac_wrong_in_one_byte(how):
    """Deterministic: the MAC is the genuine one except for one byte (or its length), so a comparison
    of a prefix only (say the first byte) lets it through every time."""
    d, a, auth_d = opened()
    with pytest.raises(AuthError, match="does not verify"):
        a.receive({"t": "AUTH", "mac": tamper(auth_d["mac"], how)})
    assert not a.done
    [auth_a] = a.receive(auth_d)  # the genuine proof, same exchange: accepted, so only the byte mattered
    assert a.done and auth_a["t"] == "AUTH"


@pytest.mark.parametrize("how", HOW)
def test_the_dialer_refuses_an_acceptor_mac_wrong_in_one_byte(how):
    d, a, auth_d = opened()
    [auth_a] = a.receive(auth_d)
    with pytest.raises(AuthError, match="does not verify"):
        d.receive({"t": "AUTH", "mac": tamper(auth_a["mac"], how)})
    assert not d.done
    assert d.receive(auth_a) == [] and d.done
