"""The old name of ``ringfeed.wire.sidecar``, kept because code outside the package imports it
(scripts/wheel_smoke). The same module object, not a copy (private names and module state included);
remove this file once those import ``ringfeed.wire.sidecar``.
"""

import sys

from .wire import sidecar

sys.modules[__name__] = sidecar
