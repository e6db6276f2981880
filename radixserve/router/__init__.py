"""The data-parallel router: one HTTP front for several radixserve replicas, routing each
request to the replica most likely to hold its prefix in cache (``radixserve router``)."""
