#!/usr/bin/python3
"""tide.ft's TorchFT names, each beside a stand-in for the Manager:
DistributedDataParallel averages a backward pass's gradients in one
collective after they are all in place (and not under no_sync()); LocalSGD
and DiLoCo sync every N optimizer steps, take the average only when the sync
commits, count a group healed at the sync for nothing, and DiLoCo with an
outer SGD at lr 1 is LocalSGD; DistributedSampler shards the data over ranks
x replica groups; a Manager's own state (step, batches) goes into and out
of a checkpoint; under tiderun the group is the one its tiderun names; the
process-group arguments and bad input get clear
errors. The Manager itself, with real groups, is tests/apps/ft_test.py's
(which runs the examples on these classes).

    PYTHONPATH=build/python /usr/bin/python3 tests/elastic_py/ft_api_test.py
"""
import os
import unittest
from datetime import timedelta

import torch
from torch.utils.data import TensorDataset

import tide.ft as ft


class Recorder:
    """What DistributedDataParallel asks of a Manager: allreduce() (here, a
    record of each call: how many values and their sum, less the group's
    weight that ends the buffer; the average of one group is the buffer
    itself) and errored()."""

    def __init__(self):
        self.calls = []

    def allreduce(self, tensor):
        self.calls.append((tensor.numel() - 1, float(tensor[:-1].sum())))

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


class OneOtherGroup:
    """A Manager as LocalSGD and DiLoCo use it, in a quorum with one other
    group: allreduce() adds what the other group sends (its tensors times
    its weight, then the weight) and halves, as the real one averages over
    two groups. heal: start_quorum() moves this group's step, as a heal
    does."""

    def __init__(self, other, commit=True, heal=False):
        self.other, self.commit, self.heal = other, commit, heal
        self.step, self.quorums, self.error, self.fns = 0, 0, None, {}

    def current_step(self):
        return self.step

    def start_quorum(self):
        self.quorums += 1
        self.step += 5 if self.heal else 0

    def allreduce(self, t):
        t.add_(self.other).div_(2)

    def errored(self):
        return self.error

    def report_error(self, e):
        self.error = e

    def should_commit(self):
        ok = self.commit and self.error is None
        self.step += int(ok)
        return ok

    def register_state_dict_fn(self, key, load, state):
        self.fns[key] = (load, state)


class LocalSGDTest(unittest.TestCase):
    """One step of SGD at lr 0.5 with gradients of ones takes this group's
    parameters from G to G - 0.5; the other group's are at G + 3."""

    def setUp(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(2, 1)
        self.g = torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).clone()
        self.inner = torch.optim.SGD(self.model.parameters(), lr=0.5)

    def params(self):
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])

    def sync_once(self, sync, manager, steps=2):
        with sync:
            for _ in range(steps):
                for p in self.model.parameters():
                    p.grad = torch.ones_like(p) / steps
                self.inner.step()
        self.assertNotIn("step", vars(self.inner))  # the wrapper is gone
        self.assertEqual(manager.quorums, 1)

    def peer(self, values):
        return torch.cat([values, torch.ones(1)])

    def test_every_n_steps_the_groups_take_the_average(self):
        m = OneOtherGroup(self.peer(self.g + 3))
        self.sync_once(ft.LocalSGD(m, self.model, self.inner, sync_every=2), m)
        self.assertTrue(torch.allclose(self.params(), self.g + 1.25))
        self.assertEqual(m.current_step(), 1)

    def test_a_sync_that_does_not_commit_keeps_the_groups_own(self):
        m = OneOtherGroup(self.peer(self.g + 3), commit=False)
        self.sync_once(ft.LocalSGD(m, self.model, self.inner, sync_every=2), m)
        self.assertTrue(torch.allclose(self.params(), self.g - 0.5))

    def test_a_group_healed_at_the_sync_counts_for_nothing(self):
        m = OneOtherGroup(self.peer(self.g + 3), heal=True)
        self.sync_once(ft.LocalSGD(m, self.model, self.inner, sync_every=2), m)
        self.assertTrue(torch.allclose(self.params(), self.g + 3))

    def test_diloco_with_an_outer_sgd_at_lr_1_is_local_sgd(self):
        # The other group's pseudo-gradient: G - (G + 3).
        m = OneOtherGroup(self.peer(torch.full_like(self.g, -3.0)))
        outer = torch.optim.SGD(self.model.parameters(), lr=1.0)
        self.sync_once(ft.DiLoCo(m, self.model, self.inner, outer, sync_every=2), m)
        self.assertTrue(torch.allclose(self.params(), self.g + 1.25))

    def test_diloco_goes_back_to_the_global_weights_when_a_sync_fails(self):
        m = OneOtherGroup(self.peer(torch.full_like(self.g, -3.0)), commit=False)
        outer = torch.optim.SGD(self.model.parameters(), lr=1.0)
        diloco = ft.DiLoCo(m, self.model, self.inner, outer, sync_every=2)
        self.sync_once(diloco, m)
        self.assertTrue(torch.equal(self.params(), self.g))
        # Its state for a healing group: the global weights (taken as the
        # parameters too) and the outer optimizer's.
        load, state = m.fns["diloco"]
        sd = state()
        self.assertEqual(sorted(sd), ["global", "outer"])
        load({"global": [t + 1 for t in sd["global"]], "outer": sd["outer"]})
        self.assertTrue(torch.equal(self.params(), self.g + 1))

    def test_sync_every_below_1_is_refused(self):
        with self.assertRaisesRegex(ft.ReplicaGroupError, "sync_every must be at least 1, not 0"):
            ft.LocalSGD(OneOtherGroup(None), self.model, self.inner, sync_every=0)


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


class ManagerStateTest(unittest.TestCase):
    """A Manager's own state, for a job's checkpoints, on a tide store this
    test serves (one group: its quorum is itself)."""

    def setUp(self):
        from tide.elastic.store import TCPStore
        self.server = TCPStore("127.0.0.1", 0, is_master=True)
        self.manager = ft.Manager(store=f"127.0.0.1:{self.server.port}/job", replica_id="0",
                                  incarnation="0", load_state_dict=lambda sd: None,
                                  state_dict=lambda: {})
        self.addCleanup(self.manager.shutdown)

    def test_a_checkpoints_step_and_batches_are_taken_before_the_first_quorum(self):
        self.manager.load_state_dict({"step": 7, "batches_committed": 21})
        self.assertEqual(self.manager.state_dict(), {"step": 7, "batches_committed": 21})
        self.manager.start_quorum()
        self.assertTrue(self.manager.should_commit())
        self.assertEqual(self.manager.state_dict(), {"step": 8, "batches_committed": 22})
        with self.assertRaisesRegex(ft.ReplicaGroupError, "after start_quorum"):
            self.manager.load_state_dict({"step": 1, "batches_committed": 1})

    def test_bad_state_is_named(self):
        for bad in ({"step": 1}, {"step": "x", "batches_committed": 0}, None):
            with self.assertRaisesRegex(ft.ReplicaGroupError, "takes what state_dict"):
                self.manager.load_state_dict(bad)
        with self.assertRaisesRegex(ft.ReplicaGroupError, "negative"):
            self.manager.load_state_dict({"step": -1, "batches_committed": 0})
        with self.assertRaisesRegex(ft.ReplicaGroupError, "the Manager's own"):
            self.manager.register_state_dict_fn("tide.ft", lambda sd: None, dict)


class UnderTiderunTest(unittest.TestCase):
    def test_the_group_is_the_one_its_tiderun_names_whatever_replica_id_says(self):
        # TorchFT's scripts pass a replica_id of their own; the agent
        # declares a failed group out under its tiderun's id.
        from tide.elastic.store import PrefixStore, TCPStore
        self.server = server = TCPStore("127.0.0.1", 0, is_master=True)
        env = {"TIDE_FT_INCARNATION": "inc7", "REPLICA_GROUP_ID": "3"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            manager = ft.Manager(store=f"127.0.0.1:{server.port}/job",
                                 replica_id="train_ddp_3", rank=0, world_size=1)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
        self.addCleanup(manager.shutdown)
        # Where a group that heals from this one sends: under its member id.
        job = PrefixStore("tide_ft/job", TCPStore("127.0.0.1", server.port))
        self.assertTrue(job.check(["heal/3:inc7/0"]))
        self.assertFalse(job.check(["heal/train_ddp_3:inc7/0"]))


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

    def test_torchfts_own_machinerys_arguments_are_taken_others_refused(self):
        # Without a store: the error names what is missing, after the
        # arguments were taken.
        with self.assertRaisesRegex(ft.ReplicaGroupError, "no lighthouse"):
            ft.Manager(pg=ft.ProcessGroupGloo(), use_async_quorum=False,
                       lighthouse_addr="http://h:29510", replica_id="0", incarnation="0")
        with self.assertRaisesRegex(TypeError, r"\['lighthous_addr'\]"):
            ft.Manager(lighthous_addr="http://h:29510")

    def test_torchfts_optimizer_name(self):
        self.assertIs(ft.Optimizer, ft.OptimizerWrapper)


if __name__ == "__main__":
    unittest.main()
