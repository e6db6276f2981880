"""The typed messages between the processes, and the ZeroMQ plumbing that carries them.

Owns: ``server_link`` (server -> scheduler -> detokenizer -> server: ``TokenizedRequest``,
``AbortReq``, ``ControlReq``/``ControlReply``, ``ReqOutput``/``BatchReqOutput``,
``SchedulerStats``), ``worker_link`` (scheduler <-> model worker: ``StepPlan``, ``StepReq``,
``StepResult``, ``WorkerInfo``), ``persist_link`` (warm restart: ``KVSaveReq``,
``KVRestoreReq`` and their replies), ``tier_link`` (the hierarchical cache's moves between the
pool, the host tier and the disk tier: ``KVTierReq`` of ``TierMove``s, ``KVTierReply``),
``lora_link`` (scheduler -> worker LoRA loads and unloads: ``LoRAReq``/``LoRAReply``; the worker's
adapters in ``WorkerInfo.lora``: ``LoRAWorkerInfo``) and ``zmq_utils`` (``IPCAddrs``,
``make_socket``, ``send_obj``/``recv_obj``: one pickled dataclass per message).
Must not touch: any side's behaviour or state -- these are plain data; it imports nothing of
radixserve but ``sampling_params`` and ``lora.adapter`` (``AdapterInfo``), and numpy but never
torch (the server process loads it).
Modules are imported directly; nothing is re-exported here.
"""
