// Distributed autograd: gradients of a backward pass across rpc agents
// equal those of the same computation run locally; contexts end on every
// worker; errors and lost workers fail the backward at once. Agents run in
// this process (threads) unless a test kills one: then it is a re-executed
// copy of this binary. A binary of its own (tide_autograd_tests): it links
// libtorch.
#include "tide/autograd/dist_autograd.h"

#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "tide/autograd/optimizer.h"
#include "tide/common/error.h"
#include "tide/rpc/remote_module.h"
#include "tide/rpc/rpc.h"
#include "tide/rpc/tensor.h"
#include "tide/store/tcp_store.h"

#include "support/subprocess.h"

namespace tide::rpc {
namespace {

using namespace std::chrono_literals;
using store::TcpStore;
using store::TcpStoreOptions;
using ::testing::HasSubstr;

// The parameters the workers' functions use, by name: leaves requiring
// grad, shared by the agents of this process (each function runs on one).
std::map<std::string, at::Tensor>& params() {
  static std::map<std::string, at::Tensor> p = [] {
    at::manual_seed(7);
    std::map<std::string, at::Tensor> m;
    for (const char* name : {"w1", "w2", "w3", "ps"}) {
      m[name] = at::randn({4, 4}).requires_grad_();
    }
    return m;
  }();
  return p;
}
const at::Tensor& param(const std::string& name) {
  return params().at(name);
}

at::Tensor linear1(const at::Tensor& h) {
  return h.matmul(param("w1"));
}
at::Tensor linear2(const at::Tensor& h) {
  return at::tanh(h.matmul(param("w2")));
}
at::Tensor scale3(const at::Tensor& h) {
  return h * param("w3")[0];
}

TIDE_RPC_FUNCTION(ag_linear1, [](at::Tensor h) { return linear1(h); });
TIDE_RPC_FUNCTION(ag_linear2, [](at::Tensor h) { return linear2(h); });
TIDE_RPC_FUNCTION(ag_ps, [](at::Tensor h) { return h.matmul(param("ps")); });
TIDE_RPC_FUNCTION(ag_square, [](at::Tensor h) { return h * h; });
TIDE_RPC_FUNCTION(ag_identity, [](at::Tensor h) { return h; });
// Both outputs leave; a test's loss uses the first only.
TIDE_RPC_FUNCTION(ag_pair, [](at::Tensor h) {
  return std::tuple<at::Tensor, at::Tensor>(linear1(h), linear2(h));
});
// w1 on its worker, then linear2 on w2's worker: a nested call.
TIDE_RPC_FUNCTION(ag_chain, [](at::Tensor h) {
  return current_agent().rpc_sync<at::Tensor>("w2", "ag_linear2", linear1(h));
});
// The cycle w0 -> w1 -> w2 -> w0.
TIDE_RPC_FUNCTION(ag_cycle_b, [](at::Tensor h) {
  return current_agent().rpc_sync<at::Tensor>("w2", "ag_cycle_c", linear1(h));
});
TIDE_RPC_FUNCTION(ag_cycle_c, [](at::Tensor h) {
  return current_agent().rpc_sync<at::Tensor>("w0", "ag_scale3", linear2(h));
});
TIDE_RPC_FUNCTION(ag_scale3, [](at::Tensor h) { return scale3(h); });
// A parameter held by an RRef, and a function using it on its owner.
TIDE_RPC_FUNCTION(ag_param, [](std::string name) { return param(name); });
TIDE_RPC_FUNCTION(ag_apply, [](RRef<at::Tensor> p, at::Tensor h) {
  return h.matmul(*p.local_value());
});
// The gradient context `id` holds on this worker for parameter `name`.
TIDE_RPC_FUNCTION(ag_grad, [](int64_t id, std::string name) {
  return dist_autograd::get_gradients(id).at(param(name));
});
TIDE_RPC_FUNCTION(ag_new_param, [](at::Tensor init) {
  return init.detach().clone().requires_grad_();
});
TIDE_RPC_METHOD(at::Tensor, copy_from, [](at::Tensor& p, at::Tensor v) {
  torch::NoGradGuard no_grad;
  p.copy_(v);
});
TIDE_RPC_METHOD(at::Tensor, grad_in, [](at::Tensor& p, int64_t id) {
  return dist_autograd::get_gradients(id).at(p);
});
TIDE_RPC_FUNCTION(ag_num_grads, [](int64_t id) {
  return static_cast<int64_t>(dist_autograd::get_gradients(id).size());
});

// An operation whose backward fails.
struct FailInBackward : torch::autograd::Function<FailInBackward> {
  static at::Tensor forward(
      torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    throw std::domain_error("this backward fails");
  }
};
TIDE_RPC_FUNCTION(ag_fail_in_backward, [](at::Tensor h) {
  return FailInBackward::apply(h);
});

// An operation whose backward says so on stdout, then blocks until the
// process is killed (the death test's child runs it).
struct BlockInBackward : torch::autograd::Function<BlockInBackward> {
  static at::Tensor forward(
      torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    std::printf("in backward\n");
    std::fflush(stdout);
    for (;;) {
      ::pause();
    }
  }
};
TIDE_RPC_FUNCTION(ag_block_in_backward, [](at::Tensor h) {
  return BlockInBackward::apply(h);
});

struct Net : torch::nn::Module {
  explicit Net(int64_t d)
      : fc(register_module("fc", torch::nn::Linear(d, d))) {}
  at::Tensor forward(at::Tensor x) {
    return at::tanh(fc(x));
  }
  torch::nn::Linear fc;
};
TIDE_RPC_MODULE(Net, int64_t);

// Gradients of `loss` for `inputs`, computed locally.
std::vector<at::Tensor> local_grads(
    const at::Tensor& loss, const std::vector<at::Tensor>& inputs) {
  return torch::autograd::grad({loss}, inputs, {}, /*retain_graph=*/true);
}

class DistAutogradTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dist_autograd::enable();
    server_ = std::make_unique<TcpStore>(TcpStoreOptions{
        .host = "127.0.0.1", .port = 0, .is_server = true, .timeout = 10s});
    params();
  }
  void TearDown() override {
    for (auto& a : agents_) {
      dist_autograd::wait_for_releases(*a);
    }
    for (auto& a : agents_) {
      EXPECT_EQ(dist_autograd::num_contexts(*a), 0u)
          << a->get_worker_info().name << " kept a context";
    }
    std::vector<std::future<void>> stopping;
    for (auto& a : agents_) {
      stopping.push_back(
          std::async(std::launch::async, [&a] { a->shutdown(true); }));
    }
    for (auto& s : stopping) {
      s.get();
    }
  }

  void start(int n) {
    std::vector<std::future<std::unique_ptr<RpcAgent>>> starting;
    for (int r = 0; r < n; ++r) {
      starting.push_back(std::async(std::launch::async, [this, n, r] {
        return std::make_unique<RpcAgent>(
            "w" + std::to_string(r), r, n, RpcBackendOptions{}, client());
      }));
    }
    for (auto& s : starting) {
      agents_.push_back(s.get());
    }
  }
  std::shared_ptr<store::Store> client() {
    return std::make_shared<TcpStore>(TcpStoreOptions{
        .host = "127.0.0.1", .port = server_->port(), .timeout = 10s});
  }
  RpcAgent& w(int i) {
    return *agents_[static_cast<size_t>(i)];
  }
  // Parameter `name`'s gradient in context `id`, as worker `on` holds it.
  at::Tensor grad_on(int on, int64_t id, const std::string& name) {
    return w(0).rpc_sync<at::Tensor>(
        "w" + std::to_string(on), "ag_grad", id, name);
  }

  std::unique_ptr<TcpStore> server_;
  std::vector<std::unique_ptr<RpcAgent>> agents_;
};

TEST_F(DistAutogradTest, AChainOverTwoWorkersGivesTheLocalGradients) {
  start(2);
  at::Tensor x = at::randn({3, 4}).requires_grad_();
  at::Tensor w0 = at::randn({4, 4}).requires_grad_();
  auto expect = local_grads(linear1(x.matmul(w0)).sum(), {x, w0, param("w1")});
  dist_autograd::Context ctx(w(0));
  at::Tensor y = w(0).rpc_sync<at::Tensor>("w1", "ag_linear1", x.matmul(w0));
  EXPECT_TRUE(y.requires_grad());
  dist_autograd::backward(ctx.context_id(), {y.sum()});
  auto here = dist_autograd::get_gradients(ctx.context_id());
  EXPECT_EQ(here.size(), 2u);  // x and w0; w1's gradient is on w1
  // The same arithmetic in the same order: bitwise equal.
  EXPECT_TRUE(at::equal(here.at(x), expect[0]));
  EXPECT_TRUE(at::equal(here.at(w0), expect[1]));
  EXPECT_TRUE(at::equal(grad_on(1, ctx.context_id(), "w1"), expect[2]));
  // .grad is never written.
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(param("w1").grad().defined());
}

// A context is released on a worker only by a worker with a part in it.
TEST_F(DistAutogradTest, AWorkerOutsideAContextCannotReleaseIt) {
  start(3);
  at::Tensor x = at::randn({3, 4}).requires_grad_();
  auto expect = local_grads(linear1(x).sum(), {x, param("w1")});
  dist_autograd::Context ctx(w(0));
  at::Tensor y = w(0).rpc_sync<at::Tensor>("w1", "ag_linear1", x);
  EXPECT_THAT(
      [&] {
        w(2).rpc_sync<void>("w1", "tide.autograd.release", ctx.context_id());
      },
      testing::ThrowsMessage<RemoteError>(testing::HasSubstr("has no part")));
  // w1 still holds it: the backward pass runs through it.
  dist_autograd::backward(ctx.context_id(), {y.sum()});
  EXPECT_TRUE(at::equal(grad_on(1, ctx.context_id(), "w1"), expect[1]));
}

TEST_F(DistAutogradTest, AChainOverThreeWorkersThroughANestedCall) {
  start(3);
  at::Tensor x = at::randn({2, 4}).requires_grad_();
  auto expect = local_grads(
      linear2(linear1(x)).pow(2).sum(), {x, param("w1"), param("w2")});
  dist_autograd::Context ctx(w(0));
  at::Tensor y = w(0).rpc_sync<at::Tensor>("w1", "ag_chain", x);
  dist_autograd::backward(ctx.context_id(), {y.pow(2).sum()});
  EXPECT_TRUE(at::equal(
      dist_autograd::get_gradients(ctx.context_id()).at(x), expect[0]));
  EXPECT_TRUE(at::equal(grad_on(1, ctx.context_id(), "w1"), expect[1]));
  EXPECT_TRUE(at::equal(grad_on(2, ctx.context_id(), "w2"), expect[2]));
  EXPECT_EQ(dist_autograd::num_contexts(w(2)), 1u);  // made by the call
}

TEST_F(DistAutogradTest, ACycleBackToTheInitiator) {
  start(3);
  at::Tensor x = at::randn({2, 4}).requires_grad_();
  auto expect = local_grads(
      scale3(linear2(linear1(x))).sum(),
      {x, param("w1"), param("w2"), param("w3")});
  dist_autograd::Context ctx(w(0));
  at::Tensor y = w(0).rpc_sync<at::Tensor>("w1", "ag_cycle_b", x);
  dist_autograd::backward(ctx.context_id(), {y.sum()});
  auto here = dist_autograd::get_gradients(ctx.context_id());
  EXPECT_TRUE(at::equal(here.at(x), expect[0]));
  EXPECT_TRUE(at::equal(here.at(param("w3")), expect[3]));  // w0's own
  EXPECT_TRUE(at::equal(grad_on(1, ctx.context_id(), "w1"), expect[1]));
  EXPECT_TRUE(at::equal(grad_on(2, ctx.context_id(), "w2"), expect[2]));
}

TEST_F(DistAutogradTest, ATensorSentTwiceAndUsedTwice) {
  start(2);
  at::Tensor x = at::randn({3, 4}).requires_grad_();
  auto expect = local_grads((x * x + linear1(x)).sum() * 3, {x, param("w1")});
  dist_autograd::Context ctx(w(0));
  at::Tensor a = w(0).rpc_sync<at::Tensor>("w1", "ag_square", x);
  at::Tensor b = w(0).rpc_sync<at::Tensor>("w1", "ag_linear1", x);
  dist_autograd::backward(ctx.context_id(), {(a + b).sum() * 3});
  EXPECT_TRUE(at::allclose(
      dist_autograd::get_gradients(ctx.context_id()).at(x), expect[0]));
  EXPECT_TRUE(at::equal(grad_on(1, ctx.context_id(), "w1"), expect[1]));
}

// torch hangs here until its rpc timeout (a send whose gradient never
// comes) and ships zeros for the unused output; tide does neither.
TEST_F(DistAutogradTest, AnUnusedTensorHoldsNothingUpAndGetsNoGradient) {
  start(2);
  at::Tensor x = at::randn({3, 4}).requires_grad_();
  at::Tensor unused = at::randn({3, 4}).requires_grad_();
  auto expect = local_grads(linear1(x).sum(), {x, param("w1")});
  dist_autograd::Context ctx(w(0));
  auto [used, dropped] =
      w(0).rpc_sync<std::tuple<at::Tensor, at::Tensor>>("w1", "ag_pair", x);
  EXPECT_TRUE(dropped.requires_grad());
  // A whole call whose result the loss never uses.
  at::Tensor ignored = w(0).rpc_sync<at::Tensor>("w1", "ag_linear2", unused);
  auto done = std::async(std::launch::async, [&] {
    dist_autograd::backward(ctx.context_id(), {used.sum()});
  });
  ASSERT_EQ(done.wait_for(30s), std::future_status::ready)
      << "backward waits for a gradient that never comes";
  done.get();
  auto here = dist_autograd::get_gradients(ctx.context_id());
  EXPECT_TRUE(at::equal(here.at(x), expect[0]));
  EXPECT_FALSE(here.contains(unused));
  EXPECT_TRUE(at::equal(grad_on(1, ctx.context_id(), "w1"), expect[1]));
  // w2 only feeds the unused outputs: no gradient was shipped for it.
  EXPECT_FALSE(grad_on(1, ctx.context_id(), "w2").defined());
  EXPECT_EQ(w(0).rpc_sync<int64_t>("w1", "ag_num_grads", ctx.context_id()), 1);
}

TEST_F(DistAutogradTest, ATensorSentStraightBack) {
  start(2);
  at::Tensor x = at::randn({3}).requires_grad_();
  dist_autograd::Context ctx(w(0));
  at::Tensor y = w(0).rpc_sync<at::Tensor>("w1", "ag_identity", x);
  dist_autograd::backward(ctx.context_id(), {(y * 2).sum()});
  EXPECT_TRUE(at::equal(
      dist_autograd::get_gradients(ctx.context_id()).at(x),
      at::full({3}, 2.0)));
}

TEST_F(DistAutogradTest, ParametersHeldByRRefs) {
  start(2);
  RRef<at::Tensor> p =
      w(0).remote<at::Tensor>("w1", "ag_param", std::string("w1"));
  at::Tensor x = at::randn({3, 4}).requires_grad_();
  auto expect = local_grads(linear1(x).sum(), {x, param("w1")});
  {
    dist_autograd::Context ctx(w(0));
    at::Tensor y = w(0).rpc_sync<at::Tensor>("w1", "ag_apply", p, x);
    dist_autograd::backward(ctx.context_id(), {y.sum()});
    EXPECT_TRUE(at::equal(
        dist_autograd::get_gradients(ctx.context_id()).at(x), expect[0]));
    EXPECT_TRUE(at::equal(grad_on(1, ctx.context_id(), "w1"), expect[1]));
    // to_here inside a context records too: a gradient for the owner's
    // parameter itself.
    at::Tensor fetched = p.to_here();
    EXPECT_TRUE(fetched.requires_grad());
    dist_autograd::backward(ctx.context_id(), {(fetched * 3).sum()});
    EXPECT_TRUE(at::allclose(
        grad_on(1, ctx.context_id(), "w1"), expect[1] + at::full({4, 4}, 3.0)));
  }
}

TEST_F(DistAutogradTest, RemoteModuleStages) {
  start(3);
  RemoteModule<Net> first(w(0), "w1/cpu", int64_t{4});
  RemoteModule<Net> second(w(0), "rank:2/cpu", int64_t{4});
  // The same modules here, with the remote ones' parameters.
  auto copy = [](const RemoteModule<Net>& m) {
    auto local = std::make_shared<Net>(4);
    auto remote = m.remote_parameters();
    auto mine = local->parameters();
    for (size_t i = 0; i < remote.size(); ++i) {
      torch::NoGradGuard no_grad;
      mine[i].copy_(remote[i].to_here());
    }
    return local;
  };
  auto l1 = copy(first);
  auto l2 = copy(second);
  at::Tensor x = at::randn({5, 4});
  std::vector<at::Tensor> inputs = l1->parameters();
  for (const auto& p : l2->parameters()) {
    inputs.push_back(p);
  }
  auto expect = local_grads(l2->forward(l1->forward(x)).sum(), inputs);

  dist_autograd::Context ctx(w(0));
  at::Tensor h = first.forward<at::Tensor>(x);
  at::Tensor y = second.forward<at::Tensor>(h);
  dist_autograd::backward(ctx.context_id(), {y.sum()});
  // Each owner's gradients, fetched from there for its parameters.
  size_t i = 0;
  for (auto* m : {&first, &second}) {
    for (const auto& p : m->remote_parameters()) {
      auto got = p.rpc_sync().call<at::Tensor>("grad_in", ctx.context_id());
      EXPECT_TRUE(at::allclose(got, expect[i], 1e-6, 1e-6)) << i;
      ++i;
    }
  }
  EXPECT_EQ(i, expect.size());
}

TEST_F(DistAutogradTest, TwoTrainersOnOneParameterServer) {
  start(3);
  auto train = [this](int me) {
    for (int step = 0; step < 5; ++step) {
      at::Tensor x = at::randn({2, 4}).requires_grad_();
      at::Tensor expect =
          local_grads(x.matmul(param("ps")).sum(), {param("ps")})[0];
      dist_autograd::Context ctx(w(me));
      at::Tensor y = w(me).rpc_sync<at::Tensor>("w0", "ag_ps", x);
      dist_autograd::backward(ctx.context_id(), {y.sum()});
      at::Tensor got = w(me).rpc_sync<at::Tensor>(
          "w0", "ag_grad", ctx.context_id(), std::string("ps"));
      EXPECT_TRUE(at::equal(got, expect)) << me << " step " << step;
    }
  };
  auto a = std::async(std::launch::async, train, 1);
  auto b = std::async(std::launch::async, train, 2);
  a.get();
  b.get();
}

TEST_F(DistAutogradTest, RetainGraphRunsASecondBackward) {
  start(2);
  at::Tensor x = at::randn({3, 4}).requires_grad_();
  auto expect = local_grads(linear1(x).sum(), {x, param("w1")});
  dist_autograd::Context ctx(w(0));
  at::Tensor loss = w(0).rpc_sync<at::Tensor>("w1", "ag_linear1", x).sum();
  dist_autograd::backward(ctx.context_id(), {loss}, /*retain_graph=*/true);
  dist_autograd::backward(ctx.context_id(), {loss});
  EXPECT_TRUE(at::allclose(
      dist_autograd::get_gradients(ctx.context_id()).at(x), expect[0] * 2));
  EXPECT_TRUE(at::allclose(grad_on(1, ctx.context_id(), "w1"), expect[1] * 2));
}

TEST_F(DistAutogradTest, ContextsEndOnEveryWorkerTheyReached) {
  start(3);
  int64_t id = 0;
  {
    dist_autograd::Context ctx(w(0));
    id = ctx.context_id();
    EXPECT_EQ(id >> 48, 0);  // w0's
    EXPECT_EQ(dist_autograd::current_context_id(), id);
    at::Tensor x = at::randn({2, 4}).requires_grad_();
    w(0).rpc_sync<at::Tensor>("w1", "ag_chain", x);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(dist_autograd::num_contexts(w(i)), 1u) << i;
    }
    EXPECT_THROW(dist_autograd::Context nested(w(0)), InvalidArgument);
  }
  EXPECT_EQ(dist_autograd::current_context_id(), -1);
  EXPECT_EQ(dist_autograd::num_contexts(w(0)), 0u);  // here: at once
  dist_autograd::wait_for_releases(w(0));
  // w2 heard of it from w1, and dropped it when w1 passed the release on.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(dist_autograd::num_contexts(w(i)), 0u) << i;
  }
  EXPECT_THAT(
      [&] { w(0).rpc_sync<int64_t>("w1", "ag_num_grads", id); },
      testing::ThrowsMessage<RemoteError>(
          HasSubstr("no distributed autograd context")));
}

TEST_F(DistAutogradTest, BadRootsAndUnknownContextsFailClearly) {
  start(2);
  dist_autograd::Context ctx(w(0));
  at::Tensor x = at::randn({3}).requires_grad_();
  auto fails = [&](std::vector<at::Tensor> roots, const std::string& why) {
    EXPECT_THAT(
        [&] { dist_autograd::backward(ctx.context_id(), roots); },
        testing::ThrowsMessage<InvalidArgument>(HasSubstr(why)));
  };
  fails({}, "at least one root");
  fails({x * 2}, "roots must be scalars");
  fails({x.sum().detach()}, "does not require grad");
  fails({at::randn({1}).requires_grad_()}, "is a leaf");
  EXPECT_THAT(
      [&] { dist_autograd::backward(ctx.context_id() + 1, {x.sum()}); },
      testing::ThrowsMessage<InvalidArgument>(
          HasSubstr("no distributed autograd context")));
}

// Gradient messages as a broken or hostile peer could send them: each
// fails clearly, and the worker and the context serve on.
TEST_F(DistAutogradTest, MalformedGradientMessagesFailClearly) {
  start(2);
  dist_autograd::Context ctx(w(0));
  at::Tensor x = at::randn({3, 4}).requires_grad_();
  at::Tensor y = w(0).rpc_sync<at::Tensor>("w1", "ag_linear1", x);
  int64_t id = ctx.context_id();
  auto refused = [&](const std::string& why, auto... args) {
    EXPECT_THAT(
        [&] { w(0).rpc_sync<void>("w1", "tide.autograd.backward", args...); },
        testing::ThrowsMessage<RemoteError>(HasSubstr(why)));
  };
  using Grads = std::vector<at::Tensor>;
  // A message w1 never sent, a context it never saw.
  refused(
      "sent no tensor requiring grad",
      id,
      uint64_t{1} << 40,
      1,
      Grads{},
      false);
  refused(
      "no distributed autograd context",
      id + 7,
      uint64_t{1},
      1,
      Grads{},
      false);
  // The right message: w0's first (ids count from w0's id << 48, here 0),
  // with no gradient for the one tensor it carried back.
  const uint64_t message = 0;
  refused(
      "carried 1 tensors requiring grad, but 0",
      id,
      message,
      1,
      Grads{},
      false);
  refused("invalid gradient", id, message, 1, Grads{at::ones({2, 2})}, false);
  // The context still works.
  dist_autograd::backward(id, {y.sum()});
  EXPECT_TRUE(grad_on(1, id, "w1").defined());
}

TEST_F(DistAutogradTest, AnErrorInAnotherWorkersBackwardNamesIt) {
  start(3);
  dist_autograd::Context ctx(w(0));
  at::Tensor x = at::randn({3}).requires_grad_();
  at::Tensor y = w(0).rpc_sync<at::Tensor>("w2", "ag_fail_in_backward", x);
  try {
    dist_autograd::backward(ctx.context_id(), {y.sum()});
    FAIL() << "expected RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("worker 'w2'"));
    EXPECT_THAT(e.what(), HasSubstr("this backward fails"));
  }
}

// The parameter-server pattern with a readers-writer lock taken over rpc:
// each trainer holds the read side around its backward and the write side
// around its optimizer step, so one trainer's lock call waits on w0, holding
// a thread there, while the other's forward, gradients and step are served.
TEST_F(DistAutogradTest, TrainersTakeALockOnTheParameterServerOverRpc) {
  start(3);
  std::mutex mutex;
  std::condition_variable changed;
  int readers = 0;      // Guarded by mutex.
  bool writer = false;  // Guarded by mutex.
  w(0).register_function("read_lock", [&] {
    std::unique_lock lock(mutex);
    bool ok = changed.wait_for(lock, 20s, [&] { return !writer; });
    readers += ok ? 1 : 0;
    return ok;
  });
  w(0).register_function("read_unlock", [&] {
    {
      std::lock_guard lock(mutex);
      --readers;
    }
    changed.notify_all();
  });
  w(0).register_function("write_lock", [&] {
    std::unique_lock lock(mutex);
    bool ok =
        changed.wait_for(lock, 20s, [&] { return !writer && readers == 0; });
    writer = writer || ok;
    return ok;
  });
  w(0).register_function("write_unlock", [&] {
    {
      std::lock_guard lock(mutex);
      writer = false;
    }
    changed.notify_all();
  });
  auto train = [this](int me) {
    RpcAgent& agent = w(me);
    RemoteModule<Net> model(agent, "w0/cpu", int64_t{4});
    std::vector<RRef<at::Tensor>> params = model.remote_parameters();
    at::Tensor before = params[0].to_here();
    DistributedOptimizer opt(params, torch::optim::SGDOptions(0.05));
    for (int step = 0; step < 4; ++step) {
      dist_autograd::Context ctx(agent);
      EXPECT_TRUE(agent.rpc_sync<bool>("w0", "read_lock"));
      at::Tensor y = model.forward<at::Tensor>(at::randn({3, 4}));
      dist_autograd::backward(ctx.context_id(), {y.pow(2).sum()});
      agent.rpc_sync<void>("w0", "read_unlock");
      EXPECT_TRUE(agent.rpc_sync<bool>("w0", "write_lock"));
      opt.step(ctx.context_id());
      agent.rpc_sync<void>("w0", "write_unlock");
    }
    EXPECT_FALSE(at::equal(params[0].to_here(), before)) << "trainer " << me;
  };
  auto a = std::async(std::launch::async, train, 1);
  auto b = std::async(std::launch::async, train, 2);
  a.get();
  b.get();
}

// Trains `steps` steps of a local Linear followed by a RemoteModule on w1
// with a DistributedOptimizer of `options`, and the same model locally with
// libtorch's optimizer; the parameters must end the same.
template <typename Optimizer, typename Options>
void expect_same_training(RpcAgent& driver, const Options& options) {
  at::manual_seed(3);
  auto local_first = torch::nn::Linear(4, 4);
  RemoteModule<Net> second(driver, "w1/cpu", int64_t{4});
  auto replica = std::make_shared<Net>(4);
  auto remote = second.remote_parameters();
  {
    torch::NoGradGuard no_grad;
    auto mine = replica->parameters();
    for (size_t i = 0; i < remote.size(); ++i) {
      mine[i].copy_(remote[i].to_here());
    }
  }
  auto replica_first = torch::nn::Linear(4, 4);
  {
    torch::NoGradGuard no_grad;
    replica_first->weight.copy_(local_first->weight);
    replica_first->bias.copy_(local_first->bias);
  }
  std::vector<RRef<at::Tensor>> params = remote;
  for (const auto& p : local_first->parameters()) {
    params.emplace_back(driver, p);
  }
  DistributedOptimizer opt(params, options);
  std::vector<at::Tensor> replica_params = replica_first->parameters();
  for (const auto& p : replica->parameters()) {
    replica_params.push_back(p);
  }
  Optimizer local_opt(replica_params, options);
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = at::randn({5, 4});
    {
      dist_autograd::Context ctx(driver);
      at::Tensor y = second.forward<at::Tensor>(local_first(x));
      dist_autograd::backward(ctx.context_id(), {y.pow(2).sum()});
      opt.step(ctx.context_id());
    }
    local_opt.zero_grad();
    replica->forward(replica_first(x)).pow(2).sum().backward();
    local_opt.step();
  }
  EXPECT_TRUE(
      at::allclose(local_first->weight, replica_first->weight, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(local_first->bias, replica_first->bias, 1e-5, 1e-6));
  auto now = second.remote_parameters();
  auto want = replica->parameters();
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_TRUE(at::allclose(now[i].to_here(), want[i], 1e-5, 1e-6)) << i;
  }
  // The owners' .grad stays as it was (undefined).
  EXPECT_FALSE(local_first->weight.grad().defined());
}

TEST_F(DistAutogradTest, TheOptimizerTrainsAsLibtorchsDoesLocally) {
  start(2);
  using namespace torch::optim;
  expect_same_training<SGD>(w(0), SGDOptions(0.05).momentum(0.9));
  expect_same_training<Adam>(w(0), AdamOptions(0.01));
  expect_same_training<AdamW>(w(0), AdamWOptions(0.01).weight_decay(0.1));
  expect_same_training<Adagrad>(w(0), AdagradOptions(0.1));
  expect_same_training<RMSprop>(w(0), RMSpropOptions(0.01).momentum(0.5));
}

TEST_F(DistAutogradTest, TheOptimizerReportsEveryOwnersFailure) {
  start(3);
  std::vector<RRef<at::Tensor>> params;
  for (const char* owner : {"w1", "w2"}) {
    params.push_back(
        w(0).remote<at::Tensor>(owner, "ag_new_param", at::randn({2})));
  }
  DistributedOptimizer opt(params, torch::optim::SGDOptions(0.1));
  EXPECT_EQ(opt.owners(), (std::vector<std::string>{"w1", "w2"}));
  try {
    opt.step(12345);  // a context no owner has
    FAIL() << "expected DistributedOptimizerError";
  } catch (const DistributedOptimizerError& e) {
    EXPECT_THAT(e.what(), HasSubstr("step failed on 2 of 2 owners"));
    ASSERT_EQ(e.failures().size(), 2u);
    EXPECT_EQ(e.failures()[0].first, "w1");
    EXPECT_EQ(e.failures()[1].first, "w2");
    EXPECT_THAT(e.what(), HasSubstr("no distributed autograd context 12345"));
  }
  EXPECT_THROW(
      DistributedOptimizer({}, torch::optim::SGDOptions(0.1)), InvalidArgument);
}

TEST_F(DistAutogradTest, ZeroGradLearningRatesAndState) {
  start(2);
  at::Tensor init = at::randn({4, 4});
  auto param_from = [&] {
    return w(0).remote<at::Tensor>("w1", "ag_new_param", init);
  };
  RRef<at::Tensor> a = param_from();
  RRef<at::Tensor> b = param_from();
  DistributedOptimizer opt_a({a}, torch::optim::AdamOptions(0.1));
  DistributedOptimizer opt_b({b}, torch::optim::AdamOptions(0.1));
  at::Tensor x = at::randn({3, 4});
  auto backward = [&](RRef<at::Tensor> p, int64_t id) {
    at::Tensor y = w(0).rpc_sync<at::Tensor>("w1", "ag_apply", p, x);
    dist_autograd::backward(id, {y.sum()});
  };
  {
    // zero_grad drops the context's gradients: the step changes nothing.
    dist_autograd::Context ctx(w(0));
    backward(a, ctx.context_id());
    opt_a.zero_grad(ctx.context_id());
    opt_a.step(ctx.context_id());
    EXPECT_TRUE(at::equal(a.to_here(), init));
  }
  {
    dist_autograd::Context ctx(w(0));
    backward(a, ctx.context_id());
    opt_a.step(ctx.context_id());
  }
  EXPECT_FALSE(at::equal(a.to_here(), init));
  // b takes a's state (Adam's moments and step count), then both step with
  // the same gradient: a fresh b would move differently.
  auto state = opt_a.state_dict();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_FALSE(state.at("w1").empty());
  opt_b.load_state_dict(state);
  {
    torch::NoGradGuard no_grad;
    // b starts where a is now.
    at::Tensor now = a.to_here();
    b.rpc_sync().call<void>("copy_from", now);
  }
  for (auto [p, opt] : {std::pair{a, &opt_a}, std::pair{b, &opt_b}}) {
    dist_autograd::Context ctx(w(0));
    backward(p, ctx.context_id());
    opt->step(ctx.context_id());
  }
  EXPECT_TRUE(at::allclose(a.to_here(), b.to_here()));
  EXPECT_THROW(opt_b.load_state_dict({}), InvalidArgument);

  // StepLR: every 2 steps, half the rate, on every owner.
  StepLR schedule(opt_a, 2, 0.5);
  EXPECT_DOUBLE_EQ(opt_a.lr(), 0.1);
  schedule.step();
  EXPECT_DOUBLE_EQ(opt_a.lr(), 0.1);
  schedule.step();
  EXPECT_DOUBLE_EQ(opt_a.lr(), 0.05);
  EXPECT_DOUBLE_EQ(schedule.last_lr(), 0.05);
  opt_a.set_lr(0.3);
  EXPECT_DOUBLE_EQ(opt_a.lr(), 0.3);
}

// A worker killed while it runs its part of the backward pass: backward()
// on the initiator fails at once with the loss of that worker, not after
// the rpc timeout.
TEST(DistAutogradDeathTest, AWorkerKilledDuringBackwardFailsItAtOnce) {
  dist_autograd::enable();
  TcpStore server(TcpStoreOptions{
      .host = "127.0.0.1", .port = 0, .is_server = true, .timeout = 10s});
  test::Subprocess child(
      {"/proc/self/exe"},
      test::SubprocessOptions{
          .env = {
              {"TIDE_AUTOGRAD_TEST_CHILD", std::to_string(server.port())}}});
  RpcBackendOptions options;
  options.rpc_timeout = 120s;
  RpcAgent agent(
      "w0",
      0,
      2,
      options,
      std::make_shared<TcpStore>(TcpStoreOptions{
          .host = "127.0.0.1", .port = server.port(), .timeout = 10s}));
  {
    dist_autograd::Context ctx(agent);
    at::Tensor x = at::randn({3}).requires_grad_();
    at::Tensor y = agent.rpc_sync<at::Tensor>("w1", "ag_block_in_backward", x);
    auto done = std::async(std::launch::async, [&] {
      dist_autograd::backward(ctx.context_id(), {y.sum()});
    });
    ASSERT_EQ(child.read_line(30s), "in backward");
    child.signal(SIGKILL);
    ASSERT_EQ(done.wait_for(30s), std::future_status::ready)
        << "backward still waits for a killed worker";
    try {
      done.get();
      FAIL() << "expected NetworkError";
    } catch (const NetworkError& e) {
      EXPECT_THAT(e.what(), HasSubstr("w1"));
    }
  }
  EXPECT_EQ(dist_autograd::num_contexts(agent), 0u);
  agent.shutdown(false);
}

}  // namespace
}  // namespace tide::rpc

namespace {

// The death test's worker w1: serves until killed.
void run_child_if_requested() {
  const char* port = std::getenv("TIDE_AUTOGRAD_TEST_CHILD");
  if (port == nullptr) {
    return;
  }
  using namespace std::chrono_literals;
  using namespace tide;
  rpc::dist_autograd::enable();
  rpc::RpcAgent agent(
      "w1",
      1,
      2,
      rpc::RpcBackendOptions{},
      std::make_shared<store::TcpStore>(store::TcpStoreOptions{
          .host = "127.0.0.1",
          .port = static_cast<uint16_t>(std::atoi(port)),
          .timeout = 30s}));
  for (;;) {
    ::pause();
  }
}

}  // namespace

int main(int argc, char** argv) {
  run_child_if_requested();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
