"""Stores with torch.distributed's names and methods (set, get, add,
compare_set, wait, check, delete_key, num_keys), in C++: TCPStore speaks
torch's TCPStore protocol, so torch's clients and servers interoperate with it.
A rendezvous handler written in Python returns one of these, or a
torch.distributed store."""
from tide._elastic import HashStore, PrefixStore, Store, TCPStore  # noqa: F401
