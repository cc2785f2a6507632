"""The exceptions of the ringfeed client (the packed-format reader has its own ``FormatError``).

Three outcomes of waiting for a batch are kept apart, as ``proto/control.md`` asks: the end of an
epoch is ``StopIteration`` (not an exception of this module), a silent server is ``TimeoutError``,
and a failure is ``ServerError`` (the server said what failed), ``ServerDiedError`` (the connection
closed under us) or ``ProtocolError`` (the peer broke the protocol).

Every message is a lowercase sentence that names the data (socket path, dataset, sample) and, when
a setting fixes the problem, the setting.
"""

from __future__ import annotations

import builtins
from typing import Any

__all__ = ["ProtocolError", "RingfeedError", "ServerDiedError", "ServerError", "TimeoutError"]


class RingfeedError(Exception):
    """Base class of every error the ringfeed client raises about the server or the ring."""


class ProtocolError(RingfeedError):
    """The peer sent something ``proto/control.md`` or ``proto/ring.md`` does not allow.

    A malformed frame, an unknown or unexpected message, a missing member, a ring segment whose
    header is damaged or of a foreign major version. The connection is unusable afterwards.
    """


class ServerError(RingfeedError):
    """The server answered with an ``error`` message (``proto/control.md``, "error").

    Attributes:
        code: ``version``, ``protocol``, ``bad_request``, ``dataset``, ``sample`` or ``internal``.
        message: the server's sentence, naming what failed and the setting to change.
        sample: for ``sample``: the dataset index of the sample that failed, else ``None``.
        key: for ``sample``: that sample's key, else ``None``.
        fatal: whether the server closed the connection after sending it. A ``sample`` error is
            not fatal: it ends the run, and iterating the loader again starts a new one.
    """

    code: str
    message: str
    sample: int | None
    key: str | None
    fatal: bool

    def __init__(
        self, code: str, message: str, sample: int | None = None, key: str | None = None, fatal: bool = True
    ) -> None:
        self.code = code
        self.message = message
        self.sample = sample
        self.key = key
        self.fatal = fatal
        where = ""
        if sample is not None:
            where = f" (sample {sample}" + (f", key {key!r}" if key is not None else "") + ")"
        super().__init__(f"{message}{where} [server error `{code}`]")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.code, self.message, self.sample, self.key, self.fatal))


class ServerDiedError(RingfeedError):
    """The server closed the connection (it exited or was killed) while the client waited on it.

    Raised as soon as the kernel reports end of file or a reset on the socket, never after a
    timeout. Batches delivered so far are recorded in ``Loader.state_dict()``, so a restarted
    server resumes the stream exactly.

    Attributes:
        unread: messages the server sent before closing that were still unread when a send
            failed (the loader raises an ``error`` among them as ``ServerError`` instead).
    """

    unread: list[dict[str, Any]]

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.unread = []


class TimeoutError(RingfeedError, builtins.TimeoutError):
    """No message came from a live server within the ``timeout`` setting.

    Distinct from the end of an epoch (``StopIteration``) and from a dead server
    (``ServerDiedError``). Also an instance of the built-in ``TimeoutError``.
    """
