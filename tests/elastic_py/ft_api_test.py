#!/usr/bin/python3
"""tide.ft's TorchFT names that need no quorum: DistributedDataParallel
averages a backward pass's gradients in one collective after they are all in
place (and not under no_sync()); DistributedSampler shards the data over
ranks x replica groups; the process-group arguments and bad input get clear
errors. The Manager itself, with real groups, is tests/apps/ft_test.py's.

    PYTHONPATH=build/python /usr/bin/python3 tests/elastic_py/ft_api_test.py
"""
import unittest
from datetime import timedelta

import torch
from torch.utils.data import TensorDataset

import tide.ft as ft


class Recorder:
    """What DistributedDataParallel asks of a Manager: allreduce() (here, a
    record of each call and the tensor's sum; the average of one group is
    the tensor itself) and errored()."""

    def __init__(self):
        self.calls = []

    def allreduce(self, tensor):
        self.calls.append((tensor.numel(), float(tensor.sum())))

    def errored(self):
        return None


class DistributedDataParallelTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
        self.manager = Recorder()
        self.model = ft.DistributedDataParallel(self.manager, self.inner, device_ids=None)
        self.x = torch.randn(5, 4)

    def grads(self):
        return torch.cat([p.grad.reshape(-1) for p in self.inner.parameters()])

    def test_one_collective_a_backward_pass_with_every_gradient_in_place(self):
        self.model(self.x).sum().backward()
        n = sum(p.numel() for p in self.inner.parameters())
        self.assertEqual(len(self.manager.calls), 1)
        self.assertEqual(self.manager.calls[0][0], n)
        self.assertAlmostEqual(self.manager.calls[0][1], float(self.grads().sum()), places=5)
        self.model(self.x).sum().backward()
        self.assertEqual(len(self.manager.calls), 2)

    def test_no_sync_skips_the_average_for_accumulation(self):
        with self.model.no_sync():
            self.model(self.x).sum().backward()
        self.assertEqual(self.manager.calls, [])
        self.model(self.x).sum().backward()  # the accumulated gradients, once
        self.assertEqual(len(self.manager.calls), 1)
        self.assertAlmostEqual(self.manager.calls[0][1], float(self.grads().sum()), places=5)

    def test_the_wrapped_module_and_its_state(self):
        self.assertIs(self.model.module, self.inner)
        self.assertTrue(torch.equal(self.model(self.x), self.inner(self.x)))
        self.assertEqual(sorted(self.model.state_dict()),
                         sorted("module." + k for k in self.inner.state_dict()))


class DistributedSamplerTest(unittest.TestCase):
    def test_the_shards_of_ranks_and_groups_cover_the_data_once(self):
        data = TensorDataset(torch.arange(24))
        seen = []
        for group in range(3):
            for rank in range(2):
                s = ft.DistributedSampler(data, replica_rank=group, num_replica_groups=3,
                                          group_rank=rank, num_replicas=2, shuffle=False)
                self.assertEqual(s.global_rank, rank + 2 * group)
                self.assertEqual(s.global_world_size, 6)
                seen += list(s)
        self.assertEqual(sorted(seen), list(range(24)))

    def test_bad_ranks_are_named(self):
        data = TensorDataset(torch.arange(4))
        with self.assertRaisesRegex(ft.ReplicaGroupError, r"replica_rank 3 is not in 0\.\.2"):
            ft.DistributedSampler(data, replica_rank=3, num_replica_groups=3,
                                  group_rank=0, num_replicas=1)
        with self.assertRaisesRegex(ft.ReplicaGroupError, r"group_rank 2 is not in 0\.\.1"):
            ft.DistributedSampler(data, replica_rank=0, num_replica_groups=1,
                                  group_rank=2, num_replicas=2)


class ProcessGroupTest(unittest.TestCase):
    def test_nccl_is_refused_with_the_reason(self):
        for cls in (ft.ProcessGroupNCCL, ft.ProcessGroupBabyNCCL):
            with self.assertRaisesRegex(ft.ReplicaGroupError, "gloo.*NCCL across groups"):
                cls(timeout=timedelta(seconds=5))

    def test_a_bad_timeout_or_a_foreign_group_is_refused_before_any_store(self):
        with self.assertRaisesRegex(ft.ReplicaGroupError, "timeout must be positive"):
            ft.ProcessGroupGloo(timeout=timedelta(0))
        with self.assertRaisesRegex(ft.ReplicaGroupError, "pass pg=None or tide.ft.ProcessGroupGloo"):
            ft.Manager(pg=object(), store="127.0.0.1:1", replica_id="0", incarnation="0")

    def test_torchfts_optimizer_name(self):
        self.assertIs(ft.Optimizer, ft.OptimizerWrapper)


if __name__ == "__main__":
    unittest.main()
