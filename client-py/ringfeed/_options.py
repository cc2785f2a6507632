"""A loader's settings: each checked once, in the constructor, before any connection is tried.

``StreamConfig`` holds what every sample kind's stream takes (``proto/control.md``, "open": the
order, the ranks, the ring, the timeouts, the autotuner); each kind keeps its own options beside it
(``_images.ImageOptions``, ``_tokens.TokenOptions``). The dataclasses are frozen: what the server
was asked for at ``open`` is what a reconnect asks for again.

Every refusal is a ``ValueError`` that names the parameter, the bounds and the value given
(``tests/test_options.py`` pins the messages).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .wire.sidecar import default_socket_path

#: Bounds from control.md, "open".
MAX_BATCH_SIZE = 65536
MAX_SLOTS = 64
MAX_SEED = (1 << 53) - 1
#: The slot header's epoch is a u32.
MAX_EPOCH = (1 << 32) - 1
#: Datasets on object storage (protocol 1.3): sent to the server unchanged.
REMOTE_SCHEME = "s3://"
#: Sample orders (control.md, "Order and randomness", 1.3) and the bounds of their members.
ORDERS = ("auto", "global", "shard_blocks")
MAX_ORDER_BLOCK = 1 << 20
MAX_ORDER_SHARD = 1 << 32


@dataclass(frozen=True)
class StreamConfig:
    """The settings of one stream, whatever its sample kind (see ``Loader``'s arguments)."""

    #: What ``open.dataset`` carries (``dataset_path``).
    path: str
    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    rank: int
    world_size: int
    slots: int
    #: CPU batches that stay valid, ``1 ..= slots``.
    hold: int
    timeout: float | None
    socket_path: str
    #: Start a sidecar at ``socket_path`` when nothing listens there.
    spawn: bool
    spawn_timeout: float
    autotune: bool
    threads: int | None
    prefetch: int | None
    log_every: int | None
    reconnect: int
    reconnect_timeout: float
    on_opening: Callable[[int, float], None] | None
    #: ``"cpu"`` or a CUDA ``torch.device`` (``resolve_device``).
    device: Any
    #: The order asked for (``"auto"`` sends none) and its members; token streams keep the defaults.
    order: str = "auto"
    order_block: int | None = None
    order_shard: int | None = None

    @property
    def cuda(self) -> bool:
        """Whether batches are copied to a CUDA device."""
        return self.device != "cpu" and self.device.type == "cuda"

    @classmethod
    def check(
        cls,
        path: str,
        batch_size: Any,
        *,
        shuffle: Any,
        seed: Any,
        drop_last: Any,
        device: Any,
        rank: Any,
        world_size: Any,
        slots: Any,
        socket: str | os.PathLike[str] | None,
        timeout: Any,
        spawn: Any,
        hold: Any,
        spawn_timeout: Any,
        autotune: Any,
        threads: Any,
        prefetch: Any,
        log_every: Any,
        reconnect: Any,
        reconnect_timeout: Any,
        on_opening: Any = None,
        order: Any = "auto",
        order_block: Any = None,
        order_shard: Any = None,
    ) -> StreamConfig:
        """Checks every setting, in the order of ``Loader``'s arguments (the device last: it may
        import torch), and returns them validated."""
        batch_size = int_in("batch_size", batch_size, 1, MAX_BATCH_SIZE)
        shuffle = boolean("shuffle", shuffle)
        seed = int_in("seed", seed, 0, MAX_SEED)
        drop_last = boolean("drop_last", drop_last)
        rank, world_size = resolve_rank(rank, world_size)
        slots = int_in("slots", slots, 1, MAX_SLOTS)
        timeout = check_timeout("timeout", timeout)
        hold = int_in("hold", hold, 1, slots)
        autotune = boolean("autotune", autotune)
        threads = None if threads is None else int_in("threads", threads, 1, 1024)
        prefetch = None if prefetch is None else int_in("prefetch", prefetch, 1, slots)
        log_every = None if log_every is None else int_in("log_every", log_every, 1, 1 << 30)
        socket_path = os.fspath(socket) if socket is not None else default_socket_path()
        spawn = (socket is None) if spawn is None else boolean("spawn", spawn)
        spawn_timeout = check_timeout("spawn_timeout", spawn_timeout) or 10.0
        reconnect = int_in("reconnect", reconnect, 0, 1 << 30)
        reconnect_timeout = check_timeout("reconnect_timeout", reconnect_timeout) or 30.0
        if on_opening is not None and not callable(on_opening):
            raise ValueError(f"on_opening must be a callable (files_listed, seconds), got {on_opening!r}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        order_block = None if order_block is None else int_in("order_block", order_block, 1, MAX_ORDER_BLOCK)
        order_shard = None if order_shard is None else int_in("order_shard", order_shard, 1, MAX_ORDER_SHARD)
        return cls(
            path, batch_size, shuffle, seed, drop_last, rank, world_size, slots, hold, timeout, socket_path,
            spawn, spawn_timeout, autotune, threads, prefetch, log_every, reconnect, reconnect_timeout,
            on_opening, resolve_device(device), order, order_block, order_shard,
        )  # fmt: skip


def dataset_path(path: str | os.PathLike[str]) -> str:
    """What ``open.dataset`` carries: a local path made absolute, or a remote URL unchanged.

    Absolute without resolving symlinks: what the user named is sent. A remote dataset
    (``s3://bucket/prefix``, protocol 1.3) is fetched by the server with its own credentials
    (docs/remote.md).
    """
    p = os.fspath(path)
    if isinstance(p, str) and p.startswith(REMOTE_SCHEME):
        return p
    return os.path.abspath(p)  # noqa: PTH100


def int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..={hi}, got {value!r}")
    return int(value)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_timeout(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


def env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"the environment variable {name}={raw!r} is not an integer") from None


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)`` from the arguments, else torchrun's ``RANK``/``WORLD_SIZE``, else ``(0, 1)``."""
    if rank is None:
        rank = env_int("RANK")
    if world_size is None:
        world_size = env_int("WORLD_SIZE")
    world_size = 1 if world_size is None else world_size
    rank = 0 if rank is None else rank
    world_size = int_in("world_size", world_size, 1, MAX_SEED)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in 0..{world_size} (world_size={world_size}), got {rank!r}")
    return rank, world_size


def resolve_device(device: Any) -> Any:
    """``"cpu"`` stays a string (no torch needed); anything else becomes a ``torch.device``.

    ``"cuda"`` without an index is ``cuda:$LOCAL_RANK`` under torchrun, else the current device.
    """
    if device == "cpu":
        return "cpu"
    try:
        import torch
    except ImportError:
        raise ValueError(f"device={device!r} needs torch, which is not installed") from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}") from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise ValueError(f"device must be the CPU or a CUDA device, got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but CUDA is not available (torch.cuda.is_available() is False)")
    if dev.index is None:
        local = env_int("LOCAL_RANK")
        dev = torch.device("cuda", local if local is not None else torch.cuda.current_device())
    if not 0 <= dev.index < torch.cuda.device_count():
        raise ValueError(f"device {dev} does not exist: this process sees {torch.cuda.device_count()} CUDA devices")
    return dev
