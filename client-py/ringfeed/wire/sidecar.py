"""Finding the server's socket, and starting a sidecar server when nothing listens there.

``proto/control.md`` ("Transport") fixes the default socket path. Starting ``ringfeed serve`` for
the user when nothing answers is the embedded default (``DESIGN.md`` §8); in production the
sidecar is started once per node and the loaders only connect.

Invariants:

- Nothing is ever probed with a throwaway connection: a server started with ``--exit-when-idle``
  may take a closed probe for its last client leaving. The connection that answers is the one
  the loader keeps.
- Local ranks that find no server at the same moment start one between them, not one each: the
  check-and-start runs under an ``flock`` on ``SOCKET.lock`` next to the socket.
- The sidecar runs in its own session (a Ctrl-C to the training job's process group does not
  reach it; it exits by itself when idle), with stdin closed and stdout and stderr appended to a
  log file whose path every error about it names.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

from .._errors import RingfeedError
from .protocol import Connection

__all__ = ["connect", "default_socket_path", "find_server_binary", "installed_binary"]

#: Environment variable naming the socket (``ringfeed serve --socket`` overrides it server-side).
SOCKET_ENV = "RINGFEED_SOCKET"
#: Environment variable naming the ``ringfeed`` binary to start.
BIN_ENV = "RINGFEED_BIN"

# Sidecars this process started. Kept so that their Popen objects are never collected while the
# server runs (which would warn), and so that their exit status is reaped.
_SPAWNED: list[subprocess.Popen[bytes]] = []


def default_socket_path() -> str:
    """The socket to use when none is given (control.md, "Transport").

    ``$RINGFEED_SOCKET``, else ``$XDG_RUNTIME_DIR/ringfeed/ringfeed.sock``, else
    ``/tmp/ringfeed-$UID/ringfeed.sock``.
    """
    env = os.environ.get(SOCKET_ENV)
    if env:
        return env
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return str(Path(runtime) / "ringfeed" / "ringfeed.sock")
    return f"/tmp/ringfeed-{os.getuid()}/ringfeed.sock"


def find_server_binary() -> str | None:
    """The ``ringfeed`` binary to start: ``$RINGFEED_BIN``, else the one installed with this
    package (the wheel puts it in the environment's ``bin/``), else ``ringfeed`` on ``PATH``.

    The installed one comes before ``PATH`` so that the server started is the build that came
    with this client, not an older binary that happens to be on ``PATH``.
    """
    env = os.environ.get(BIN_ENV)
    if env:
        return env
    return installed_binary() or shutil.which("ringfeed")


def installed_binary() -> str | None:
    """The ``ringfeed`` binary that pip installed together with this very package, or ``None``.

    Read from the installed distribution's file list (its ``RECORD``), so it is found wherever
    the scripts went (a virtualenv's ``bin/``, ``~/.local/bin`` for ``--user``, a ``--prefix``).
    Only a distribution whose ``ringfeed/__init__.py`` is the one imported counts: a checkout on
    ``PYTHONPATH`` does not start the binary of another installed copy.
    """
    from importlib import metadata

    try:
        files = metadata.distribution("ringfeed").files or []
    except metadata.PackageNotFoundError:
        return None
    here = Path(__file__).resolve().parents[1] / "__init__.py"  # the ringfeed package, above wire/
    mine, binary = False, None
    for f in files:
        if f.parts[-2:] == ("ringfeed", "__init__.py"):
            mine = Path(str(f.locate())).resolve() == here
        elif f.parts[-2:] == ("bin", "ringfeed"):
            binary = Path(str(f.locate())).resolve()
    if mine and binary is not None and binary.is_file() and os.access(binary, os.X_OK):
        return str(binary)
    return None


def log_path(socket_path: str) -> str:
    """Where a sidecar started for ``socket_path`` writes its log: next to the socket."""
    stem = socket_path[: -len(".sock")] if socket_path.endswith(".sock") else socket_path
    return stem + ".log"


def _try_connect(path: str, timeout: float | None, hint: str) -> Connection | None:
    """Connects, or returns ``None`` when nothing listens at ``path`` (no file, or refused)."""
    try:
        return Connection.connect(path, timeout=timeout, timeout_hint=hint)
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    except OSError as e:
        raise RingfeedError(f"cannot connect to the ringfeed server socket {path}: {e.strerror or e}") from e


def connect(
    path: str, *, spawn: bool, timeout: float | None, timeout_hint: str = "", spawn_timeout: float = 10.0
) -> tuple[Connection, str | None]:
    """Connects to the server at ``path``, starting a sidecar there first if allowed and needed.

    Returns the connection and the sidecar's log file (``None`` when this call started nothing).

    Raises:
        RingfeedError: nothing listens and ``spawn`` is false; no binary to start; the sidecar
            exited or did not listen within ``spawn_timeout`` seconds (the message names its log).
    """
    conn = _try_connect(path, timeout, timeout_hint)
    if conn is not None:
        return conn, None
    if not spawn:
        raise RingfeedError(
            f"no ringfeed server is listening at {path}: start one with `ringfeed serve --socket {path}`, "
            f"or pass server=ringfeed.Server(spawn=True) to let the loader start it"
        )
    directory = Path(path).parent
    try:
        # Mode 0700, as the server makes it (control.md, "Transport").
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = open(path + ".lock", "ab")  # noqa: SIM115 - closed in the finally below
    except OSError as e:
        raise RingfeedError(f"cannot prepare the socket directory {directory}: {e.strerror or e}") from e
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        # Another local rank may have started the server while this one waited for the lock.
        conn = _try_connect(path, timeout, timeout_hint)
        if conn is not None:
            return conn, None
        return _spawn(path, timeout, timeout_hint, spawn_timeout)
    finally:
        lock.close()


def _spawn(path: str, timeout: float | None, hint: str, spawn_timeout: float) -> tuple[Connection, str]:
    binary = find_server_binary()
    if binary is None:
        raise RingfeedError(
            f"no ringfeed server is listening at {path}, and no `ringfeed` binary was found to start one: "
            f"install the wheel (`pip install .` from the repository), put it on PATH, set {BIN_ENV}, "
            f"or start `ringfeed serve --socket {path}` yourself"
        )
    log = log_path(path)
    argv = [binary, "serve", "--exit-when-idle", "--socket", path]
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True
            )
    except OSError as e:
        raise RingfeedError(f"cannot start `{' '.join(argv)}`: {e.strerror or e} (log: {log})") from e
    _SPAWNED[:] = [p for p in _SPAWNED if p.poll() is None]  # reap sidecars that exited since
    _SPAWNED.append(proc)
    deadline = time.monotonic() + spawn_timeout
    delay = 0.005
    while True:
        conn = _try_connect(path, timeout, hint)
        if conn is not None:
            return conn, log
        status = proc.poll()
        if status is not None:
            raise RingfeedError(
                f"`{' '.join(argv)}` exited with status {status} before listening at {path}; "
                f"its log {log} ends with:\n{_tail(log)}"
            )
        if time.monotonic() >= deadline:
            raise RingfeedError(
                f"`{' '.join(argv)}` (pid {proc.pid}) did not listen at {path} within {spawn_timeout} s; "
                f"see its log {log}"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _tail(path: str, limit: int = 2000) -> str:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - limit))
        return f.read().decode("utf-8", "replace").rstrip() or "(nothing)"
    return "(unreadable)"
