"""The old name of ``ringfeed.formats.crc32c``, kept because code outside the package imports it
(benches/token_serving.py, benches/token_open.py). The same module object, not a copy (private names
and module state included); remove this file once those import ``ringfeed.formats.crc32c``.
"""

import sys

from .formats import crc32c

sys.modules[__name__] = crc32c
