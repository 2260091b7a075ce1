# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
"""The cluster wire's hot record codec, compiled (Cython 3): the same functions as ``wire.py``'s generated pure-Python
code (``held_item_arrays``, ``held_items_of``, ``named_records_of``, ``records_of``, ``locked_of``, ``messages_of``,
the lock tokens both ways), returning exactly the same Python values, so the same bytes go on the wire; and the
frames' packing itself (``pack``: plain values written here, any other by msgpack's packer, the same bytes).

Why compiled, when compiling the hot modules as they are did not pay (docs/performance.md): these functions are all
attribute traffic on one ``__slots__`` class (``Message``) and list building. Compiled untyped code still looks each
attribute up through the type's dictionary and its descriptor; here every slot is read and written *at its offset*
in the object (each slot's member descriptor gives it once, at import), the lists are built with the C API, and a
lock token's 16 bytes are converted to and from its int without a Python call.

Cython, not plain C: a slot at an offset is a two-line C helper (``hc_slot``/``hc_put`` below, in Cython's verbatim C
block), and everything else (tuple unpacking, list literals, error propagation, reference counting) Cython writes.

Safety: the import fails (``ImportError``; ``wire.py`` then keeps its pure code) unless ``Message`` is exactly the
class this module is written for: these slots in this order, each a plain writable object slot, no ``__dict__``, no
base class but ``object``, and ``uuid.UUID`` has its ``int`` and ``is_safe`` slots. ``wire.py`` also hands over its
field tuples (``check_layout``), and the two must agree. A message of any other type (a subclass) goes through the
pure function of the same call (``PURE``), so it behaves exactly as before.

Memory: nothing per call is kept; the module holds the slots' offsets, a few shared constants, and ``pack``'s
buffers for the next packs: at most ``POOL_SIZE`` (4) of at most ``KEEP_BELOW`` (wire.py's, 1 MB) each, each as
large as the largest frame it packed (a frame of a hundred 1 KB messages: 128 KB).
"""

from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_DECREF, Py_XDECREF
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.string cimport memcpy
from libc.stdint cimport uint64_t, int64_t, uint32_t, uint16_t

import uuid as _uuid_module

from ..model.message import BodyType, Message, MessageState

cdef extern from *:
    """
    #include <structmember.h>
    /* A slot's value at its offset in the object (borrowed; NULL if the slot was never set). */
    static CYTHON_INLINE PyObject* hc_slot(PyObject* o, Py_ssize_t off) {
        return *(PyObject**)((char*)o + off);
    }
    /* A slot set to v (a new reference taken), its old value dropped. */
    static CYTHON_INLINE void hc_put(PyObject* o, Py_ssize_t off, PyObject* v) {
        PyObject** p = (PyObject**)((char*)o + off);
        PyObject* old = *p;
        Py_INCREF(v);
        *p = v;
        Py_XDECREF(old);
    }
    /* A member descriptor's slot offset, if it is a plain writable object slot; else -1. */
    static Py_ssize_t hc_member_offset(PyObject* d) {
        if (!Py_IS_TYPE(d, &PyMemberDescr_Type)) return -1;
        PyMemberDef* m = ((PyMemberDescrObject*)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return -1;
        return m->offset;
    }
    /* A new instance of a slots-only type, as object.__new__(t) makes it (all slots NULL). */
    static CYTHON_INLINE PyObject* hc_alloc(PyObject* t) {
        return ((PyTypeObject*)t)->tp_alloc((PyTypeObject*)t, 0);
    }
    /* The int of n big-endian unsigned bytes (int.from_bytes(b, 'big')). */
    static CYTHON_INLINE PyObject* hc_int_of(PyObject* b) {
        return _PyLong_FromByteArray((const unsigned char*)PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b), 0, 0);
    }
    /* A lock token's int and its 16 bytes, both ways. Where an int's layout is known (CPython before 3.12, 30-bit
       digits) straight from and to its five digits: int.from_bytes and int.to_bytes go a byte at a time, ten
       times the instructions. Elsewhere, what int.from_bytes and int.to_bytes call. */
    #if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    #define HC_DIGITS 1
    #endif
    /* The int of 16 big-endian unsigned bytes (int.from_bytes(p[:16], 'big')). */
    static PyObject* hc_int16(const char* s) {
    #ifdef HC_DIGITS
        const unsigned char* p = (const unsigned char*)s;
        uint64_t hi = 0, lo = 0;
        digit d[5];
        Py_ssize_t n = 5;
        PyLongObject* v;
        int k;
        for (k = 0; k < 8; k++) hi = (hi << 8) | p[k];
        for (k = 8; k < 16; k++) lo = (lo << 8) | p[k];
        d[0] = (digit)(lo & PyLong_MASK);
        d[1] = (digit)((lo >> 30) & PyLong_MASK);
        d[2] = (digit)(((lo >> 60) | (hi << 4)) & PyLong_MASK);
        d[3] = (digit)((hi >> 26) & PyLong_MASK);
        d[4] = (digit)(hi >> 56);
        while (n > 0 && d[n - 1] == 0) n--;
        if (n <= 1) return PyLong_FromLong((long)d[0]);  /* small ints are shared: as int.from_bytes gives them */
        v = _PyLong_New(n);
        if (v == NULL) return NULL;
        memcpy(v->ob_digit, d, (size_t)n * sizeof(digit));
        return (PyObject*)v;
    #else
        return _PyLong_FromByteArray((const unsigned char*)s, 16, 0, 0);
    #endif
    }
    /* An int's 16 big-endian unsigned bytes written at buf (int.to_bytes(16, 'big')); -1 with an exception set
       (OverflowError: negative, or 2**128 or more). */
    static int hc_bytes16(PyObject* v, char* buf) {
    #ifdef HC_DIGITS
        Py_ssize_t n = Py_SIZE(v);
        if (n >= 0 && n <= 5) {
            digit d[5] = {0, 0, 0, 0, 0};
            uint64_t hi, lo;
            int k;
            memcpy(d, ((PyLongObject*)v)->ob_digit, (size_t)n * sizeof(digit));
            if (d[4] < 256) {
                lo = (uint64_t)d[0] | ((uint64_t)d[1] << 30) | ((uint64_t)d[2] << 60);
                hi = ((uint64_t)d[2] >> 4) | ((uint64_t)d[3] << 26) | ((uint64_t)d[4] << 56);
                for (k = 7; k >= 0; k--) { buf[k] = (char)(hi & 0xff); hi >>= 8; }
                for (k = 15; k >= 8; k--) { buf[k] = (char)(lo & 0xff); lo >>= 8; }
                return 0;
            }
        }
    #endif
    #if PY_VERSION_HEX >= 0x030D0000
        return _PyLong_AsByteArray((PyLongObject*)v, (unsigned char*)buf, 16, 0, 0, 1);
    #else
        return _PyLong_AsByteArray((PyLongObject*)v, (unsigned char*)buf, 16, 0, 0);
    #endif
    }
    /* dict.pop(key[, deflt]) of an exact dict, in one lookup (deflt NULL: KeyError if key is not there). */
    static PyObject* hc_dict_pop(PyObject* d, PyObject* key, PyObject* deflt) {
    #if PY_VERSION_HEX >= 0x030D0000
        PyObject* result;
        int found = PyDict_Pop(d, key, &result);
        if (found < 0) return NULL;
        if (found) return result;
        if (deflt != NULL) { Py_INCREF(deflt); return deflt; }
        result = PyTuple_Pack(1, key);
        if (result != NULL) { PyErr_SetObject(PyExc_KeyError, result); Py_DECREF(result); }
        return NULL;
    #else
        return _PyDict_Pop(d, key, deflt);
    #endif
    }
    static CYTHON_INLINE PyObject* hc_type(PyObject* o) { return (PyObject*)Py_TYPE(o); }
    static CYTHON_INLINE PyObject** hc_items(PyObject* seq) { return PySequence_Fast_ITEMS(seq); }
    """
    PyObject* hc_slot(PyObject* o, Py_ssize_t off)
    void hc_put(PyObject* o, Py_ssize_t off, PyObject* v)
    Py_ssize_t hc_member_offset(PyObject* d)
    object hc_alloc(PyObject* t)
    object hc_int_of(PyObject* b)
    int hc_bytes16(PyObject* v, char* buf) except -1
    object hc_dict_pop(PyObject* d, PyObject* key, PyObject* deflt)
    PyObject** hc_items(PyObject* seq)
    PyObject* hc_type(PyObject* o)
    object _int16 "hc_int16"(char* p)
    bint PyLong_CheckExact(PyObject* o)
    bint PyBytes_CheckExact(PyObject* o)
    bint PyList_CheckExact(PyObject* o)
    bint PyTuple_CheckExact(PyObject* o)
    bint PyDict_CheckExact(PyObject* o)
    long PyLong_AsLong(PyObject* o) except? -1
    long PyLong_AsLongAndOverflow(PyObject* o, int* overflow) except? -1
    object PyLong_FromLong(long v)
    object PyBytes_FromStringAndSize(char* s, Py_ssize_t n)
    char* PyBytes_AS_STRING(PyObject* o)
    Py_ssize_t PyBytes_GET_SIZE(PyObject* o)
    Py_ssize_t Py_SIZE(PyObject* o)
    PyObject* PyDict_GetItemWithError(object d, object k) except? NULL
    int PyDict_DelItem(object d, object k) except -1
    PyObject* Py_None
    PyObject* Py_True
    PyObject* Py_False
    bint PyFloat_CheckExact(PyObject* o)
    bint PyUnicode_CheckExact(PyObject* o)
    double PyFloat_AS_DOUBLE(PyObject* o)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL
    long long PyLong_AsLongLongAndOverflow(PyObject* o, int* overflow) except? -1
    unsigned long long PyLong_AsUnsignedLongLong(PyObject* o) except? <unsigned long long>-1
    Py_ssize_t PyList_GET_SIZE(PyObject* o)
    PyObject* PyList_GET_ITEM(PyObject* o, Py_ssize_t i)
    Py_ssize_t PyDict_GET_SIZE(PyObject* o)
    int PyDict_Next(PyObject* d, Py_ssize_t* pos, PyObject** key, PyObject** value)

# The fields as ``Message`` must have them, in slot order (checked at import).
_FIELDS = (
    "body", "message_id", "session_id", "partition_key", "correlation_id", "subject", "content_type", "to",
    "reply_to", "reply_to_session_id", "time_to_live", "scheduled_enqueue_time", "application_properties",
    "annotations", "body_type", "sequence_number", "enqueued_time_ms", "expires_at_ms", "delivery_count",
    "lock_token", "locked_until_ms", "state", "dead_letter_reason", "dead_letter_error_description",
    "dead_letter_source", "partition_id", "enqueued_sequence_number", "forward_hops", "wire_sections", "transfer_id",
)
# wire.py's field tuples this code is written for (``check_layout``)
_COMMON = (
    "body", "message_id", "application_properties", "body_type", "sequence_number", "enqueued_time_ms",
    "expires_at_ms", "delivery_count", "lock_token", "locked_until_ms", "state", "partition_id",
    "enqueued_sequence_number", "wire_sections",
)
_RARE = (
    "session_id", "partition_key", "correlation_id", "subject", "content_type", "to", "reply_to",
    "reply_to_session_id", "time_to_live", "scheduled_enqueue_time", "annotations", "dead_letter_reason",
    "dead_letter_error_description", "dead_letter_source", "forward_hops", "transfer_id",
)
_SEND = ("body", "message_id", "application_properties", "body_type", "wire_sections")
_KEPT = ("lock_token", "locked_until_ms", "enqueued_sequence_number")
_SET = ("sequence_number", "enqueued_time_ms", "expires_at_ms", "partition_id", "delivery_count", "state")
_NAMED = ("sequence_number", "enqueued_time_ms", "expires_at_ms", "delivery_count", "lock_token")
_LOCK = ("locked_until_ms", "state", "partition_id")

cdef Py_ssize_t OFF[30]
cdef Py_ssize_t UUID_INT, UUID_SAFE
cdef PyObject* MESSAGE = <PyObject*>Message
cdef PyObject* UUID = <PyObject*>_uuid_module.UUID
cdef PyObject* BODY_TYPE = <PyObject*>BodyType
cdef PyObject* STATE_TYPE = <PyObject*>MessageState
cdef object SAFE_UNKNOWN = _uuid_module.SafeUUID.unknown
cdef object ACTIVE = MessageState.ACTIVE
cdef object ZERO = 0
cdef dict BT = {int(b): b for b in BodyType}
cdef dict ST = {int(s): s for s in MessageState}
# the members by their int where those are 0, 1, 2, ... (else by the dictionaries alone)
cdef tuple BT_MEMBERS = tuple(BT[i] for i in range(len(BT))) if sorted(BT) == list(range(len(BT))) else ()
cdef tuple ST_MEMBERS = tuple(ST[i] for i in range(len(ST))) if sorted(ST) == list(range(len(ST))) else ()
cdef dict PURE = {}  # wire.py's pure functions: what a message of another type (a subclass) goes through


def _layout() -> None:
    """Each slot's offset, or ImportError if ``Message`` or ``uuid.UUID`` is not what this module is written for."""
    global UUID_INT, UUID_SAFE
    cdef Py_ssize_t off
    if (
        tuple(Message.__slots__) != _FIELDS or Message.__bases__ != (object,) or Message.__dictoffset__ != 0
        or Message.__new__ is not object.__new__ or Message.__setattr__ is not object.__setattr__
    ):
        raise ImportError("shardbus.cluster._hopcodec: Message is not the class it was built for")
    for i, name in enumerate(_FIELDS):
        off = hc_member_offset(<PyObject*>Message.__dict__[name])
        if off <= 0:
            raise ImportError(f"shardbus.cluster._hopcodec: Message.{name} is not a plain slot")
        OFF[i] = off
    cls = _uuid_module.UUID
    if cls.__new__ is not object.__new__ or "int" not in cls.__dict__ or "is_safe" not in cls.__dict__:
        raise ImportError("shardbus.cluster._hopcodec: uuid.UUID is not the class it was built for")
    UUID_INT = hc_member_offset(<PyObject*>cls.__dict__["int"])
    UUID_SAFE = hc_member_offset(<PyObject*>cls.__dict__["is_safe"])
    if UUID_INT <= 0 or UUID_SAFE <= 0:
        raise ImportError("shardbus.cluster._hopcodec: uuid.UUID's slots are not plain slots")


_layout()

# slot indexes, in _FIELDS order
cdef enum:
    I_BODY = 0
    I_MESSAGE_ID = 1
    I_SESSION_ID = 2
    I_APP = 12
    I_ANNOTATIONS = 13
    I_BODY_TYPE = 14
    I_SEQ = 15
    I_ENQ_TIME = 16
    I_EXPIRES = 17
    I_DELIVERY = 18
    I_TOKEN = 19
    I_UNTIL = 20
    I_STATE = 21
    I_DL_REASON = 22
    I_DL_SOURCE = 24
    I_PARTITION = 25
    I_ENQ_SEQ = 26
    I_HOPS = 27
    I_WIRE = 28
    I_TRANSFER = 29

# _RARE's slots, in its order
cdef int RARE_IX[16]
for _i, _name in enumerate(_RARE):
    RARE_IX[_i] = _FIELDS.index(_name)


def check_layout(common: tuple, rare: tuple, send: tuple, kept: tuple, set_: tuple, named: tuple, lock: tuple,
                 sent_defaults: tuple, set_defaults: tuple, pure: dict) -> bool:
    """Whether ``wire.py``'s record layout is the one compiled here (if so, ``pure`` is kept: ``PURE``)."""
    same = (
        (common, rare, send, kept, set_, named, lock) == (_COMMON, _RARE, _SEND, _KEPT, _SET, _NAMED, _LOCK)
        and set_defaults == (None, None, None, None, 0, ACTIVE)
        and sent_defaults == set_defaults + (None,) * 14 + (0, None) + (None,) * 3
    )
    if same:
        PURE.update(pure)
    return same


# --- reading and writing slots -------------------------------------------------------------------------------
cdef inline object _get(object m, int i):
    """Slot ``i`` of exact-type message ``m`` (AttributeError if it was never set, as ``m.field`` would)."""
    cdef PyObject* p = hc_slot(<PyObject*>m, OFF[i])
    if p is NULL:
        raise AttributeError(_FIELDS[i])
    return <object>p


cdef inline void _put(object m, int i, object v) noexcept:
    hc_put(<PyObject*>m, OFF[i], <PyObject*>v)


cdef inline void _put_p(object m, int i, PyObject* v) noexcept:
    hc_put(<PyObject*>m, OFF[i], v)


cdef inline int _is_none(object m, int i) except -1:
    cdef PyObject* p = hc_slot(<PyObject*>m, OFF[i])
    if p is NULL:
        raise AttributeError(_FIELDS[i])
    return p == Py_None


cdef inline bint _eq(object a, object b) except -1:
    """``a == b`` as a condition (ints and None without a rich comparison)."""
    if a is b and (a is None or PyLong_CheckExact(<PyObject*>a)):
        return True
    return bool(a == b)


cdef inline object _int0(object x):
    """``x + 0``: an IntEnum member as its plain int."""
    cdef PyObject* t = hc_type(<PyObject*>x)
    if PyLong_CheckExact(<PyObject*>x):
        return x
    if t == BODY_TYPE or t == STATE_TYPE:
        return PyLong_FromLong(PyLong_AsLong(<PyObject*>x))
    return x + 0


cdef inline object _token_bytes(object t):
    """``None if t is None else t.int.to_bytes(16, 'big')``."""
    cdef PyObject* i
    cdef object out
    if t is None:
        return None
    if hc_type(<PyObject*>t) == UUID:
        i = hc_slot(<PyObject*>t, UUID_INT)
        if i is not NULL and PyLong_CheckExact(i):
            out = PyBytes_FromStringAndSize(NULL, 16)
            hc_bytes16(i, PyBytes_AS_STRING(<PyObject*>out))
            return out
    return t.int.to_bytes(16, "big")


cdef inline object _int_of(object token):
    """``int.from_bytes(token, 'big')``."""
    if PyBytes_CheckExact(<PyObject*>token):
        if PyBytes_GET_SIZE(<PyObject*>token) == 16:
            return _int16(PyBytes_AS_STRING(<PyObject*>token))
        return hc_int_of(<PyObject*>token)
    return int.from_bytes(token, "big")


cdef inline object _new_token(object token):
    """The lock token (a UUID made without ``UUID.__init__``) of its 16 bytes."""
    cdef object n = _int_of(token)
    cdef object u = hc_alloc(UUID)
    hc_put(<PyObject*>u, UUID_INT, <PyObject*>n)
    hc_put(<PyObject*>u, UUID_SAFE, <PyObject*>SAFE_UNKNOWN)
    return u


cdef inline object _put_token(object m, object token):
    if token is None:
        _put_p(m, I_TOKEN, Py_None)
    else:
        _put(m, I_TOKEN, _new_token(token))


cdef inline object _enum_of(tuple members, dict table, object value):
    """``table[value]``: a member of an IntEnum by its int (``members`` by index: the usual case, without a hash)."""
    cdef long i
    cdef int overflow = 0
    cdef PyObject* p
    if PyLong_CheckExact(<PyObject*>value):
        i = PyLong_AsLongAndOverflow(<PyObject*>value, &overflow)
        if not overflow and 0 <= i < len(members):
            return members[i]
    p = PyDict_GetItemWithError(table, value)
    if p is NULL:
        raise KeyError(value)
    return <object>p


cdef object _fast(object v, Py_ssize_t n):
    """``v`` as a list or tuple of exactly ``n`` elements (ValueError as tuple unpacking says it)."""
    cdef Py_ssize_t got
    if not (PyList_CheckExact(<PyObject*>v) or PyTuple_CheckExact(<PyObject*>v)):
        v = list(v)
    got = Py_SIZE(<PyObject*>v)
    if got > n:
        raise ValueError(f"too many values to unpack (expected {n})")
    if got < n:
        raise ValueError(f"not enough values to unpack (expected {n}, got {got})")
    return v


cdef inline bint _rare_at_default(object m) except -1:
    cdef int k
    cdef PyObject* p
    for k in range(16):
        if RARE_IX[k] == I_HOPS:
            p = hc_slot(<PyObject*>m, OFF[I_HOPS])
            if p is NULL:
                raise AttributeError("forward_hops")
            if p == <PyObject*>ZERO:
                continue
            if not _eq(<object>p, ZERO):
                return False
        elif not _is_none(m, RARE_IX[k]):
            return False
    return True


cdef inline list _rare_values(object m):
    return [
        _get(m, 2), _get(m, 3), _get(m, 4), _get(m, 5), _get(m, 6), _get(m, 7), _get(m, 8), _get(m, 9),
        _get(m, 10), _get(m, 11), _get(m, 13), _get(m, 22), _get(m, 23), _get(m, 24), _get(m, 27), _get(m, 29),
    ]


cdef list _record(object m):
    """Message ``m``'s compact record (``wire._record``); ``m`` of type ``Message`` exactly."""
    rare = None if _rare_at_default(m) else _rare_values(m)
    return [
        _get(m, I_BODY), _get(m, I_MESSAGE_ID), _get(m, I_APP), _int0(_get(m, I_BODY_TYPE)), _get(m, I_SEQ),
        _get(m, I_ENQ_TIME), _get(m, I_EXPIRES), _get(m, I_DELIVERY), _token_bytes(_get(m, I_TOKEN)),
        _get(m, I_UNTIL), _int0(_get(m, I_STATE)), _get(m, I_PARTITION), _get(m, I_ENQ_SEQ), _get(m, I_WIRE), rare,
    ]


cdef object _from_record(object v):
    """The message of compact record ``v`` (``wire._from_record``)."""
    cdef PyObject** it
    cdef int k
    v = _fast(v, 15)
    it = hc_items(<PyObject*>v)
    m = hc_alloc(MESSAGE)
    _put_p(m, I_BODY, it[0])
    _put_p(m, I_MESSAGE_ID, it[1])
    _put_p(m, I_APP, it[2])
    _put_p(m, I_SEQ, it[4])
    _put_p(m, I_ENQ_TIME, it[5])
    _put_p(m, I_EXPIRES, it[6])
    _put_p(m, I_DELIVERY, it[7])
    _put_p(m, I_UNTIL, it[9])
    _put_p(m, I_PARTITION, it[11])
    _put_p(m, I_ENQ_SEQ, it[12])
    _put_p(m, I_WIRE, it[13])
    rare = <object>it[14]
    if rare is None:
        for k in range(16):
            _put_p(m, RARE_IX[k], Py_None)
        _put(m, I_HOPS, ZERO)
    else:
        _put_rare(m, rare)
    _put(m, I_BODY_TYPE, _enum_of(BT_MEMBERS, BT, <object>it[3]))
    _put(m, I_STATE, _enum_of(ST_MEMBERS, ST, <object>it[10]))
    _put_token(m, <object>it[8])
    return m


cdef inline _put_rare(object m, object rare):
    cdef PyObject** r
    cdef int k
    rare = _fast(rare, 16)
    r = hc_items(<PyObject*>rare)
    for k in range(16):
        _put_p(m, RARE_IX[k], r[k])


cdef bint _all_messages(object messages) except -1:
    for m in messages:
        if hc_type(<PyObject*>m) != MESSAGE:
            return False
    return True


cdef object _pop(object held, object key):
    """``held.pop(key, None)``."""
    if PyDict_CheckExact(<PyObject*>held):
        return hc_dict_pop(<PyObject*>held, <PyObject*>key, Py_None)
    return held.pop(key, None)


cdef object _pop_required(object held, object key):
    """``held.pop(key)``."""
    if PyDict_CheckExact(<PyObject*>held):
        return hc_dict_pop(<PyObject*>held, <PyObject*>key, NULL)
    return held.pop(key)


# --- the hot calls ---------------------------------------------------------------------------------------------
def held_item_arrays(items):
    """``wire.held_item_arrays``, compiled."""
    cdef list out = []
    cdef list sent = []
    cdef bint several = False
    for key, copies in items:
        if len(copies) == 1:
            slot, m = copies[0]
            if hc_type(<PyObject*>m) != MESSAGE:
                return PURE["held_item_arrays"](items)
            if (
                _rare_at_default(m) and _is_none(m, I_TOKEN) and _is_none(m, I_UNTIL) and _is_none(m, I_ENQ_SEQ)
            ):
                extra = None
            else:
                extra = _rare_values(m)
                extra.append(_token_bytes(_get(m, I_TOKEN)))
                extra.append(_get(m, I_UNTIL))
                extra.append(_get(m, I_ENQ_SEQ))
            out.append([
                key, slot, _get(m, I_BODY), _get(m, I_MESSAGE_ID), _get(m, I_APP), _int0(_get(m, I_BODY_TYPE)),
                _get(m, I_WIRE), extra,
            ])
            sent.append(m)
        else:
            several = True
            flat = []
            for slot, m in copies:
                if hc_type(<PyObject*>m) != MESSAGE:
                    return PURE["held_item_arrays"](items)
                flat.append(slot)
                flat.append(_record(m))
            out.append([key, flat])
    return out, (None if several else sent)


def held_items_of(arrays):
    """``wire.held_items_of``, compiled."""
    cdef list out = []
    cdef list messages = []
    cdef bint several = False
    cdef PyObject** it
    cdef PyObject** x
    cdef int k
    for item in arrays:
        if len(item) == 8:
            m = hc_alloc(MESSAGE)
            item = _fast(item, 8)
            it = hc_items(<PyObject*>item)
            _put_p(m, I_BODY, it[2])
            _put_p(m, I_MESSAGE_ID, it[3])
            _put_p(m, I_APP, it[4])
            _put_p(m, I_WIRE, it[6])
            _put(m, I_BODY_TYPE, _enum_of(BT_MEMBERS, BT, <object>it[5]))
            extra = <object>it[7]
            # _SET's defaults
            _put_p(m, I_SEQ, Py_None)
            _put_p(m, I_ENQ_TIME, Py_None)
            _put_p(m, I_EXPIRES, Py_None)
            _put_p(m, I_PARTITION, Py_None)
            _put(m, I_DELIVERY, ZERO)
            _put(m, I_STATE, ACTIVE)
            if extra is None:
                for k in range(16):
                    _put_p(m, RARE_IX[k], Py_None)
                _put(m, I_HOPS, ZERO)
                _put_p(m, I_TOKEN, Py_None)
                _put_p(m, I_UNTIL, Py_None)
                _put_p(m, I_ENQ_SEQ, Py_None)
            else:
                extra = _fast(extra, 19)
                x = hc_items(<PyObject*>extra)
                for k in range(16):
                    _put_p(m, RARE_IX[k], x[k])
                _put_p(m, I_UNTIL, x[17])
                _put_p(m, I_ENQ_SEQ, x[18])
                _put_token(m, <object>x[16])
            out.append((<object>it[0], [(<object>it[1], m)]))
            messages.append(m)
        else:
            several = True
            flat = item[1]
            out.append((item[0], [(flat[i], _from_record(flat[i + 1])) for i in range(0, len(flat), 2)]))
    return out, (None if several else messages)


def named_records_of(messages, held):
    """``wire.named_records_of``, compiled."""
    cdef list out = []
    if not _all_messages(messages):
        return PURE["named_records_of"](messages, held)
    lock = None
    until = state = partition_id = None
    for m in messages:
        if _pop(held, _get(m, I_SEQ)) is m:
            if lock is None:
                until, state, partition_id = _get(m, I_UNTIL), _get(m, I_STATE), _get(m, I_PARTITION)
                lock = [until, state + 0, partition_id]
            if (
                _eq(_get(m, I_UNTIL), until) and _get(m, I_STATE) is state and _eq(_get(m, I_PARTITION), partition_id)
                and _eq(_get(m, I_ENQ_SEQ), _get(m, I_SEQ))
            ):
                out.append([
                    _get(m, I_SEQ), _get(m, I_ENQ_TIME), _get(m, I_EXPIRES), _get(m, I_DELIVERY),
                    _token_bytes(_get(m, I_TOKEN)),
                ])
                continue
        out.append(_record(m))
    return lock, out


def records_of(messages):
    """``wire.records_of``, compiled."""
    cdef list out = []
    if not _all_messages(messages):
        return PURE["records_of"](messages)
    for m in messages:
        out.append(_record(m))
    return out


def messages_of(records):
    """``wire.messages_of``, compiled."""
    cdef list out = []
    for v in records:
        out.append(_from_record(v))
    return out


def locked_of(lock, records, held):
    """``wire.locked_of``, compiled."""
    cdef list out = []
    cdef PyObject** it
    until = state = partition_id = None
    if lock is not None:
        until, state, partition_id = lock
        state = _enum_of(ST_MEMBERS, ST, state)
    for v in records:
        if len(v) == 5:
            m = _pop_required(held, v[0])
            v = _fast(v, 5)
            it = hc_items(<PyObject*>v)
            if hc_type(<PyObject*>m) == MESSAGE:
                _put_p(m, I_SEQ, it[0])
                _put_p(m, I_ENQ_TIME, it[1])
                _put_p(m, I_EXPIRES, it[2])
                _put_p(m, I_DELIVERY, it[3])
                _put(m, I_UNTIL, until)
                _put(m, I_STATE, state)
                _put(m, I_PARTITION, partition_id)
                _put(m, I_ENQ_SEQ, _get(m, I_SEQ))
                _put(m, I_TOKEN, _new_token(<object>it[4]))
            else:
                m.sequence_number, m.enqueued_time_ms, m.expires_at_ms, m.delivery_count, token = v
                m.locked_until_ms = until
                m.state = state
                m.partition_id = partition_id
                m.enqueued_sequence_number = m.sequence_number
                m.lock_token = _new_token(token)
            out.append(m)
            continue
        _pop(held, v[4])
        out.append(_from_record(v))
    return out


def record(m):
    """``wire._record``, compiled: message ``m``'s compact record."""
    if hc_type(<PyObject*>m) != MESSAGE:
        return PURE["_record"](m)
    return _record(m)


def from_record(v):
    """``wire._from_record``, compiled: the message of compact record ``v``."""
    return _from_record(v)


# --- lock tokens ------------------------------------------------------------------------------------------------
def unpack_tokens(data):
    """``wire._unpack_tokens``, compiled: each 16 bytes' int."""
    cdef Py_ssize_t n, i
    cdef char* p
    cdef list out = []
    if not PyBytes_CheckExact(<PyObject*>data) or PyBytes_GET_SIZE(<PyObject*>data) % 16:
        return PURE["_unpack_tokens"](data)
    n = PyBytes_GET_SIZE(<PyObject*>data)
    p = PyBytes_AS_STRING(<PyObject*>data)
    for i in range(0, n, 16):
        out.append(_int16(p + i))
    return out



def token_bytes(tokens):
    """``b"".join([t.int.to_bytes(16, "big") for t in tokens])``, compiled (a ``Tokens`` value)."""
    cdef Py_ssize_t i = 0
    cdef PyObject* v
    cdef object out = PyBytes_FromStringAndSize(NULL, 16 * len(tokens))
    cdef char* p = PyBytes_AS_STRING(<PyObject*>out)
    for t in tokens:
        v = hc_slot(<PyObject*>t, UUID_INT) if hc_type(<PyObject*>t) == UUID else NULL
        if v is NULL or not PyLong_CheckExact(v):
            return PURE["token_bytes"](tokens)
        hc_bytes16(v, p + i)
        i += 16
    return out


def key_bytes(keys):
    """``b"".join([k.to_bytes(16, "big") for k in keys])``, compiled (a ``TokenKeys`` value)."""
    cdef Py_ssize_t i = 0
    cdef object out = PyBytes_FromStringAndSize(NULL, 16 * len(keys))
    cdef char* p = PyBytes_AS_STRING(<PyObject*>out)
    for k in keys:
        if not PyLong_CheckExact(<PyObject*>k):
            return PURE["key_bytes"](keys)
        hc_bytes16(<PyObject*>k, p + i)
        i += 16
    return out


# --- frames packed straight to MessagePack --------------------------------------------------------------------
# A frame's plain values (None, bool, int, float, str, bytes, list, dict: the exact types) written here, each as
# msgpack's packer writes it (the same options as wire.py's: use_bin_type, strict_types, doubles), and any other
# value (an extension value, a tuple, a subclass, an int past 64 bits) by msgpack's packer itself (``fallback``,
# wire.py's ``_pack`` of before), its bytes put in place: MessagePack is context-free, a value's bytes are the same
# packed alone or inside an array, so the frame's bytes are msgpack's to the byte. Saves msgpack's per-value type
# dispatch. Each pack writes into a buffer of its own while it runs (a fallback may run Python code, and other
# threads pack too), taken from and given back to a small pool (below).
cdef object PACK_FALLBACK = None
cdef enum:
    NEST_LIMIT = 256  # deeper than this, msgpack's packer takes the rest (it refuses past its own limit)


cdef struct Buf:
    char* data
    Py_ssize_t size
    Py_ssize_t cap


cdef int _reserve(Buf* b, Py_ssize_t n) except -1:
    cdef Py_ssize_t cap
    cdef char* data
    if b.size + n <= b.cap:
        return 0
    cap = b.cap * 2
    if cap < b.size + n:
        cap = b.size + n
    data = <char*>PyMem_Realloc(b.data, cap)
    if data is NULL:
        raise MemoryError()
    b.data, b.cap = data, cap
    return 0


cdef inline int _write(Buf* b, const char* s, Py_ssize_t n) except -1:
    if b.size + n > b.cap:
        _reserve(b, n)
    memcpy(b.data + b.size, s, n)
    b.size += n
    return 0


cdef inline int _byte(Buf* b, unsigned char c) except -1:
    if b.size + 1 > b.cap:
        _reserve(b, 1)
    b.data[b.size] = <char>c
    b.size += 1
    return 0


cdef inline int _head(Buf* b, unsigned char c, uint64_t v, int n) except -1:
    """Byte ``c`` and ``v`` in ``n`` big-endian bytes."""
    cdef int k
    if b.size + 1 + n > b.cap:
        _reserve(b, 1 + n)
    b.data[b.size] = <char>c
    for k in range(n):
        b.data[b.size + n - k] = <char>(v & 0xff)
        v >>= 8
    b.size += 1 + n
    return 0


cdef inline int _sized(Buf* b, Py_ssize_t n, unsigned char fix, Py_ssize_t fix_below, int c8, unsigned char c16,
                       unsigned char c32) except -1:
    """A container's or a string's header: a fix form below ``fix_below``, else 8 (if ``c8`` >= 0), 16, 32 bits."""
    if n < fix_below:
        return _byte(b, fix | <unsigned char>n)
    if c8 >= 0 and n < 0x100:
        return _head(b, <unsigned char>c8, n, 1)
    if n < 0x10000:
        return _head(b, c16, n, 2)
    if n <= 0xFFFFFFFF:
        return _head(b, c32, n, 4)
    raise ValueError("too large to pack")


cdef int _fallback(Buf* b, object o) except -1:
    cdef bytes data = PACK_FALLBACK(o)
    return _write(b, PyBytes_AS_STRING(<PyObject*>data), PyBytes_GET_SIZE(<PyObject*>data))


cdef int _int(Buf* b, object o) except -1:
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(<PyObject*>o, &overflow)
    cdef unsigned long long u
    if overflow == 0:
        if v >= 0:
            u = <unsigned long long>v
            if u < 0x80:
                return _byte(b, <unsigned char>u)
            if u < 0x100:
                return _head(b, 0xcc, u, 1)
            if u < 0x10000:
                return _head(b, 0xcd, u, 2)
            if u < 0x100000000:
                return _head(b, 0xce, u, 4)
            return _head(b, 0xcf, u, 8)
        if v >= -32:
            return _byte(b, <unsigned char>(v & 0xff))
        if v >= -0x80:
            return _head(b, 0xd0, <uint64_t>v, 1)
        if v >= -0x8000:
            return _head(b, 0xd1, <uint64_t>v, 2)
        if v >= -0x80000000:
            return _head(b, 0xd2, <uint64_t>v, 4)
        return _head(b, 0xd3, <uint64_t>v, 8)
    if overflow > 0 and o <= 0xFFFFFFFFFFFFFFFF:
        return _head(b, 0xcf, PyLong_AsUnsignedLongLong(<PyObject*>o), 8)
    return _fallback(b, o)  # past 64 bits: msgpack's own answer (its default, or OverflowError)


cdef int _value(Buf* b, object o, int depth) except -1:
    cdef PyObject* p = <PyObject*>o
    cdef PyObject* t = hc_type(p)
    cdef Py_ssize_t n, i, pos
    cdef const char* s
    cdef PyObject* k
    cdef PyObject* v
    cdef double d
    cdef uint64_t bits
    if p == Py_None:
        return _byte(b, 0xc0)
    if PyLong_CheckExact(p):
        return _int(b, o)
    if PyBytes_CheckExact(p):
        n = PyBytes_GET_SIZE(p)
        _sized(b, n, 0, 0, 0xc4, 0xc5, 0xc6)
        return _write(b, PyBytes_AS_STRING(p), n)
    if PyUnicode_CheckExact(p):
        s = PyUnicode_AsUTF8AndSize(o, &n)
        _sized(b, n, 0xa0, 32, 0xd9, 0xda, 0xdb)
        return _write(b, s, n)
    if depth >= NEST_LIMIT:
        return _fallback(b, o)
    if PyList_CheckExact(p):
        n = PyList_GET_SIZE(p)
        _sized(b, n, 0x90, 16, -1, 0xdc, 0xdd)
        for i in range(n):
            _value(b, <object>PyList_GET_ITEM(p, i), depth + 1)  # a borrowed item: the list is not changed here
        return 0
    if PyDict_CheckExact(p):
        n = PyDict_GET_SIZE(p)
        _sized(b, n, 0x80, 16, -1, 0xde, 0xdf)
        pos = 0
        while PyDict_Next(p, &pos, &k, &v):
            _value(b, <object>k, depth + 1)
            _value(b, <object>v, depth + 1)
        return 0
    if p == Py_True:
        return _byte(b, 0xc3)
    if p == Py_False:
        return _byte(b, 0xc2)
    if PyFloat_CheckExact(p):
        d = PyFloat_AS_DOUBLE(p)
        memcpy(&bits, &d, 8)
        return _head(b, 0xcb, bits, 8)
    return _fallback(b, o)


# Buffers kept for the next packs (as wire.py's packers are kept: ``records.PackerPool``): one grown to a frame's
# size once is not grown again, copy by copy, for every frame. A pack takes one (a nested pack, or another thread's
# while a fallback runs Python code, takes another) and gives it back if it stayed below ``KEEP_BELOW``.
cdef enum:
    POOL_SIZE = 4
    FIRST_BYTES = 64 * 1024
cdef char* POOL[POOL_SIZE]
cdef Py_ssize_t POOL_CAP[POOL_SIZE]
cdef int POOLED = 0
cdef Py_ssize_t KEEP_BELOW = 1024 * 1024


def pack(value):
    """``value``'s MessagePack bytes, as wire.py's packer makes them (see above)."""
    global POOLED
    cdef Buf b
    if POOLED:
        POOLED -= 1
        b.data, b.cap = POOL[POOLED], POOL_CAP[POOLED]
    else:
        b.data, b.cap = <char*>PyMem_Malloc(FIRST_BYTES), FIRST_BYTES
        if b.data is NULL:
            raise MemoryError()
    b.size = 0
    try:
        _value(&b, value, 0)
        return PyBytes_FromStringAndSize(b.data, b.size)
    finally:
        if b.cap <= KEEP_BELOW and POOLED < POOL_SIZE:
            POOL[POOLED], POOL_CAP[POOLED] = b.data, b.cap
            POOLED += 1
        else:
            PyMem_Free(b.data)


def set_pack_fallback(fallback, keep_below: int) -> None:
    """The packer of every value ``pack`` does not write itself (wire.py's msgpack packer), and the largest buffer
    kept for the next packs."""
    global PACK_FALLBACK, KEEP_BELOW
    PACK_FALLBACK = fallback
    KEEP_BELOW = keep_below
