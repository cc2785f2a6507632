"""The old name of ``ringfeed.gpu.hybrid``, kept because code outside the package imports it
(benches/e2e/hybrid_profile.py, benches/e2e/hybrid_step.py). The same module object, not a copy
(private names and module state included); remove this file once those import
``ringfeed.gpu.hybrid``.
"""

import sys

from .gpu import hybrid

sys.modules[__name__] = hybrid
