"""Cluster authentication: a shared secret, HMAC-SHA256 challenge-response both ways, optional TLS.

One sans-IO state machine (`Handshake`) serves both kinds of connection (agent <-> agent in
overlay/peers.py, agent <-> scheduler in overlay/control.py and scheduler/service.py), so the
crypto lives in one place. Message sequence (the dialer speaks first):

    dialer   -> acceptor  HELLO {node, cluster, role, nonce: Nd}
    acceptor -> dialer    HELLO {node, cluster, role, nonce: Na}
    dialer   -> acceptor  AUTH  {mac: HMAC(secret, cluster, "<role>/dialer",   dialer id, acceptor id, Nd, Na)}
    acceptor -> dialer    AUTH  {mac: HMAC(secret, cluster, "<role>/acceptor", dialer id, acceptor id, Nd, Na)}

Both nonces are fresh per connection, so a recorded AUTH never verifies again; the prover's role
is inside the MAC, so a dialer's proof reflected back as the acceptor's (or the other way) fails;
both node ids and the cluster id are inside, so a proof for another pair or cluster fails. The
acceptor proves only to a dialer that proved first, so an unauthenticated stranger gets no MAC.
Without a secret (an explicit `--insecure`), HELLO carries no nonce and the exchange ends after
the two HELLOs; a node with a secret refuses such a peer, and the other way round.

The handshake authenticates the two ends, not the bytes after it: across an untrusted network use
TLS as well (`TlsFiles`), which encrypts and integrity-protects the stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import ssl
import stat
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from .messages import ProtocolError

SECRET_ENV = "WANSYNC_SECRET"
MIN_SECRET_BYTES = 16
NONCE_BYTES = 32
HANDSHAKE_TIMEOUT_S = 10.0
_LABEL = "wansync-auth-1"


class AuthError(ProtocolError):
    """The peer failed, refused or broke the handshake; the connection is closed, nothing attached."""


class SecretError(ValueError):
    """No usable cluster secret was configured."""


def generate_secret() -> str:
    """A fresh per-run secret (256 random bits), as text so it can travel in an environment variable."""
    return secrets.token_bytes(32).hex()


def load_secret(path: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None) -> bytes | None:
    """The cluster secret from a file (if given) or from $WANSYNC_SECRET; None if neither is set.

    Surrounding whitespace is stripped, so `echo ... > file` works. Secrets shorter than 16 bytes
    are refused: a guessable secret is worse than none, because it looks like protection."""
    env = os.environ if env is None else env
    if path is not None:
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise SecretError(f"cannot read secret file {str(p)!r}: {exc.strerror}") from None
        if p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            import logging
            logging.getLogger("wansync.auth").warning(
                "secret file %s is readable by group or others (chmod 600 it)", p)
        where = f"secret file {str(p)!r}"
    elif env.get(SECRET_ENV):
        raw, where = env[SECRET_ENV].encode(), f"${SECRET_ENV}"
    else:
        return None
    secret = raw.strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(f"{where} holds {len(secret)} bytes; a cluster secret needs at least {MIN_SECRET_BYTES}")
    return secret


def mac(secret: bytes, *, cluster: str, prover: str, dialer: int, acceptor: int, dialer_nonce: bytes,
        acceptor_nonce: bytes) -> bytes:
    """HMAC-SHA256 over everything the proof must be bound to (msgpack: unambiguous field borders)."""
    msg = msgpack.packb([_LABEL, cluster, prover, dialer, acceptor, dialer_nonce, acceptor_nonce],
                        use_bin_type=True)
    return hmac.new(secret, msg, hashlib.sha256).digest()


PeerCheck = Callable[[int, str], "str | None"]  # (node, role) -> reason to refuse, or None
NONCES_KEPT = 4096  # challenges one process remembers (about 0.5 MiB at most)
NONCES_KEPT_S = 600.0  # and for how long: a replay older than this fails as a MAC that does not verify


class NonceMemory:
    """The peers' challenges seen lately, bounded in number and age: a HELLO whose challenge was
    already used is a recorded handshake played back, and is refused as one (not as a MAC that
    "does not verify", which reads like a wrong secret)."""

    def __init__(self, size: int = NONCES_KEPT, age_s: float = NONCES_KEPT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.size, self.age_s, self.clock = size, age_s, clock
        self._seen: OrderedDict[bytes, float] = OrderedDict()  # digest -> when, oldest first

    def __len__(self) -> int:
        return len(self._seen)

    def first_use(self, nonce: bytes) -> bool:
        """True the first time `nonce` is seen (and remember it); False for a replay."""
        now = self.clock()
        while self._seen and (len(self._seen) >= self.size or now - next(iter(self._seen.values())) > self.age_s):
            self._seen.popitem(last=False)
        key = hashlib.blake2b(nonce, digest_size=16).digest()
        if key in self._seen:
            return False
        self._seen[key] = now
        return True


@dataclass
class Handshake:
    """One side of the handshake, sans IO: feed it the peer's headers, send what it returns.

    `receive` raises AuthError with a one-line reason when the peer must be refused; `done` turns
    True once the peer is authenticated (or, both sides insecure, identified)."""

    cluster: str
    node: int
    role: str  # what we are: "agent" or "scheduler"
    dialer: bool
    secret: bytes | None
    expect: int | None = None  # dialer: the node id we meant to reach
    peer_role: str | None = None  # the role the peer must have
    check_peer: PeerCheck | None = None  # acceptor: may this node connect at all?
    hello_extra: dict[str, Any] = field(default_factory=dict)  # more HELLO fields (epochs)
    nonces: NonceMemory | None = None  # this process's memory of challenges seen (replays), if any
    peer: int | None = None
    peer_hello: dict[str, Any] | None = None
    done: bool = False
    _nonce: bytes = b""
    _peer_nonce: bytes = b""
    _state: str = "start"

    @property
    def secure(self) -> bool:
        return self.secret is not None

    def start(self) -> dict[str, Any]:
        """The dialer's opening HELLO."""
        assert self.dialer and self._state == "start"
        self._state = "hello_sent"
        return self._hello()

    def _hello(self) -> dict[str, Any]:
        h: dict[str, Any] = {"t": "HELLO", "node": self.node, "cluster": self.cluster, "role": self.role,
                             **self.hello_extra}
        if self.secure:
            self._nonce = secrets.token_bytes(NONCE_BYTES)
            h["nonce"] = self._nonce
        return h

    def receive(self, h: dict[str, Any]) -> list[dict[str, Any]]:
        """Headers to send in reply; raises AuthError to refuse the peer."""
        t = h["t"]
        if self.done:
            raise AuthError(f"unexpected {t} after the handshake", peer=self.peer)
        if self._state in ("start", "hello_sent"):
            if t != "HELLO":
                raise AuthError(f"expected HELLO, got {t}", peer=self.peer)
            self._on_hello(h)
            if self.dialer:
                if not self.secure:
                    self.done = True
                    return []
                self._state = "auth_sent"
                return [{"t": "AUTH", "mac": self._mac(dialer_proves=True)}]
            reply = self._hello()
            if self.secure:
                self._state = "hello_answered"
            else:
                self.done = True
            return [reply]
        if t != "AUTH":
            raise AuthError(f"expected AUTH, got {t}", peer=self.peer)
        # acceptor: check the dialer's proof, then prove ourselves; dialer: check the acceptor's proof
        want = self._mac(dialer_proves=not self.dialer)
        if not hmac.compare_digest(want, h["mac"]):
            raise AuthError(f"node {self.peer} failed authentication: its MAC does not verify "
                            f"(a different cluster secret, or a forged or replayed handshake?)", peer=self.peer)
        self.done = True
        return [] if self.dialer else [{"t": "AUTH", "mac": self._mac(dialer_proves=False)}]

    def _on_hello(self, h: dict[str, Any]) -> None:
        node, cluster, role = h["node"], h["cluster"], h["role"]
        self.peer, self.peer_hello = node, h
        if cluster != self.cluster:
            raise AuthError(f"node {node} is in cluster {cluster!r}, not {self.cluster!r}", peer=node)
        if self.peer_role is not None and role != self.peer_role:
            raise AuthError(f"node {node} has the role {role!r}, expected {self.peer_role!r}", peer=node)
        if self.expect is not None and node != self.expect:
            raise AuthError(f"dialled node {self.expect} but node {node} answered", peer=node)
        if self.check_peer is not None:
            why = self.check_peer(node, role)
            if why:
                raise AuthError(why, peer=node)
        nonce = h.get("nonce")
        if self.secure and nonce is None:
            raise AuthError(f"node {node} has no cluster secret (it sent no challenge); refused", peer=node)
        if not self.secure and nonce is not None:
            raise AuthError(f"node {node} requires authentication, but this node has no cluster secret "
                            f"(started with --insecure)", peer=node)
        if nonce is not None:
            if not MIN_SECRET_BYTES <= len(nonce) <= 4 * NONCE_BYTES:
                raise AuthError(f"node {node} sent a {len(nonce)}-byte nonce", peer=node)
            if nonce == self._nonce:
                raise AuthError(f"node {node} reflected our own challenge", peer=node)
            if self.nonces is not None and not self.nonces.first_use(nonce):
                raise AuthError(f"node {node} replayed a handshake: its challenge was used before (a recorded "
                                f"handshake played back, not a different secret)", peer=node)
            self._peer_nonce = nonce

    def _mac(self, *, dialer_proves: bool) -> bytes:
        assert self.secret is not None and self.peer is not None
        dialer, acceptor = (self.node, self.peer) if self.dialer else (self.peer, self.node)
        dn, an = (self._nonce, self._peer_nonce) if self.dialer else (self._peer_nonce, self._nonce)
        # the prover's role: what it says it is (agent/scheduler) and which end of the socket it holds
        prover_role = self.role if self.dialer == dialer_proves else self._peer_role()
        prover = f"{prover_role}/{'dialer' if dialer_proves else 'acceptor'}"
        return mac(self.secret, cluster=self.cluster, prover=prover, dialer=dialer, acceptor=acceptor,
                   dialer_nonce=dn, acceptor_nonce=an)

    def _peer_role(self) -> str:
        assert self.peer_hello is not None
        return str(self.peer_hello["role"])

    def closed_reason(self) -> str:
        """Why the peer hung up mid-handshake, as far as we can tell from where we were."""
        if self._state == "auth_sent":
            return (f"node {self.peer} closed the connection after our AUTH: it refused our MAC "
                    f"(a different cluster secret?)")
        if self._state == "hello_sent":
            return "the peer closed the connection before answering HELLO (wrong cluster, node or secret mode?)"
        return "the peer closed the connection during the handshake"


async def run_handshake(hs: Handshake, send: Callable[[dict[str, Any]], None],
                        recv: Callable[[], Awaitable[dict[str, Any] | None]],
                        timeout: float = HANDSHAKE_TIMEOUT_S) -> int:
    """Drive a Handshake over an async connection (the control plane); the peer's node id."""
    async with asyncio.timeout(timeout):
        if hs.dialer:
            send(hs.start())
        while not hs.done:
            msg = await recv()
            if msg is None:
                raise AuthError(hs.closed_reason(), peer=hs.peer)
            for reply in hs.receive(msg):
                send(reply)
    assert hs.peer is not None
    return hs.peer


@dataclass(frozen=True)
class TlsFiles:
    """Mutual TLS for runs across real WANs: every node has a certificate signed by the cluster CA.

    Peers are verified against the CA, not by host name (nodes are addressed by IP; which node is
    which is bound by the HMAC handshake that runs inside the TLS stream)."""

    cert: str
    key: str
    ca: str

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.ca)
        ctx.load_cert_chain(self.cert, self.key)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.load_cert_chain(self.cert, self.key)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    @classmethod
    def from_args(cls, cert: str | None, key: str | None, ca: str | None) -> TlsFiles | None:
        given = [x is not None for x in (cert, key, ca)]
        if not any(given):
            return None
        if not all(given):
            raise SecretError("TLS needs all of --tls-cert, --tls-key and --tls-ca")
        assert cert is not None and key is not None and ca is not None
        return cls(cert, key, ca)
