"""Wire format of the TCP store: length-prefixed binary frames, opcodes, statuses.

Every message, in both directions, is one *frame*::

    u32 length          big-endian; the number of bytes that follow (>= 1)
    u8  code            an opcode (client -> server) or a status (server -> client)
    repeated:           zero or more arguments, each
        u32 n           big-endian argument length
        n bytes         the argument

Numbers travel as ASCII decimal arguments (``b"42"``), keys as UTF-8. Nothing
is ever pickled. A frame whose length exceeds the receiver's cap, whose
arguments overrun the frame, or whose opcode is unknown is *malformed*: the
receiver drops that one connection.

Connection set-up (see :mod:`hpcdist.store._auth`)::

    server -> HELLO  [MAGIC, flags, server_nonce]
    client -> AUTH   [client_nonce, mac]          (mac empty without a secret)
    server -> OK     [server_proof]               or AUTH_FAILED [message], then close
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

__all__ = [
    "DEFAULT_MAX_FRAME",
    "LEN",
    "MAGIC",
    "PREAUTH_MAX_FRAME",
    "ProtocolError",
    "encode",
    "split_args",
]

#: Identifies an hpcdist store server (first argument of HELLO); bump on an incompatible change.
MAGIC = b"HPCDSTO1"
#: HELLO flag: the server requires HMAC authentication.
FLAG_AUTH = 1

#: Default cap on a frame: a 64 MiB value plus headers fits with a wide margin.
DEFAULT_MAX_FRAME = 256 * 1024 * 1024
#: Cap on frames before a connection authenticated: an unauthenticated peer
#: cannot make the server allocate more than this.
PREAUTH_MAX_FRAME = 1024
#: Largest value of ``max_frame_bytes`` the u32 length field can express.
MAX_FRAME_LIMIT = 2**32 - 1

LEN = struct.Struct("!I")
HEADER = struct.Struct("!IB")

# --- opcodes (client -> server) -------------------------------------------------
OP_HELLO = 1  # server -> client greeting (uses the opcode space)
OP_AUTH = 2
OP_SET = 10  # [key, value]; the server sends no reply
OP_GET = 11  # [timeout_ms, key]
OP_ADD = 12  # [key, amount]
OP_COMPARE_SET = 13  # [key, expected, desired]
OP_WAIT = 14  # [timeout_ms, key...]
OP_CHECK = 15  # [key...]
OP_DELETE = 16  # [key]
OP_NUM_KEYS = 17
OP_MULTI_GET = 18  # [timeout_ms, key...]
OP_MULTI_SET = 19  # [key, value, key, value...]
OP_APPEND = 20  # [key, value]
OP_QUEUE_PUSH = 21  # [key, value]
OP_QUEUE_POP = 22  # [timeout_ms or b"" for non-blocking, key]
OP_QUEUE_LEN = 23  # [key]
OP_LIST_KEYS = 24
OP_JOIN = 25  # -> [joined]
OP_WAIT_JOINED = 26  # [timeout_ms, n] -> [joined]
OP_PING = 27

#: Human-readable names, for error messages.
OP_NAMES: dict[int, str] = {
    OP_SET: "set",
    OP_GET: "get",
    OP_ADD: "add",
    OP_COMPARE_SET: "compare_set",
    OP_WAIT: "wait",
    OP_CHECK: "check",
    OP_DELETE: "delete_key",
    OP_NUM_KEYS: "num_keys",
    OP_MULTI_GET: "multi_get",
    OP_MULTI_SET: "multi_set",
    OP_APPEND: "append",
    OP_QUEUE_PUSH: "queue_push",
    OP_QUEUE_POP: "queue_pop",
    OP_QUEUE_LEN: "queue_len",
    OP_LIST_KEYS: "list_keys",
    OP_JOIN: "join",
    OP_WAIT_JOINED: "wait_for_workers",
    OP_PING: "ping",
    OP_AUTH: "auth",
}

# --- statuses (server -> client) -------------------------------------------------
ST_OK = 0
ST_ERROR = 1  # [kind, message]; kind b"value" -> ValueError, b"store" -> DistStoreError
ST_TIMEOUT = 2  # [missing key...] or [joined] for WAIT_JOINED
ST_EMPTY = 3  # non-blocking queue_pop on an empty queue
ST_AUTH_FAILED = 4  # [message]


class ProtocolError(Exception):
    """A frame broke the wire format; the connection that sent it is dropped."""


def encode(code: int, parts: Sequence[bytes]) -> list[bytes]:
    """The frame for ``code`` and ``parts`` as a list of buffers to send in order.

    Small frames come back as one joined buffer; a large argument stays a
    separate element so it is never copied.
    """
    size = 1 + 4 * len(parts)
    for p in parts:
        size += len(p)
    if size > MAX_FRAME_LIMIT:
        raise ProtocolError(f"frame of {size} bytes exceeds the u32 length field")
    pieces: list[bytes] = [HEADER.pack(size, code)]
    pack = LEN.pack
    for p in parts:
        pieces.append(pack(len(p)))
        pieces.append(p)
    if size <= 65536:
        return [b"".join(pieces)]
    # Keep big arguments out of the join so they are not copied.
    out: list[bytes] = []
    small: list[bytes] = []
    for piece in pieces:
        if len(piece) > 65536:
            if small:
                out.append(b"".join(small))
                small = []
            out.append(piece)
        else:
            small.append(piece)
    if small:
        out.append(b"".join(small))
    return out


def frame_size(parts: Sequence[bytes]) -> int:
    """Size of the body of a frame carrying ``parts`` (what the length field holds)."""
    return 1 + sum(4 + len(p) for p in parts)


def split_args(body: bytes | bytearray | memoryview, start: int = 1) -> list[bytes]:
    """Split the arguments of a frame body (starting after the code byte).

    Raises :class:`ProtocolError` when an argument overruns the body.
    """
    out: list[bytes] = []
    pos = start
    end = len(body)
    unpack = LEN.unpack_from
    while pos < end:
        if pos + 4 > end:
            raise ProtocolError("truncated argument length")
        (n,) = unpack(body, pos)
        pos += 4
        if pos + n > end:
            raise ProtocolError(f"argument of {n} bytes overruns the frame")
        out.append(bytes(body[pos : pos + n]))
        pos += n
    return out
