"""The old name of ``ringfeed.gpu.chroma_kernel``, kept because code outside the package imports it
(benches/e2e/*: chroma_fidelity, chroma_kernel_probe, hybrid_step). The same module object, not a
copy (private names and module state included); remove this file once those import
``ringfeed.gpu.chroma_kernel``.
"""

import sys

from .gpu import chroma_kernel

sys.modules[__name__] = chroma_kernel
