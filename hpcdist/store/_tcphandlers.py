"""The TCP store server's request handlers (mixed into :class:`~hpcdist.store._tcpserver.TCPServer`).

One method per opcode, found through :meth:`RequestHandlers.handler_table`.
A handler reads its arguments (raising :class:`~hpcdist.store._protocol.ProtocolError`
or ValueError on a malformed request, which drops the connection), changes
the state, and answers through ``_reply`` now or through a parked waiter later.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import _protocol as P
from ._state import KVState

if TYPE_CHECKING:
    from ._tcpserver import _Conn, _Waiter

__all__ = ["RequestHandlers"]


def _ms(arg: bytes) -> float:
    """A timeout argument in milliseconds, as seconds."""
    ms = int(arg)
    if ms < 0:
        raise P.ProtocolError("negative timeout")
    return ms / 1000.0


class RequestHandlers:
    """The store semantics of the server; the server supplies the state and the I/O below."""

    _state: KVState[bytes]
    _joined: int
    _max_frame: int
    _kwait: dict[bytes, list[_Waiter]]
    _qwait: dict[bytes, deque[_Waiter]]
    _jwait: list[_Waiter]

    def _reply(self, conn: _Conn, status: int, parts: list[bytes]) -> None:
        raise NotImplementedError

    def _park(self, conn: _Conn, op: int, keys: list[bytes], timeout: float, n: int = 0) -> None:
        raise NotImplementedError

    def _finish(self, w: _Waiter, status: int, parts: list[bytes]) -> None:
        raise NotImplementedError

    def _notify(self, key: bytes) -> None:
        raise NotImplementedError

    def _notify_queue(self, key: bytes) -> None:
        raise NotImplementedError

    def handler_table(self) -> dict[int, Callable[[_Conn, list[bytes]], None]]:
        """opcode -> bound handler."""
        return {
            P.OP_SET: self._h_set,
            P.OP_GET: self._h_get,
            P.OP_ADD: self._h_add,
            P.OP_COMPARE_SET: self._h_compare_set,
            P.OP_WAIT: self._h_wait,
            P.OP_CHECK: self._h_check,
            P.OP_DELETE: self._h_delete,
            P.OP_NUM_KEYS: self._h_num_keys,
            P.OP_MULTI_GET: self._h_multi_get,
            P.OP_MULTI_SET: self._h_multi_set,
            P.OP_APPEND: self._h_append,
            P.OP_QUEUE_PUSH: self._h_queue_push,
            P.OP_QUEUE_POP: self._h_queue_pop,
            P.OP_QUEUE_LEN: self._h_queue_len,
            P.OP_LIST_KEYS: self._h_list_keys,
            P.OP_JOIN: self._h_join,
            P.OP_WAIT_JOINED: self._h_wait_joined,
            P.OP_PING: self._h_ping,
        }

    def _reply_values(self, conn: _Conn, values: list[bytes], w: _Waiter | None = None) -> None:
        if P.frame_size(values) > self._max_frame:
            status, parts = (
                P.ST_ERROR,
                [b"store", b"reply exceeds max_frame_bytes; fetch the keys one at a time or raise the cap"],
            )
        else:
            status, parts = P.ST_OK, values
        if w is None:
            self._reply(conn, status, parts)
        else:
            self._finish(w, status, parts)

    @staticmethod
    def _nargs(args: list[bytes], n: int) -> None:
        if len(args) != n:
            raise P.ProtocolError(f"expected {n} arguments, got {len(args)}")

    def _h_set(self, conn: _Conn, args: list[bytes]) -> None:
        # No reply (torch's design): the client does not wait for set to be acknowledged.
        self._nargs(args, 2)
        self._state.data[args[0]] = args[1]
        if self._kwait:
            self._notify(args[0])

    def _h_get(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 2)
        value = self._state.data.get(args[1])
        if value is not None:
            self._reply(conn, P.ST_OK, [value])
        else:
            self._park(conn, P.OP_GET, [args[1]], _ms(args[0]))

    def _h_add(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 2)
        amount = int(args[1])
        try:
            total = self._state.add(args[0], amount)
        except ValueError as exc:
            self._reply(conn, P.ST_ERROR, [b"value", str(exc).encode()])
            return
        self._reply(conn, P.ST_OK, [str(total).encode()])
        if self._kwait:
            self._notify(args[0])

    def _h_compare_set(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 3)
        self._reply(conn, P.ST_OK, [self._state.compare_set(args[0], args[1], args[2])])
        if self._kwait:
            self._notify(args[0])

    def _h_wait(self, conn: _Conn, args: list[bytes]) -> None:
        if not args:
            raise P.ProtocolError("wait without a timeout")
        timeout, keys = _ms(args[0]), args[1:]
        if self._state.has_all(keys):
            self._reply(conn, P.ST_OK, [])
        else:
            self._park(conn, P.OP_WAIT, keys, timeout)

    def _h_check(self, conn: _Conn, args: list[bytes]) -> None:
        self._reply(conn, P.ST_OK, [b"1" if self._state.has_all(args) else b"0"])

    def _h_delete(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 1)
        self._reply(conn, P.ST_OK, [b"1" if self._state.delete(args[0]) else b"0"])

    def _h_num_keys(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 0)
        self._reply(conn, P.ST_OK, [str(len(self._state.data)).encode()])

    def _h_multi_get(self, conn: _Conn, args: list[bytes]) -> None:
        if not args:
            raise P.ProtocolError("multi_get without a timeout")
        timeout, keys = _ms(args[0]), args[1:]
        if self._state.has_all(keys):
            data = self._state.data
            self._reply_values(conn, [data[k] for k in keys])
        else:
            self._park(conn, P.OP_MULTI_GET, keys, timeout)

    def _h_multi_set(self, conn: _Conn, args: list[bytes]) -> None:
        if len(args) % 2:
            raise P.ProtocolError("multi_set needs key/value pairs")
        data = self._state.data
        keys = args[0::2]
        data.update(zip(keys, args[1::2]))
        self._reply(conn, P.ST_OK, [])
        if self._kwait:
            for k in keys:
                self._notify(k)

    def _h_append(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 2)
        cur = self._state.data.get(args[0])
        if cur is not None and len(cur) + len(args[1]) + 16 > self._max_frame:
            self._reply(conn, P.ST_ERROR, [b"value", b"append would make the value larger than max_frame_bytes"])
            return
        self._state.append(args[0], args[1])
        self._reply(conn, P.ST_OK, [])
        if self._kwait:
            self._notify(args[0])

    def _h_queue_push(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 2)
        self._state.queue_push(args[0], args[1])
        self._reply(conn, P.ST_OK, [])
        if self._qwait:
            self._notify_queue(args[0])

    def _h_queue_pop(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 2)
        key = args[1]
        value = self._state.queue_pop(key)
        if value is not None:
            self._reply(conn, P.ST_OK, [value])
        elif args[0] == b"":
            self._reply(conn, P.ST_EMPTY, [])
        else:
            self._park(conn, P.OP_QUEUE_POP, [key], _ms(args[0]))

    def _h_queue_len(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 1)
        self._reply(conn, P.ST_OK, [str(self._state.queue_len(args[0])).encode()])

    def _h_list_keys(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 0)
        self._reply_values(conn, list(self._state.data))

    def _h_join(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 0)
        self._joined += 1
        self._reply(conn, P.ST_OK, [str(self._joined).encode()])
        if self._jwait:
            waiting, self._jwait = self._jwait, []
            for w in waiting:
                if w.done:
                    continue
                if self._joined >= w.n:
                    self._finish(w, P.ST_OK, [str(self._joined).encode()])
                else:
                    self._jwait.append(w)

    def _h_wait_joined(self, conn: _Conn, args: list[bytes]) -> None:
        self._nargs(args, 2)
        n = int(args[1])
        if self._joined >= n:
            self._reply(conn, P.ST_OK, [str(self._joined).encode()])
        else:
            self._park(conn, P.OP_WAIT_JOINED, [], _ms(args[0]), n)

    def _h_ping(self, conn: _Conn, args: list[bytes]) -> None:
        self._reply(conn, P.ST_OK, [])
