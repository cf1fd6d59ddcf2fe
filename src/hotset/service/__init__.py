"""The multi-job service: one ``hotset serve`` per machine, jobs connect with
``hotset.connect(address)`` and share its sampling (JOADER's DSA) and its cache.

Modules: ``coordinator`` (the control plane, no sockets), ``modes`` (sampling modes and
allocations), ``server`` (``hotset serve``, ``start_service``), ``client`` (``connect``,
``RemotePlanner``). Nothing is imported here, so the coordinator loads without zmq.
"""
