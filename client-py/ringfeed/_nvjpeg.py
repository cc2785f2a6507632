"""The old name of ``ringfeed.gpu.nvjpeg``, kept because code outside the package imports it
(benches/e2e/*: chroma_fidelity, hybrid_step, launch_probe, nvjpeg_*). The same module object, not a
copy (private names and module state included); remove this file once those import
``ringfeed.gpu.nvjpeg``.
"""

import sys

from .gpu import nvjpeg

sys.modules[__name__] = nvjpeg
