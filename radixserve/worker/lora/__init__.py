"""The worker's LoRA adapters: host pool and slots (``slots``), a step's deltas (``step``), the
manager the ModelRunner drives (``manager``), and which path a step's row count takes, the native
segmented kernel or stacked GEMMs, timed once per machine and cached (``timing``)."""
