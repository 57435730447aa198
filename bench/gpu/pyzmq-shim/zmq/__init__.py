"""A stand-in for pyzmq on a machine that has no pyzmq and cannot install it
(the lent GPU machine), for bench/gpu/serve.sh only: the part of pyzmq's API
that the model worker uses (python/baton_worker/runtime/server.py: Context, PUSH and
PULL sockets, LINGER, connect, send, recv, close, term), in ctypes over the
libzmq that pyzmq's own manylinux wheel vendors. bench/gpu/pack.sh puts that
libzmq (and its libsodium) beside this file in .libs/ when no pyzmq wheel for
the GPU machine's Python can be downloaded; serve.sh installs both into a
folder on PYTHONPATH. $BATON_LIBZMQ names another libzmq.so.5.

Blocking calls release the GIL (ctypes.CDLL does), and a call interrupted by a
signal (EINTR) is retried after Python has run its signal handlers, as pyzmq
does. recv always returns bytes (copy=False too); send copies its buffer into
the message, which libzmq owns from then on.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import glob
import os

__all__ = ["Context", "Socket", "Poller", "ZMQError", "Again", "ContextTerminated", "zmq_version", "pyzmq_version"]

# Socket types, options and flags (zmq.h).
PAIR, PUB, SUB, REQ, REP, DEALER, ROUTER, PULL, PUSH, XPUB, XSUB = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
LINGER = 17
SNDHWM, RCVHWM = 23, 24
RCVTIMEO, SNDTIMEO = 27, 28
IMMEDIATE = 39
NOBLOCK = DONTWAIT = 1
SNDMORE = 2
POLLIN, POLLOUT = 1, 2
EAGAIN = _errno.EAGAIN
EINTR = _errno.EINTR
_HAUSNUMERO = 156384712
ETERM = _HAUSNUMERO + 53

__version__ = "0+baton-ctypes-shim"
SHIM = True


def _load() -> ctypes.CDLL:
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ["BATON_LIBZMQ"]] if os.environ.get("BATON_LIBZMQ") else []
    candidates += sorted(glob.glob(os.path.join(here, ".libs", "libzmq*.so*")))
    candidates += ["libzmq.so.5"]
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path, use_errno=True)
        except OSError as error:
            errors.append(f"{path}: {error}")
    raise ImportError("zmq (baton's ctypes stand-in): no libzmq could be loaded: " + "; ".join(errors))


_lib = _load()
_lib.zmq_ctx_new.restype = ctypes.c_void_p
_lib.zmq_ctx_new.argtypes = []
_lib.zmq_ctx_term.restype = ctypes.c_int
_lib.zmq_ctx_term.argtypes = [ctypes.c_void_p]
_lib.zmq_socket.restype = ctypes.c_void_p
_lib.zmq_socket.argtypes = [ctypes.c_void_p, ctypes.c_int]
_lib.zmq_close.restype = ctypes.c_int
_lib.zmq_close.argtypes = [ctypes.c_void_p]
_lib.zmq_setsockopt.restype = ctypes.c_int
_lib.zmq_setsockopt.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
_lib.zmq_getsockopt.restype = ctypes.c_int
_lib.zmq_getsockopt.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
_lib.zmq_connect.restype = ctypes.c_int
_lib.zmq_connect.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_lib.zmq_bind.restype = ctypes.c_int
_lib.zmq_bind.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_lib.zmq_send.restype = ctypes.c_int
_lib.zmq_send.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_lib.zmq_msg_init.restype = ctypes.c_int
_lib.zmq_msg_recv.restype = ctypes.c_int
_lib.zmq_msg_data.restype = ctypes.c_void_p
_lib.zmq_msg_size.restype = ctypes.c_size_t
_lib.zmq_msg_close.restype = ctypes.c_int
_lib.zmq_errno.restype = ctypes.c_int
_lib.zmq_strerror.restype = ctypes.c_char_p
_lib.zmq_strerror.argtypes = [ctypes.c_int]
class _PollItem(ctypes.Structure):
    """zmq_pollitem_t on POSIX."""

    _fields_ = [("socket", ctypes.c_void_p), ("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


_lib.zmq_poll.restype = ctypes.c_int
_lib.zmq_poll.argtypes = [ctypes.POINTER(_PollItem), ctypes.c_int, ctypes.c_long]
_lib.zmq_version.restype = None
_lib.zmq_version.argtypes = [ctypes.POINTER(ctypes.c_int)] * 3


class _Msg(ctypes.Structure):
    """zmq_msg_t: 64 opaque bytes, pointer-aligned."""

    _fields_ = [("_", ctypes.c_uint64 * 8)]


_lib.zmq_msg_init.argtypes = [ctypes.POINTER(_Msg)]
_lib.zmq_msg_recv.argtypes = [ctypes.POINTER(_Msg), ctypes.c_void_p, ctypes.c_int]
_lib.zmq_msg_data.argtypes = [ctypes.POINTER(_Msg)]
_lib.zmq_msg_size.argtypes = [ctypes.POINTER(_Msg)]
_lib.zmq_msg_close.argtypes = [ctypes.POINTER(_Msg)]


class ZMQError(Exception):
    def __init__(self, errno: int | None = None, msg: str | None = None):
        self.errno = _lib.zmq_errno() if errno is None else errno
        self.strerror = msg if msg is not None else _lib.zmq_strerror(self.errno).decode(errors="replace")
        super().__init__(self.strerror)

    def __str__(self) -> str:
        return self.strerror


class Again(ZMQError):
    pass


class ContextTerminated(ZMQError):
    pass


def _raise_last() -> None:
    code = _lib.zmq_errno()
    cls = Again if code == EAGAIN else ContextTerminated if code == ETERM else ZMQError
    raise cls(code)


def zmq_version() -> str:
    parts = [ctypes.c_int() for _ in range(3)]
    _lib.zmq_version(*[ctypes.byref(p) for p in parts])
    return ".".join(str(p.value) for p in parts)


def pyzmq_version() -> str:
    return __version__


def _poll(pairs: list, timeout) -> list[int]:
    """zmq_poll over (socket, events) pairs; timeout in ms, None or negative: forever. The revents of each."""
    items = (_PollItem * len(pairs))()
    for item, (sock, events) in zip(items, pairs):
        item.socket, item.fd, item.events, item.revents = sock._check(), 0, events, 0
    ms = -1 if timeout is None or timeout < 0 else int(timeout)
    while _lib.zmq_poll(items, len(pairs), ms) < 0:
        if _lib.zmq_errno() != EINTR:
            _raise_last()
    return [item.revents for item in items]


class Socket:
    def __init__(self, context: "Context", socket_type: int):
        handle = _lib.zmq_socket(context._handle, socket_type)
        if not handle:
            _raise_last()
        self._handle = handle
        self.context = context
        self.socket_type = socket_type
        context._sockets.add(self)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _check(self) -> int:
        if self._handle is None:
            raise ZMQError(_errno.ENOTSOCK)
        return self._handle

    def setsockopt(self, option: int, value) -> None:
        if isinstance(value, (bytes, bytearray)):
            buf = ctypes.create_string_buffer(bytes(value), len(value))
            size = len(value)
        else:
            buf = ctypes.c_int(int(value))
            size = ctypes.sizeof(buf)
        if _lib.zmq_setsockopt(self._check(), option, ctypes.byref(buf), size) != 0:
            _raise_last()

    set = setsockopt

    def getsockopt(self, option: int) -> int:
        value = ctypes.c_int()
        size = ctypes.c_size_t(ctypes.sizeof(value))
        if _lib.zmq_getsockopt(self._check(), option, ctypes.byref(value), ctypes.byref(size)) != 0:
            _raise_last()
        return value.value

    get = getsockopt

    def connect(self, addr: str) -> None:
        if _lib.zmq_connect(self._check(), addr.encode()) != 0:
            _raise_last()

    def bind(self, addr: str) -> None:
        if _lib.zmq_bind(self._check(), addr.encode()) != 0:
            _raise_last()

    def send(self, data, flags: int = 0, copy: bool = True, track: bool = False) -> None:
        if not isinstance(data, bytes):
            data = bytes(data)  # bytearray, memoryview, numpy buffers
        handle = self._check()
        while True:
            # A bytes argument of a c_void_p parameter passes a pointer to its buffer (no copy).
            if _lib.zmq_send(handle, data, len(data), flags) >= 0:
                return
            if _lib.zmq_errno() != EINTR:
                _raise_last()

    def send_multipart(self, parts, flags: int = 0, copy: bool = True, track: bool = False) -> None:
        parts = list(parts)
        for i, part in enumerate(parts):
            self.send(part, flags | (SNDMORE if i < len(parts) - 1 else 0))

    def recv(self, flags: int = 0, copy: bool = True, track: bool = False) -> bytes:
        handle = self._check()
        msg = _Msg()
        if _lib.zmq_msg_init(ctypes.byref(msg)) != 0:
            _raise_last()
        try:
            while _lib.zmq_msg_recv(ctypes.byref(msg), handle, flags) < 0:
                if _lib.zmq_errno() != EINTR:
                    _raise_last()
            size = _lib.zmq_msg_size(ctypes.byref(msg))
            return ctypes.string_at(_lib.zmq_msg_data(ctypes.byref(msg)), size) if size else b""
        finally:
            _lib.zmq_msg_close(ctypes.byref(msg))

    def poll(self, timeout=None, flags: int = POLLIN) -> int:
        """The events of flags that are ready within timeout ms (None: wait for one); 0 if none."""
        return _poll([(self, flags)], timeout)[0]

    def close(self, linger: int | None = None) -> None:
        if self._handle is None:
            return
        if linger is not None:
            self.setsockopt(LINGER, linger)
        _lib.zmq_close(self._handle)
        self._handle = None
        self.context._sockets.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Poller:
    def __init__(self):
        self.sockets: dict[Socket, int] = {}

    def register(self, socket: Socket, flags: int = POLLIN | POLLOUT) -> None:
        if flags:
            self.sockets[socket] = flags
        else:
            self.sockets.pop(socket, None)

    modify = register

    def unregister(self, socket: Socket) -> None:
        del self.sockets[socket]

    def poll(self, timeout=None) -> list[tuple[Socket, int]]:
        pairs = list(self.sockets.items())
        if not pairs:
            return []
        return [(sock, revents) for (sock, _), revents in zip(pairs, _poll(pairs, timeout)) if revents]


class Context:
    _instance: "Context | None" = None

    def __init__(self, io_threads: int = 1):
        handle = _lib.zmq_ctx_new()
        if not handle:
            _raise_last()
        self._handle = handle
        self._sockets: set[Socket] = set()

    @classmethod
    def instance(cls) -> "Context":
        if cls._instance is None or cls._instance.closed:
            cls._instance = cls()
        return cls._instance

    @property
    def closed(self) -> bool:
        return self._handle is None

    def socket(self, socket_type: int) -> Socket:
        if self._handle is None:
            raise ContextTerminated(ETERM)
        return Socket(self, socket_type)

    def term(self) -> None:
        """Blocks until every socket is closed and its queued messages are sent or its linger is over."""
        if self._handle is None:
            return
        while _lib.zmq_ctx_term(self._handle) != 0:
            if _lib.zmq_errno() != EINTR:
                _raise_last()
        self._handle = None

    def destroy(self, linger: int | None = None) -> None:
        for sock in list(self._sockets):
            sock.close(linger)
        self.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()
