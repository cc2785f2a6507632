"""The old name of ``ringfeed.formats.tokfile``, kept because code outside the package imports it
(benches/token_serving.py, benches/token_open.py, benches/e2e/gpt_train.py). The same module object,
not a copy (private names and module state included); remove this file once those import
``ringfeed.formats.tokfile``.
"""

import sys

from .formats import tokfile

sys.modules[__name__] = tokfile
