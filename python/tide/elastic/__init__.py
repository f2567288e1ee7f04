"""torch.distributed.elastic's Python API on tide's C++ agent.

The modules and names follow torch.distributed.elastic, so a launcher written
for torch changes only its imports::

    from tide.elastic.agent.server import WorkerSpec, LocalElasticAgent
    from tide.elastic.rendezvous import RendezvousParameters
    from tide.elastic.rendezvous.registry import get_rendezvous_handler
    from tide.elastic import metrics, events, timer
    from tide.elastic.multiprocessing.errors import record

Python only configures the agent and receives its results and callbacks: the
monitoring, the process trees, the rendezvous and the timers are tide's, in
C++. docs/python.md maps each name to torch's and says what differs.
"""
