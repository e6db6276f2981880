"""Linear-layer kinds beyond ``F.linear``, and the calibration the accuracy gate runs on.

- ``linear``: ``QuantLinear`` (int8, w8a8, int4 on torch's and the native kernels) and
  ``quantize_linears``; ``METHODS`` and ``FORMAT_VERSION``
- ``blocked``: weights in the native ``blocked_linear`` kernel's low-bit layout
- ``packed``: ``PackedLinear``, dense weights prepacked once for oneDNN
- ``head``: the int8 LM head for a decode step's few logit rows
- ``calibration``: the fixed fit/check texts, teacher-forced forwards and per-layer input scales
  (``worker/tuning/quant_accuracy.py`` gates a format on them)
"""
