"""bk.proto.state: the connection's phase table, every allowed transition and the refusal of
every other (state, event) pair."""
from collections import deque

import pytest

from bk.errors import BKError
from bk.proto.state import EVENT_PART, TRANSITIONS, ConnectionPhase, Event, Part, PhaseError, State

S, E = State, Event
# The specification, written out by hand: the table must say exactly this.
EXPECTED = {
    (S.MAYBE_V3, E.NOT_V3): S.V2,
    (S.PLAIN, E.START_TLS): S.HANDSHAKING,
    (S.HANDSHAKING, E.HANDSHAKE_DONE): S.ENCRYPTED,
    (S.HANDSHAKING, E.HANDSHAKE_FAILED): S.TLS_FAILED,
    (S.UNAUTHENTICATED, E.AUTH_STEP): S.UNAUTHENTICATED,
    (S.UNAUTHENTICATED, E.AUTH_OK): S.AUTHENTICATED,
    (S.AUTHENTICATED, E.AUTH_STEP): S.AUTHENTICATED,
    (S.AUTHENTICATED, E.AUTH_OK): S.AUTHENTICATED,
    (S.OPEN, E.CLOSE): S.CLOSING,
    (S.OPEN, E.LOST): S.CLOSED,
    (S.CLOSING, E.CLOSE): S.CLOSING,
    (S.CLOSING, E.LOST): S.CLOSED,
}
ALLOWED = [(part, state, event, new) for part, states in TRANSITIONS.items()
           for state, moves in states.items() for event, new in moves.items()]
FORBIDDEN = [(part, state, event) for part, states in TRANSITIONS.items() for state, moves in states.items()
             for event in Event if EVENT_PART[event] is part and event not in moves]
STARTS = [dict(tls_configured=tls, auth_required=auth) for tls in (True, False) for auth in (True, False)]


def _path_to(part: Part, target: State):
    """(constructor kwargs, events) that bring a fresh ConnectionPhase's `part` to `target`."""
    for kwargs in STARTS:
        start = ConnectionPhase(**kwargs).state(part)
        seen, todo = {start}, deque([(start, [])])
        while todo:
            state, events = todo.popleft()
            if state is target:
                return kwargs, events
            for event, new in TRANSITIONS[part][state].items():
                if new not in seen:
                    seen.add(new)
                    todo.append((new, events + [event]))
    raise AssertionError(f"{part.name} state {target.name} cannot be reached from any start")


def _at(part: Part, state: State) -> ConnectionPhase:
    kwargs, events = _path_to(part, state)
    phase = ConnectionPhase(**kwargs)
    for event in events:
        phase.fire(event)
    assert phase.state(part) is state
    return phase


def test_the_table_is_the_specification():
    assert {(state, event): new for _, state, event, new in ALLOWED} == EXPECTED


def test_initial_states():
    assert repr(ConnectionPhase(tls_configured=True, auth_required=True)) == \
        "ConnectionPhase(wire=MAYBE_V3, tls=PLAIN, auth=UNAUTHENTICATED, life=OPEN)"
    phase = ConnectionPhase(tls_configured=False, auth_required=False)
    assert (phase.wire, phase.tls, phase.auth, phase.life) == (S.MAYBE_V3, S.NO_TLS, S.AUTH_OFF, S.OPEN)
    assert phase.admitted


@pytest.mark.parametrize("part,state,event,new", ALLOWED,
                         ids=[f"{s.name}-{e.name}" for _, s, e, _ in ALLOWED])
def test_every_allowed_transition(part, state, event, new):
    phase = _at(part, state)
    others = {p: phase.state(p) for p in Part if p is not part}
    assert phase.allows(event)
    assert phase.fire(event) is new
    assert phase.state(part) is new
    assert {p: phase.state(p) for p in Part if p is not part} == others  # the parts are independent


@pytest.mark.parametrize("part,state,event", FORBIDDEN, ids=[f"{s.name}-{e.name}" for _, s, e in FORBIDDEN])
def test_every_forbidden_transition_raises_and_changes_nothing(part, state, event):
    phase = _at(part, state)
    before = repr(phase)
    assert not phase.allows(event)
    with pytest.raises(PhaseError) as info:
        phase.fire(event)
    assert repr(phase) == before
    message = str(info.value)
    assert part.value in message and state.name in message and event.name in message


def test_a_forbidden_event_names_what_is_allowed():
    phase = ConnectionPhase(tls_configured=True, auth_required=False)
    phase.fire(E.START_TLS)
    with pytest.raises(PhaseError, match=r"tls phase is HANDSHAKING: event START_TLS .* "
                                         r"\(allowed: HANDSHAKE_DONE, HANDSHAKE_FAILED\)"):
        phase.fire(E.START_TLS)
    phase = ConnectionPhase(tls_configured=False, auth_required=False)
    with pytest.raises(PhaseError, match=r"tls phase is NO_TLS: event START_TLS .*\(allowed: none\)"):
        phase.fire(E.START_TLS)
    assert issubclass(PhaseError, BKError)


def test_every_state_is_reachable_and_every_event_belongs_to_one_part():
    for part, states in TRANSITIONS.items():
        for state in states:
            _path_to(part, state)
    assert set(EVENT_PART) == set(Event)
    assert {s for states in TRANSITIONS.values() for s in states} == set(State)


@pytest.mark.parametrize("events,admitted", [
    ((), False),  # auth required, not yet authenticated
    ((E.AUTH_STEP,), False),  # DIGEST-MD5's challenge round
    ((E.AUTH_OK,), True),
    ((E.AUTH_OK, E.AUTH_STEP), True),
])
def test_admitted(events, admitted):
    phase = ConnectionPhase(tls_configured=True, auth_required=True)
    for event in events:
        phase.fire(event)
    assert phase.admitted is admitted
