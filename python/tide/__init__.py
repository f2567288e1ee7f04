"""tide: a native runtime for fault-tolerant and elastic distributed training.

From Python, tide serves as a backend of torch.distributed.rpc
(``import tide.torch_rpc`` registers ``torch.distributed.rpc.BackendType.TIDE``)
and as ``tide.elastic``, torch.distributed.elastic's API on tide's C++ agent.
"""
