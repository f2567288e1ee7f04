// The TIDE backend's agent in C++, without Python: the wire form of torch's
// messages, and two agents (or an agent and a raw transport playing a
// misbehaving worker) in one process, meeting through torch's HashStore.
// A test callback stands in for torch's RequestCallbackImpl.
#include "torch_rpc/agent.h"

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/rpc/utils.h>
#include <torch/torch.h>

#include "tide/common/error.h"

#include "rpc_core/peer_group.h"
#include "support/rpc_entry.h"
#include "torch_rpc/wire.h"

namespace tide::torch_rpc {
namespace {

using namespace std::chrono_literals;
namespace tr = torch::distributed::rpc;

c10::intrusive_ptr<tr::Message> make_message(
    std::string payload,
    std::vector<at::Tensor> tensors,
    tr::MessageType type = tr::MessageType::PYTHON_CALL,
    int64_t id = 7) {
  return c10::make_intrusive<tr::Message>(
      std::vector<char>(payload.begin(), payload.end()),
      std::move(tensors),
      type,
      id);
}

c10::intrusive_ptr<tr::Message> round_trip(
    const c10::intrusive_ptr<tr::Message>& m) {
  return from_wire(to_wire(m));
}

TEST(WireTest, RoundTripKeepsPayloadTensorsAndSharedStorage) {
  auto base = torch::arange(24, torch::kFloat32).reshape({4, 6});
  auto column = base.select(1, 2);  // strided view of base
  auto grad = torch::ones({3}, torch::kFloat64).requires_grad_(true);
  auto sparse = torch::sparse_coo_tensor(
      torch::tensor({{0, 2}, {1, 0}}), torch::tensor({5.0f, 7.0f}), {3, 3});
  auto back = round_trip(make_message("args", {base, column, grad, sparse}));
  EXPECT_EQ(back->type(), tr::MessageType::PYTHON_CALL);
  EXPECT_EQ(back->id(), 7);
  EXPECT_EQ(
      std::string(back->payload().begin(), back->payload().end()), "args");
  const auto& t = back->tensors();
  ASSERT_EQ(t.size(), 4u);
  EXPECT_TRUE(torch::equal(t[0], base));
  EXPECT_TRUE(torch::equal(t[1], column));
  EXPECT_EQ(t[1].strides(), column.strides());
  // A view travels with the storage it shares: both sides alias.
  EXPECT_TRUE(t[0].storage().is_alias_of(t[1].storage()));
  EXPECT_TRUE(t[2].requires_grad());
  EXPECT_TRUE(torch::equal(t[2], grad));
  EXPECT_TRUE(t[3].is_sparse());
  EXPECT_TRUE(torch::equal(t[3].to_dense(), sparse.to_dense()));
}

TEST(WireTest, AResponseKeepsItsTypeAndANoTensorMessageHasOneBuffer) {
  auto m = make_message("r", {}, tr::MessageType::SCRIPT_RET, 9);
  auto wire = to_wire(m);
  EXPECT_EQ(wire.type, kTorchResponse);
  EXPECT_EQ(wire.buffers.size(), 1u);
  auto back = from_wire(std::move(wire));
  EXPECT_EQ(back->type(), tr::MessageType::SCRIPT_RET);
  EXPECT_EQ(back->id(), 9);
}

TEST(WireTest, ASmallViewOfALargeStorageTravelsAsACopyOfItsPart) {
  auto large = torch::zeros({1 << 20});
  auto wire = to_wire(make_message("", {large.narrow(0, 10, 4)}));
  ASSERT_EQ(wire.buffers.size(), 2u);
  EXPECT_EQ(wire.buffers[1].size(), 4 * sizeof(float));
}

TEST(WireTest, TheSenderBuffersAreTheTensorsOwnBytes) {
  auto t = torch::rand({1024});
  auto wire = to_wire(make_message("", {t}));
  ASSERT_EQ(wire.buffers.size(), 2u);
  EXPECT_EQ(wire.buffers[1].data(), t.data_ptr());
}

TEST(WireTest, MalformedMessagesAreProtocolErrors) {
  auto good = to_wire(make_message("x", {torch::ones({4})}));
  {
    auto m = good;
    m.metadata.resize(2);
    EXPECT_THROW(from_wire(m), ProtocolError);
  }
  {
    auto m = good;
    m.buffers.clear();
    EXPECT_THROW(from_wire(m), ProtocolError);
  }
  {
    auto m = good;
    m.type = kTorchResponse;  // a request's type in a response
    EXPECT_THROW(from_wire(m), ProtocolError);
  }
  {
    auto m = good;
    m.metadata.resize(m.metadata.size() - 3);  // a cut pickle
    EXPECT_THROW(from_wire(m), ProtocolError);
  }
  {
    auto m = good;
    m.buffers.resize(1);  // the storage's bytes are missing
    EXPECT_THROW(from_wire(m), ProtocolError);
  }
  {
    auto m = good;
    m.buffers[1] = Buffer(std::string(8, '\0'));  // 8 bytes for 16
    EXPECT_THROW(from_wire(m), ProtocolError);
  }
  {
    auto m = good;
    m.metadata = m.metadata.substr(0, 4) + "not a pickle at all";
    EXPECT_THROW(from_wire(m), ProtocolError);
  }
  {
    // 14 bytes that name memo entry 16 million: refused before torch's
    // unpickler would grow its memo to that size (+264 MB).
    auto m = good;
    m.metadata = m.metadata.substr(0, 4) +
                 std::string("\x80\x02N\x72\x00\x00\x00\x01N\x68\x00.", 12);
    try {
      from_wire(m);
      ADD_FAILURE() << "no error";
    } catch (const ProtocolError& e) {
      EXPECT_NE(
          std::string(e.what()).find("puts memo entry 16777216"),
          std::string::npos)
          << e.what();
    }
  }
  {
    // A sparse tensor whose index lies outside its size.
    auto bad = at::_sparse_coo_tensor_unsafe(
        torch::tensor({{0, 7}}), torch::tensor({1.0f, 2.0f}), {3});
    EXPECT_THROW(from_wire(to_wire(make_message("", {bad}))), ProtocolError);
  }
}

// Answers PYTHON_CALL with PYTHON_RET of the same payload and tensors plus
// one; a payload "hold" is answered only when the test releases it.
class EchoCallback : public tr::RequestCallback {
 public:
  explicit EchoCallback(std::shared_ptr<std::promise<void>> held = nullptr)
      : held_(std::move(held)) {}

 protected:
  c10::intrusive_ptr<tr::JitFuture> processMessage(
      tr::Message& request,
      std::vector<c10::Stream> /*streams*/) const override {
    auto future = c10::make_intrusive<tr::JitFuture>(at::AnyClassType::get());
    std::string payload(request.payload().begin(), request.payload().end());
    std::vector<at::Tensor> out;
    for (const auto& t : request.tensors()) {
      out.push_back(t + 1);
    }
    auto reply = c10::make_intrusive<tr::Message>(
        std::vector<char>(payload.begin(), payload.end()),
        std::move(out),
        tr::MessageType::PYTHON_RET,
        request.id());
    if (payload == "hold" && held_) {
      held_->set_value();
      return future;  // never completed
    }
    future->markCompleted(c10::IValue(reply));
    return future;
  }

 private:
  std::shared_ptr<std::promise<void>> held_;
};

AgentOptions test_options() {
  AgentOptions o;
  o.rpcTimeoutSeconds = 20;
  o.num_worker_threads = 4;
  o.poll_us = 50;
  return o;
}

struct Pair {
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<c10d::HashStore>();
  std::shared_ptr<Agent> a, b;

  explicit Pair(AgentOptions options = test_options()) {
    auto make = [&](int rank) {
      return std::make_shared<Agent>(
          store,
          "w" + std::to_string(rank),
          rank,
          2,
          options,
          std::make_unique<EchoCallback>());
    };
    auto fb = std::async(std::launch::async, make, 1);
    a = make(0);
    b = fb.get();
    a->start();
    b->start();
  }
  ~Pair() {
    a->shutdown();
    b->shutdown();
  }
};

c10::intrusive_ptr<tr::Message> reply_of(
    const c10::intrusive_ptr<tr::JitFuture>& f) {
  f->wait();
  return f->value().toCustomClass<tr::Message>();
}

TEST(AgentTest, CallsGetTheirRepliesWithTensors) {
  Pair p;
  const auto& to = p.a->getWorkerInfo("w1");
  EXPECT_EQ(to.id_, 1);
  EXPECT_EQ(p.a->getWorkerInfos().size(), 2u);
  std::vector<c10::intrusive_ptr<tr::JitFuture>> calls;
  for (int i = 0; i < 50; ++i) {
    calls.push_back(p.a->send(
        to,
        make_message(
            "call " + std::to_string(i),
            {torch::full({256}, static_cast<float>(i))})));
  }
  for (int i = 0; i < 50; ++i) {
    auto reply = reply_of(calls[static_cast<size_t>(i)]);
    EXPECT_EQ(reply->type(), tr::MessageType::PYTHON_RET);
    EXPECT_EQ(
        std::string(reply->payload().begin(), reply->payload().end()),
        "call " + std::to_string(i));
    EXPECT_TRUE(torch::equal(
        reply->tensors().at(0), torch::full({256}, static_cast<float>(i + 1))));
  }
  // 64 MiB crosses in shared memory on this host.
  auto big = torch::rand({16 << 20});
  auto reply = reply_of(p.a->send(to, make_message("big", {big})));
  EXPECT_TRUE(torch::equal(reply->tensors().at(0), big + 1));
  EXPECT_EQ(p.a->connection_kind("w1"), "shm");
  EXPECT_EQ(p.a->getMetrics().at("agent.client_active_calls"), "0");
}

TEST(AgentTest, NamesIdsAndBadRequestsFailClearly) {
  Pair p;
  EXPECT_THROW(p.a->getWorkerInfo("nobody"), c10::Error);
  EXPECT_THROW(p.a->getWorkerInfo(tr::worker_id_t{5}), c10::Error);
  const auto& to = p.a->getWorkerInfo("w1");
  EXPECT_THROW(
      p.a->send(to, make_message("", {}, tr::MessageType::PYTHON_RET)),
      c10::Error);
  tr::DeviceMap map{{c10::Device("cpu"), c10::Device("cpu")}};
  try {
    p.a->send(to, make_message("", {}), tr::kUnsetRpcTimeout, map);
    FAIL() << "a device map was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("CPU tensors only"), std::string::npos);
  }
}

TEST(AgentTest, ATimedOutCallSaysSoInTorchsWords) {
  auto held = std::make_shared<std::promise<void>>();
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto make = [&](int rank) {
    return std::make_shared<Agent>(
        store,
        "w" + std::to_string(rank),
        rank,
        2,
        test_options(),
        std::make_unique<EchoCallback>(held));
  };
  auto fb = std::async(std::launch::async, make, 1);
  auto a = make(0);
  auto b = fb.get();
  a->start();
  b->start();
  auto f = a->send(a->getWorkerInfo("w1"), make_message("hold", {}), 0.2F);
  f->wait();
  ASSERT_TRUE(f->hasError());
  EXPECT_NE(
      f->tryRetrieveErrorMessage().find(
          "RPC ran for more than set timeout (200 ms)"),
      std::string::npos)
      << f->tryRetrieveErrorMessage();
  EXPECT_EQ(tr::getRPCErrorType(*f), tr::RPCErrorType::TIMEOUT);
  a->shutdown();
  b->shutdown();
}

TEST(AgentTest, AMisbehavingWorkerGetsErrorsAndTheAgentServesOn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  // Worker 1 is a bare transport that sends what it likes.
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<transport::Message> replies;
  transport::TransportOptions o;
  o.self_id = 1;
  o.self_name = "raw";
  o.shared_memory = false;
  o.message_types = torch_message_types();
  transport::Transport raw(
      o,
      {.on_message =
           [&](const transport::Pipe&, transport::Message m) {
             std::lock_guard lock(mutex);
             replies.push_back(std::move(m));
             cv.notify_all();
           },
       .on_closed = [](const transport::Pipe&, const std::string&) {}});
  transport::PeerAddress me{1, "raw", "127.0.0.1", raw.port(), "", ""};
  auto entry = rpc_core::encode_peer(me);
  store->set(
      rpc_core::peer_key(1), std::vector<uint8_t>(entry.begin(), entry.end()));
  auto agent = std::make_shared<Agent>(
      store, "w0", 0, 2, test_options(), std::make_unique<EchoCallback>());
  agent->start();
  raw.set_peers({test::published_entry(*store, 0), me});
  auto pipe = raw.pipe_to(0);

  auto good = to_wire(make_message("fine", {torch::ones({2})}));
  std::vector<transport::Message> bad(4, good);
  bad[0].metadata.resize(1);
  bad[1].metadata = bad[1].metadata.substr(0, 4) + "garbage";
  bad[2].buffers.resize(1);
  bad[3].buffers[1] = Buffer(std::string(3, 'x'));
  uint64_t id = 100;
  for (auto& m : bad) {
    m.id = id++;
    ASSERT_TRUE(pipe.send(std::move(m)));
  }
  good.id = id;
  ASSERT_TRUE(pipe.send(std::move(good)));
  std::unique_lock lock(mutex);
  ASSERT_TRUE(cv.wait_for(lock, 20s, [&] { return replies.size() == 5; }));
  for (auto& r : replies) {
    auto msg = from_wire(r);
    if (r.id == id) {
      EXPECT_EQ(msg->type(), tr::MessageType::PYTHON_RET);
      EXPECT_TRUE(torch::equal(msg->tensors().at(0), torch::full({2}, 2.0f)));
    } else {
      EXPECT_EQ(msg->type(), tr::MessageType::EXCEPTION) << r.id;
    }
  }
  lock.unlock();
  agent->shutdown();
}

TEST(AgentTest, BadOptionsAndAGroupThatDoesNotFormFailClearly) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto make = [&](AgentOptions o, int rank = 0, int world = 1) {
    return std::make_shared<Agent>(
        store, "w", rank, world, o, std::make_unique<EchoCallback>());
  };
  auto o = test_options();
  o.transports = {"shm"};
  EXPECT_THROW(make(o), c10::Error);
  o = test_options();
  o.lanes = 99;
  EXPECT_THROW(make(o), c10::Error);
  o = test_options();
  o.num_worker_threads = 0;
  EXPECT_THROW(make(o), c10::Error);
  EXPECT_THROW(make(test_options(), 2, 2), c10::Error);
  o = test_options();
  o.rpcTimeoutSeconds = 0.3F;
  try {
    make(o, 0, 2);  // rank 1 never comes
    FAIL() << "a group of one formed";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not complete"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tide::torch_rpc
