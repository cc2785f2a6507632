"""What crosses the process boundary to ``ringfeed serve``: the control protocol and the ring.

Layout:

- ``protocol``: the control protocol (``proto/control.md``): version, framing, message checks,
  ``Connection`` (one client's end of the Unix socket).
- ``ring``: the shared-memory ring (``proto/ring.md``): ``struct`` layouts, dtype codes,
  ``Segment`` (the mapping and its zero-copy views).
- ``sidecar``: the default socket, and starting ``ringfeed serve`` when nothing listens there.
- ``observe``: ``snapshot``, a running server's state over an observer connection.

Imports: these modules import the standard library, ``ringfeed.formats`` (the JSON rules the
protocol shares with the shards' metadata, the ring's CRC-32C) and the package's leaves ``ringfeed._errors``
and ``ringfeed._version``; never ``gpu`` or the loader (``tests/test_layout.py`` checks it).
They hold no stream state: a loader's ownership of slots is the loader's (``ringfeed._stream``).
"""
