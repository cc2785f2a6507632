"""The client's GPU work: host-to-device copies off the ring, and hybrid decode's finishing.

Everything here needs torch, and the hybrid decoders need CUDA, nvImageCodec or nvJPEG, or
Triton; nothing is imported by ``import ringfeed``: the loader imports these modules when a
stream asks for them (``device="cuda"``, ``gpu_decode``, ``normalize``).

Layout:

- ``device``: ``CudaCopier`` (pinned copies on a side stream, slot release on the copy's event)
  and ``Normalizer`` (the fused normalisation).
- ``hybrid``: ``Finisher``, hybrid decode's client half (control.md, "Hybrid decode"): decode a
  batch's GPU samples and finish them (crop, antialiased resize, flip) beside the CPU ones.
- ``nvjpeg``: nvJPEG's batched hardware decoder through ``ctypes``, one call a batch without the GIL.
- ``finish_kernel``: the Triton finishing kernel (else ``hybrid``'s batched matrix products).
- ``chroma_kernel``: the Triton kernels that rebuild interpolated chroma after ``nvjpeg``.
- ``ops``: the per-image ops after the geometric prefix (colour, tone, blur, the policies' warps),
  applied to a batch from the server's draws in a table grouped by step and kind.

Imports: these modules import the standard library, numpy, torch and the GPU libraries, one
another and ``ringfeed._errors``; they work on the arrays and tensors they are handed (a slot's
views, its ``gpu_job`` records), so they never import ``wire`` or the loader
(``tests/test_layout.py`` checks it).
"""
