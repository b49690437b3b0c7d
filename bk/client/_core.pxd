# The client's add path core: its objects' fields and the hooks they call, declared once.
#
# core_py.py is the pure twin: its classes have exactly these fields (as
# __slots__) and take the same constructor arguments; tests/unit/
# test_client_core.py checks both declare the same fields and behave alike on
# the same inputs. LedgerHandle and BookieClient each HOLD a core (`_core`):
# they fill its fields, read and write the shared state through them, and
# hand it hooks (callables) for the rare paths. No core calls its owner by
# attribute name.
from libc.stdint cimport int64_t


cdef class PendingAdd:
    cdef public int64_t entry_id
    cdef public object frame
    cdef public object future
    cdef public object callback
    cdef public int64_t length
    cdef public object acked
    cdef public int ack_count
    cdef public bint sent


cdef class AddCore


cdef class AddBatch:
    cdef public object future, error
    cdef public int64_t first_entry_id
    cdef public Py_ssize_t total, count, done, acked
    cdef public bint added, unknown
    cdef _completed(self, int64_t entry_id, err)
    cdef _finish(self)


cdef class AddResponder:
    cdef readonly AddCore core
    cdef readonly object bookie


cdef class AddWindow:
    cdef public AddCore core
    cdef public object loop, error, waiters, drained, last_acknowledged_entry_id
    cdef public Py_ssize_t max_in_flight, in_flight, acknowledged
    cdef public bint reported, closed
    cdef _completed(self, int64_t entry_id, err)


cdef class AddCore:
    # set once by LedgerHandle
    cdef public object ledger_id, bk, loop, framer, frame_small, add_header, master_key
    cdef public Py_ssize_t max_payload_bytes, frame_small_max
    # the ensemble in force (LedgerHandle._set_ensemble): per entry id mod E,
    # `write_sets` are ((RequestCore or client, AddResponder), ...) and
    # `write_set_indexes` the ensemble indexes; `index` is bookie -> index
    cdef public int ensemble_size, write_quorum_size, ack_quorum_size
    cdef public object index, write_sets, write_set_indexes
    # the add state, shared with LedgerHandle's rare paths
    cdef public object pending, failed_bookies, refuse, fixed_lac
    cdef public int64_t lac, last_add_pushed, length_pushed, length_confirmed
    # the acknowledged prefix (BookKeeper's pendingAddsSequenceHead) and its length: the LAC
    # follows it except on a deferred-sync ledger, where only LedgerHandle.force() moves the LAC
    cdef public int64_t last_add_acked, length_acked
    cdef public bint changing, deferred_sync
    # hooks (LedgerHandle's): raise_refused(), raise_too_large(n), send_again(op, indexes),
    # add_failure(bookie, response, err), wake_drain()
    cdef public object raise_refused, raise_too_large, send_again, add_failure, wake_drain

    cdef _check(self, data)
    cdef _payload(self, data)
    cdef _add(self, data, callback)
    cdef _add_response_c(self, bookie, response, err)
    cdef _deliver_c(self)
    cdef _find(self, int64_t entry_id, Py_ssize_t start)


cdef class RequestCore:
    cdef public object bookie_id, loop, protocol, connect_task, sweep_handle
    cdef public dict pending, queued
    cdef public list out
    cdef public Py_ssize_t out_bytes, pending_count
    cdef public bint flush_scheduled, closed
    cdef public double add_timeout_s, read_timeout_s, shortest_timeout_s
    # hooks (BookieClient's): refuse_closed(callback), queue(key, request), arm_sweep(),
    # start_connect(), key_for(protocol, msg) -> key | None | False, promote(key)
    cdef public object refuse_closed, queue, arm_sweep, start_connect, key_for, promote

    cdef send_c(self, tuple key, frame, callback, double timeout_s)
    cdef flush_c(self)
