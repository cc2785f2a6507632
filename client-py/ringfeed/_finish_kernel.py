"""The old name of ``ringfeed.gpu.finish_kernel``, kept because code outside the package imports it
(benches/e2e/*: _finish_kernel_before, chroma_fidelity, hybrid_step, nvjpeg_probe). The same module
object, not a copy (private names and module state included); remove this file once those import
``ringfeed.gpu.finish_kernel``.
"""

import sys

from .gpu import finish_kernel

sys.modules[__name__] = finish_kernel
