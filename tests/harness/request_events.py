"""Client bytes through the proxy's request framing, for the framing's unit tests.

Owns the head type the tests hand `RequestFraming` (a plain record of what the framing parsed)
and `events_of`, the events a byte stream gives when fed in reads of a chosen size. No tests live
here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.proxy.http1.head_memos import HeadMemos
from gateway.proxy.http1.request_framing import RequestEvent as AnyRequestEvent
from gateway.proxy.http1.request_framing import RequestFraming


@dataclass
class RequestHead:
    """What a head is made into here: the parse as the framing hands it to its owner's `new_head`."""

    method: bytes
    url: bytes
    client_head: bytes
    fields: bytes
    authorization: bytes | None
    chunked: bool
    http10: bool
    keep_alive: bool


RequestEvent = AnyRequestEvent[RequestHead]


def events_of(data: bytes, read_size: int = 65536) -> list[RequestEvent]:
    framing = RequestFraming(RequestHead, HeadMemos())
    events: list[RequestEvent] = []
    for start in range(0, len(data), read_size):
        events += framing.feed(data[start : start + read_size])
    return events
