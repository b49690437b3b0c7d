"""A bookie connection's phases as one transition table (h11's _state.py is the model).

A connection is at every moment in one state of each of four parts. A part moves only by
an event its table lists for its current state; any other event is a PhaseError naming the
part, the state and the event (h11's LocalProtocolError). No I/O and no asyncio here:
bk.server.connection fires the events and reads the states.

    part  states (initial first)                       events
    wire  MAYBE_V3 -> V2                               NOT_V3
    tls   PLAIN -> HANDSHAKING -> ENCRYPTED            START_TLS, HANDSHAKE_DONE
                   HANDSHAKING -> TLS_FAILED           HANDSHAKE_FAILED
          NO_TLS (TLS not configured: no event)
    auth  UNAUTHENTICATED -> AUTHENTICATED             AUTH_STEP, AUTH_OK
          AUTH_OFF (no provider: no event)
    life  OPEN -> CLOSING -> CLOSED                    CLOSE, LOST (OPEN -> CLOSED too)

- wire: BookKeeper's BookieProtoEncoding.RequestDecoder parses every frame as a v3 Request
  until one fails to parse; from that frame on the connection is v2 for good. There is no
  "v3 for good": a Java client in v2 mode sends a v3 START_TLS first and v2 frames after it.
- tls: a START_TLS the table refuses (TLS not configured, or a second one) is answered
  EBADREQ and the connection stays as it was; while HANDSHAKING nothing is read and the
  answers already queued wait (they leave encrypted). A failed handshake aborts the
  connection.
- auth: AUTH_STEP is one round of a longer exchange (DIGEST-MD5's challenge), AUTH_OK one
  that names a principal; an authenticated connection may exchange again (a Java SASL client
  sends a last empty AUTH) and stays authenticated. A refused AUTH closes the connection
  (life: CLOSE); it is not an auth state.
- life: CLOSE asks the transport to close (answers owed to requests before it still leave)
  and may come again; LOST is the transport's connection_lost, once.

A connection serves requests while it is OPEN, admitted (AUTH_OFF or AUTHENTICATED: the
auth gate is off) and not HANDSHAKING (answers are held). The parts are independent: no event of one part
depends on another's state (as START_TLS and AUTH may come in either protocol).
"""
from __future__ import annotations

import enum

from bk.errors import BKError


class PhaseError(BKError):
    """An event the connection's current phase does not allow: a bug in the caller, never bad
    input (input the protocol refuses is answered before an event is fired)."""


class Part(enum.Enum):
    WIRE = "wire"
    TLS = "tls"
    AUTH = "auth"
    LIFE = "life"


class State(enum.Enum):
    # wire
    MAYBE_V3 = "maybe v3"
    V2 = "v2"
    # tls
    NO_TLS = "TLS not configured"
    PLAIN = "plain"
    HANDSHAKING = "handshaking"
    ENCRYPTED = "encrypted"
    TLS_FAILED = "TLS handshake failed"
    # auth
    AUTH_OFF = "authentication off"
    UNAUTHENTICATED = "unauthenticated"
    AUTHENTICATED = "authenticated"
    # life
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"

    def __repr__(self) -> str:
        return self.name


class Event(enum.Enum):
    NOT_V3 = "a frame that is no v3 Request"
    START_TLS = "START_TLS accepted"
    HANDSHAKE_DONE = "TLS handshake done"
    HANDSHAKE_FAILED = "TLS handshake failed"
    AUTH_STEP = "AUTH round without a principal"
    AUTH_OK = "AUTH naming a principal"
    CLOSE = "close"
    LOST = "connection lost"

    def __repr__(self) -> str:
        return self.name


S, E = State, Event
# The table: part -> state -> {event: next state}. A state with no entry for an event forbids it.
TRANSITIONS: dict[Part, dict[State, dict[Event, State]]] = {
    Part.WIRE: {
        S.MAYBE_V3: {E.NOT_V3: S.V2},
        S.V2: {},
    },
    Part.TLS: {
        S.NO_TLS: {},
        S.PLAIN: {E.START_TLS: S.HANDSHAKING},
        S.HANDSHAKING: {E.HANDSHAKE_DONE: S.ENCRYPTED, E.HANDSHAKE_FAILED: S.TLS_FAILED},
        S.ENCRYPTED: {},
        S.TLS_FAILED: {},
    },
    Part.AUTH: {
        S.AUTH_OFF: {},
        S.UNAUTHENTICATED: {E.AUTH_STEP: S.UNAUTHENTICATED, E.AUTH_OK: S.AUTHENTICATED},
        S.AUTHENTICATED: {E.AUTH_STEP: S.AUTHENTICATED, E.AUTH_OK: S.AUTHENTICATED},
    },
    Part.LIFE: {
        S.OPEN: {E.CLOSE: S.CLOSING, E.LOST: S.CLOSED},
        S.CLOSING: {E.CLOSE: S.CLOSING, E.LOST: S.CLOSED},
        S.CLOSED: {},
    },
}
# Each event belongs to exactly one part (checked at import: two tables that must agree are one).
EVENT_PART: dict[Event, Part] = {}
for _part, _states in TRANSITIONS.items():
    for _moves in _states.values():
        for _event in _moves:
            if EVENT_PART.setdefault(_event, _part) is not _part:
                raise AssertionError(f"event {_event!r} appears in two parts")
STATE_PART: dict[State, Part] = {state: part for part, states in TRANSITIONS.items() for state in states}
if set(EVENT_PART) != set(Event) or set(STATE_PART) != set(State):
    raise AssertionError("every event and every state must be in the table")
del _part, _states, _moves, _event


class ConnectionPhase:
    """One connection's state in each part (`wire`, `tls`, `auth`, `life`), moved only by fire()."""

    __slots__ = ("wire", "tls", "auth", "life")

    def __init__(self, *, tls_configured: bool, auth_required: bool):
        self.wire = S.MAYBE_V3
        self.tls = S.PLAIN if tls_configured else S.NO_TLS
        self.auth = S.UNAUTHENTICATED if auth_required else S.AUTH_OFF
        self.life = S.OPEN

    def state(self, part: Part) -> State:
        return getattr(self, part.value)

    def allows(self, event: Event) -> bool:
        """Whether fire(event) would succeed now."""
        part = EVENT_PART[event]
        return event in TRANSITIONS[part][getattr(self, part.value)]

    def fire(self, event: Event) -> State:
        """Move the event's part by the table and return its new state; PhaseError (nothing
        changed) when the table does not allow `event` in the part's current state."""
        part = EVENT_PART[event]
        current = getattr(self, part.value)
        new = TRANSITIONS[part][current].get(event)
        if new is None:
            allowed = ", ".join(e.name for e in TRANSITIONS[part][current]) or "none"
            raise PhaseError(f"connection {part.value} phase is {current.name}: event {event.name} "
                             f"({event.value}) is not allowed there (allowed: {allowed})")
        setattr(self, part.value, new)
        return new

    @property
    def admitted(self) -> bool:
        """Requests other than AUTH and START_TLS may pass (bk.server.auth)."""
        return self.auth is not S.UNAUTHENTICATED

    def __repr__(self) -> str:
        return f"ConnectionPhase(wire={self.wire.name}, tls={self.tls.name}, auth={self.auth.name}, life={self.life.name})"
