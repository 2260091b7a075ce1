"""A run of plain transfer frames in one read, handled in one loop: the receiving side's steady state.

Theory of operation
-------------------
The layered path takes each transfer frame through four steps, each with objects of its own:
``FrameReader.next_frame`` (a ``Frame`` tuple and the body copied out of the read buffer), ``decode_performative``
(a ``Transfer``), ``Session.on_transfer`` (window and handle; the payload sliced out of the body again) and
``Link.on_transfer`` (credit and size bound; an 8-tuple back). A sender in its steady state (our client's window of
100, the SDK's sends) sends nothing else, dozens of such frames per socket read; taking them in one loop cut the
broker's instructions per send by 8.5% (bench/amqp_instructions.py --path produce). ``take_transfers`` does it:
the same checks, the same state changes in the same order and the same ``DeliveryReceived`` events, with the payload
copied once, straight out of the read buffer, and no frame, performative or tuple made per frame.

It never decides anything the layered path would decide otherwise. A frame is taken only when it is plain:

* the frame: a whole AMQP frame without extended header (doff 2) within ``max_frame_size``, on a channel whose
  session is mapped;
* its performative: a transfer as a list8 of a handle (uint0 or smalluint), a delivery id (uint0, smalluint or
  uint) and a vbin8 tag, followed by fields seen before whose values ``performatives.PLAIN_TRANSFER_TAILS`` holds:
  no more, aborted, resume, state or rcv-settle-mode (a single-frame delivery whose fields need no checking);
* the session's incoming window is open; the handle is attached to a receiving link with no partial delivery;
  the payload is within the link's size bound.

Anything else (a multi-frame or aborted delivery, a state, a bad handle, a closed window, a delivery too large,
another kind of frame, bytes that do not parse) stops the run before that frame, with nothing of it consumed or
changed: the caller hands it to the layered path, which accepts, reports or fails it exactly as before, and the
run resumes after it. So this module raises nothing for peer input and reports no error itself.

Memory: nothing is kept between calls; the view over the read buffer is released before returning.
"""

from __future__ import annotations

import struct
from typing import Any

from . import codec
from .codec import UInt
from .events import DeliveryReceived, DeliveryRef, Event
from .link import LinkState
from .performatives import PLAIN_TRANSFER_TAILS, RECEIVER
from .session import Session, SessionState

__all__ = ["take_transfers"]

_MASK = 0xFFFFFFFF
# The frame header (as ``framing._HDR``, its doff and type as one 16-bit value), the performative's descriptor and
# list8 constructor as one 32-bit value (0x00 0x53 code 0xC0), the list's size and count, the first field's
# constructor and the two bytes after it: one unpack, and one comparison for each constant part
_HEAD_unpack = struct.Struct(">IHHIBBBBB").unpack_from
_AMQP_FRAME = 0x0200  # doff 2 (no extended header), type 0 (AMQP)
_TRANSFER_LIST8 = 0x005314C0
_B4_unpack = struct.Struct(">BBBB").unpack_from
_B3_unpack = struct.Struct(">BBB").unpack_from
_UINT_TAG_unpack = struct.Struct(">BIBB").unpack_from  # a uint delivery id's constructor and value, the tag's head
_UINTS = codec._UINTS  # small delivery ids, the very ``UInt`` objects the decoder gives
_int_new = int.__new__
_new_ref = tuple.__new__  # DeliveryRef(...) without the NamedTuple's Python-level __new__
_new_event = object.__new__
_MAPPED = SessionState.MAPPED
_ATTACHED = LinkState.ATTACHED
# Reading a frame's fields may run past the bytes buffered when the frame is cut short; such a frame is not plain.
_SHORT = (IndexError, struct.error)


def take_transfers(
    buf: bytearray,
    pos: int,
    max_frame_size: int,
    sessions: dict[int, Session],
    max_message_size: int,
    events: list[Event],
) -> int:
    """Handle the plain transfer frames in ``buf`` from ``pos`` on (``sessions``: the connection's, by remote
    channel; ``max_message_size``: its hard bound), appending their events to ``events``; return where the first
    frame not taken starts (``pos`` itself if none was)."""
    n = len(buf)
    view = memoryview(buf)
    tails = PLAIN_TRANSFER_TAILS
    channel = handle = -1
    session: Any = None
    link: Any = None
    by_handle: dict[int, Any] = {}
    unsettled: dict[int, DeliveryRef] = {}
    limit = 0
    tail_size = count = -1  # the last tail seen (its size, the list's count, its bytes) and its fields
    tail = b""
    fmt: Any = 0
    settled = False
    batchable: Any = False
    try:
        # Offsets inside a frame are kept relative to its start (small ints, which Python does not allocate): an
        # absolute position in a read of dozens of frames is a new int object at every addition.
        last = n - 8  # a frame header fits while ``pos <= last``
        while pos <= last:
            # The frame header and the performative's first bytes in one unpack (an index into the buffer costs
            # about as much as this whole call); a read that ends sooner raises struct.error: not plain.
            size, kind, ch, perf, lsize, fields, c, b15, b16 = _HEAD_unpack(buf, pos)
            if kind != _AMQP_FRAME or size > max_frame_size or size < 17:
                break
            end = pos + size
            if end > n:
                break
            if perf != _TRANSFER_LIST8:  # the performative: a transfer as a list8
                break
            head = 13 + lsize  # the list's end: the payload's offset
            if head > size:
                break
            if c == 0x43:  # the handle: 0 (uint0), then the delivery id's constructor at offset ``r``
                h, c, r = 0, b15, 15
            elif c == 0x52:  # a smalluint handle
                h, c, r = b15, b16, 16
            else:
                break
            if c == 0x70:  # a uint delivery id (any past 255): its value and the tag's head in one unpack
                _, value, c, t = _UINT_TAG_unpack(buf, pos + r)
                did, r = _int_new(UInt, value), r + 7
            elif c == 0x52:
                _, value, c, t = _B4_unpack(buf, pos + r)
                did, r = _UINTS[value], r + 4
            elif c == 0x43:
                _, c, t = _B3_unpack(buf, pos + r)
                did, r = _UINTS[0], r + 3
            else:
                break
            if c != 0xA0:  # the tag: a vbin8 of ``t`` bytes at offset ``r``
                break
            rest = head - r - t  # the fields after the tag (their size)
            if rest < 0:
                break
            s = pos + r
            p = s + t  # the tag's end
            # The fields after the tag: a sender repeats the same few, so the last one's are compared in place (no
            # slice, no key) before they are looked up.
            if rest != tail_size or fields != count or not buf.startswith(tail, p):
                tail_size, count, tail = rest, fields, bytes(view[p : pos + head])
                known = tails.get((count, tail))
                if known is None:
                    break
                fmt, settled, batchable = known
            if ch != channel:  # (a run changes no session's or link's state: what was checked stays true)
                session = sessions.get(ch)
                if session is None or session.state is not _MAPPED:
                    break
                channel, handle = ch, -1
                by_handle, unsettled = session._by_remote_handle, session.incoming_unsettled
            window = session.incoming_window - 1
            if window < 0:
                break
            if h != handle:
                link = by_handle.get(h)
                if link is None or link.role is not RECEIVER or link.state is not _ATTACHED or link._partial:
                    break
                handle = h
                limit = max_message_size
                own = link.max_message_size
                if own and own < limit:
                    limit = own
            length = size - head  # the payload's
            if length > limit:
                break
            if link.format_limits is not None:
                own = link.format_limits.get(fmt)
                if own is not None and length > own:
                    break
            # Plain: what Session.on_transfer and Link.on_transfer do with it, in their order. A serial number's
            # ``(x + 1) & _MASK`` as ``x + 1``, wrapped only past the mask: one int made, not two.
            session.incoming_window = window
            next_id = session.next_incoming_id
            if next_id is not None:
                next_id += 1
                session.next_incoming_id = next_id if next_id <= _MASK else next_id & _MASK
            session.remote_outgoing_window -= 1
            if session.auto_flow and window * 2 < session.configured_incoming_window:
                session.incoming_window = session.configured_incoming_window
                session.connection.send_for_session(session, session.make_flow())
            sent = link.delivery_count + 1
            link.delivery_count = sent if sent <= _MASK else sent & _MASK
            if link.link_credit > 0:
                link.link_credit -= 1
            tag = bytes(view[s:p])
            if not settled:
                unsettled[did] = _new_ref(DeliveryRef, (link, did, tag))
                link.unsettled[tag] = did
            e = _new_event(DeliveryReceived)  # as Session.on_transfer makes it, without the dataclass's __init__
            e.link = link
            e.delivery_id = did
            e.delivery_tag = tag
            e.settled = settled
            e.message_format = fmt
            e.payload = bytes(view[pos + head : end])
            e.state = None
            e.batchable = batchable
            events.append(e)
            pos = end
    except _SHORT:
        pass  # the frame being read is not plain (nothing of it was changed): the layered path reads it
    finally:
        view.release()
    return pos
