// at::Tensor over tide's RPC: the codec, and calls between two processes
// over shared memory and over TCP. A binary of its own (tide_tensor_tests):
// the only test code that links libtorch.
#include "tide/rpc/tensor.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/rpc/rpc.h"
#include "tide/store/tcp_store.h"

#include "support/subprocess.h"

namespace tide::rpc {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

struct Encoded {
  std::string stream;
  std::vector<Buffer> buffers;
};

template <typename T>
Encoded encode_one(const T& v) {
  Encoded out;
  Encoder e(out.stream, &out.buffers);
  encode(e, v);
  return out;
}

template <typename T>
T decode_one(const Encoded& in) {
  Decoder d(in.stream, in.buffers);
  T v = decode<T>(d);
  d.finish();
  return v;
}

at::Tensor round_trip(const at::Tensor& t) {
  return decode_one<at::Tensor>(encode_one(t));
}

// A one-dimensional tensor as a sender could write it, whatever it says.
Encoded raw_vector(
    const std::string& dtype, uint64_t size, uint64_t stride, size_t bytes) {
  Encoded out;
  Encoder w(out.stream, &out.buffers);
  w.write_tag(Tag::kTensor);
  w.write_fixed<uint8_t>(1);
  detail::write_string(w, dtype);
  w.write_fixed<uint8_t>(0);
  w.write_varint(1);
  w.write_varint(size);
  w.write_varint(stride);
  w.write_varint(w.add_buffer(std::string(bytes, '\0')));
  return out;
}

std::string decode_error(const Encoded& in) {
  try {
    decode_one<at::Tensor>(in);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(TensorCodecTest, KeepsDtypeShapeValuesAndRequiresGrad) {
  for (auto dtype :
       {at::kFloat,
        at::kDouble,
        at::kHalf,
        at::kBFloat16,
        at::kLong,
        at::kInt,
        at::kShort,
        at::kChar,
        at::kByte,
        at::kBool,
        at::kComplexFloat}) {
    at::Tensor t = at::arange(24).remainder(3).to(dtype).reshape({2, 3, 4});
    at::Tensor r = round_trip(t);
    EXPECT_EQ(r.scalar_type(), dtype);
    EXPECT_EQ(r.sizes(), t.sizes());
    EXPECT_TRUE(at::equal(r, t)) << c10::toString(dtype);
    EXPECT_FALSE(r.requires_grad());
  }
  at::Tensor g = at::rand({5}).requires_grad_();
  at::Tensor r = round_trip(g);
  EXPECT_TRUE(r.requires_grad());
  EXPECT_TRUE(r.is_leaf());
  EXPECT_TRUE(at::equal(r, g.detach()));
}

TEST(TensorCodecTest, SendsTheStorageWithoutCopyingIt) {
  at::Tensor t = at::rand({1000});
  Encoded e = encode_one(t);
  ASSERT_EQ(e.buffers.size(), 1u);
  EXPECT_EQ(e.buffers[0].data(), t.data_ptr());
  EXPECT_EQ(e.buffers[0].size(), 4000u);
  // The receiver's tensor is made on the received bytes.
  at::Tensor r = decode_one<at::Tensor>(e);
  EXPECT_EQ(r.data_ptr(), t.data_ptr());
}

TEST(TensorCodecTest, AViewSendsOnlyWhatItCovers) {
  at::Tensor storage = at::arange(1 << 20, at::kFloat);
  at::Tensor slice = storage.slice(0, 1000, 1010);
  Encoded e = encode_one(slice);
  EXPECT_EQ(e.buffers[0].size(), 40u);
  EXPECT_TRUE(at::equal(decode_one<at::Tensor>(e), slice));

  // A stepped view goes contiguous: 10 elements, not the 19 it spans.
  at::Tensor stepped = storage.slice(0, 0, 20, 2);
  e = encode_one(stepped);
  EXPECT_EQ(e.buffers[0].size(), 40u);
  at::Tensor r = decode_one<at::Tensor>(e);
  EXPECT_TRUE(at::equal(r, stepped));
  EXPECT_TRUE(r.is_contiguous());
}

TEST(TensorCodecTest, ADenseTransposeKeepsItsStrides) {
  at::Tensor t = at::arange(12, at::kFloat).reshape({3, 4}).t();
  at::Tensor r = round_trip(t);
  EXPECT_EQ(r.strides(), t.strides());
  EXPECT_FALSE(r.is_contiguous());
  EXPECT_TRUE(at::equal(r, t));
}

TEST(TensorCodecTest, UndefinedEmptyAndScalarTensors) {
  EXPECT_FALSE(round_trip(at::Tensor()).defined());
  at::Tensor empty = at::zeros({0, 3});
  EXPECT_EQ(round_trip(empty).sizes(), empty.sizes());
  at::Tensor scalar = at::ones({});
  at::Tensor r = round_trip(scalar);
  EXPECT_EQ(r.dim(), 0);
  EXPECT_EQ(r.item<float>(), 1.0f);
}

TEST(TensorCodecTest, TensorsNestInContainers) {
  std::vector<at::Tensor> v = {at::ones({2}), at::zeros({3})};
  auto r = decode_one<std::tuple<std::vector<at::Tensor>, int>>(
      encode_one(std::tuple(v, 7)));
  EXPECT_TRUE(at::equal(std::get<0>(r)[1], v[1]));
  EXPECT_EQ(std::get<1>(r), 7);
}

TEST(TensorCodecTest, MalformedTensorsFailClearly) {
  Encoded e = encode_one(at::rand({4}));
  e.buffers[0] = Buffer(std::string(12, '\0'));
  EXPECT_THAT(
      decode_error(e),
      HasSubstr("tensor of 4 float32 elements (strides reaching 4) does not "
                "match its buffer of 12 bytes"));

  // Strides that reach past the buffer.
  EXPECT_THAT(
      decode_error(raw_vector("float32", 4, 1000, 16)),
      HasSubstr("strides reaching 3001"));
  // A shape whose byte count wraps around 2^64: 2^61 + 1 float64s would
  // be 8 bytes.
  EXPECT_THAT(
      decode_error(raw_vector("float64", (uint64_t{1} << 61) + 1, 1, 8)),
      HasSubstr("tensor shape overflows"));

  Encoded dtype = encode_one(at::rand({1}));
  dtype.stream.replace(dtype.stream.find("float32"), 7, "float99");
  EXPECT_THAT(decode_error(dtype), HasSubstr("unknown dtype 'float99'"));

  Encoded missing = encode_one(at::rand({1}));
  missing.buffers.clear();
  EXPECT_THAT(decode_error(missing), HasSubstr("buffer 0 does not exist"));

  // And the other way: a tensor where an int was expected.
  Decoder d(missing.stream, missing.buffers);
  EXPECT_THROW(decode<int>(d), InvalidArgument);
}

TEST(TensorCodecTest, UnsupportedTensorsFailOnTheSender) {
  at::Tensor sparse = at::ones({2, 2}).to_sparse();
  try {
    encode_one(sparse);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("strided layout"));
  }
}

// Calls between this process and a re-executed copy of it (the "server"),
// which serves echo, sum and fill over the given transports.
class TensorRpcTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    store_ = std::make_unique<store::TcpStore>(store::TcpStoreOptions{
        .host = "127.0.0.1", .port = 0, .is_server = true, .timeout = 30s});
    server_ = std::make_unique<test::Subprocess>(
        std::vector<std::string>{"/proc/self/exe"},
        test::SubprocessOptions{
            .env = {
                {"TIDE_TENSOR_TEST_CHILD", std::to_string(store_->port())},
                {"TIDE_TENSOR_TEST_TRANSPORTS", GetParam()}}});
    agent_ = std::make_unique<RpcAgent>(
        "driver", 0, 2, options(GetParam()), client(store_->port()));
    ASSERT_EQ(server_->read_line(30s), "ready");
  }

  void TearDown() override {
    if (agent_) {
      agent_->shutdown(true);
    }
    EXPECT_EQ(server_->wait(30s), 0);
  }

  static RpcBackendOptions options(const std::string& transports) {
    RpcBackendOptions o;
    o.transports = transports == "tcp" ? std::vector<std::string>{"tcp"}
                                       : std::vector<std::string>{"shm", "tcp"};
    return o;
  }

  static std::shared_ptr<store::Store> client(uint16_t port) {
    return std::make_shared<store::TcpStore>(store::TcpStoreOptions{
        .host = "127.0.0.1", .port = port, .timeout = 30s});
  }

  std::unique_ptr<store::TcpStore> store_;
  std::unique_ptr<test::Subprocess> server_;
  std::unique_ptr<RpcAgent> agent_;
};

TEST_P(TensorRpcTest, EchoesSmallAndLargeTensors) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{16} << 20}) {
    at::Tensor t = at::rand({n});
    at::Tensor r = agent_->rpc_sync<at::Tensor>("server", "echo", t);
    EXPECT_TRUE(at::equal(r, t)) << n;
  }
  EXPECT_EQ(agent_->transport_to("server"), GetParam());
  auto stats = agent_->transport_stats();
  if (GetParam() == "shm") {
    // The 64 MiB tensor went through a segment, both ways.
    EXPECT_EQ(stats.buffers_via_shm, 1u);
    EXPECT_EQ(stats.bytes_via_shm, uint64_t{64} << 20);
  } else {
    EXPECT_EQ(stats.buffers_via_shm, 0u);
  }
}

// Over TCP the caller opens lanes beside its connection once the handshake
// is done; from then on a large tensor is cut over them, both ways, and put
// together whole.
TEST_P(TensorRpcTest, LargeTensorsAreCutOverTcpLanesBothWays) {
  at::Tensor t = at::rand({int64_t{4} << 20});  // 16 MiB
  bool tcp = GetParam() == "tcp";
  for (int i = 0;
       tcp && i < 100 && agent_->transport_stats().buffers_via_lanes == 0;
       ++i) {
    ASSERT_TRUE(
        at::equal(agent_->rpc_sync<at::Tensor>("server", "echo", t), t));
  }
  auto before = agent_->transport_stats();
  int64_t server_before = agent_->rpc_sync<int64_t>("server", "lane_buffers");
  at::Tensor r = agent_->rpc_sync<at::Tensor>("server", "plus_one", t);
  EXPECT_TRUE(at::equal(r, t.add(1)));
  auto after = agent_->transport_stats();
  int64_t server_after = agent_->rpc_sync<int64_t>("server", "lane_buffers");
  EXPECT_EQ(after.buffers_via_lanes - before.buffers_via_lanes, tcp ? 1u : 0u);
  EXPECT_EQ(
      after.bytes_via_lanes - before.bytes_via_lanes,
      tcp ? uint64_t{16} << 20 : 0u);
  EXPECT_EQ(server_after - server_before, tcp ? 1 : 0);
}

TEST(TensorLanesTest, NoLanesWhenTcpLanesIsZero) {
  auto store = std::make_unique<store::TcpStore>(store::TcpStoreOptions{
      .host = "127.0.0.1", .port = 0, .is_server = true, .timeout = 30s});
  auto client = [&] {
    return std::make_shared<store::TcpStore>(store::TcpStoreOptions{
        .host = "127.0.0.1", .port = store->port(), .timeout = 30s});
  };
  RpcBackendOptions o;
  o.transports = {"tcp"};
  o.tcp_lanes = 0;
  std::unique_ptr<RpcAgent> server;
  std::thread starting([&] {
    server = std::make_unique<RpcAgent>("server", 1, 2, o, client());
  });
  RpcAgent caller("caller", 0, 2, o, client());
  starting.join();
  server->register_function("echo", [](at::Tensor t) { return t; });
  at::Tensor t = at::rand({int64_t{1} << 20});
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(at::equal(caller.rpc_sync<at::Tensor>("server", "echo", t), t));
  }
  EXPECT_EQ(caller.transport_stats().buffers_via_lanes, 0u);
  EXPECT_EQ(server->transport_stats().buffers_via_lanes, 0u);
  o.tcp_lanes = 17;
  EXPECT_THROW(RpcAgent("x", 0, 1, o, client()), InvalidArgument);
  // The graceful shutdown is a barrier: both at once.
  std::thread stopping([&] { server->shutdown(true); });
  caller.shutdown(true);
  stopping.join();
}

TEST_P(TensorRpcTest, SegmentsAreReusedOnceReleased) {
  // Frames go through shared memory once the handshake is acknowledged,
  // which the first reply follows.
  agent_->rpc_sync<double>("server", "sum", at::ones({1}));
  at::Tensor t = at::rand({1 << 20});
  for (int i = 0; i < 20; ++i) {
    at::Tensor r = agent_->rpc_sync<at::Tensor>("server", "echo", t);
    ASSERT_TRUE(at::equal(r, t));
  }
  if (GetParam() == "shm") {
    // The server releases each request's segment right after its reply:
    // a few segments serve all 20 calls (a release may trail the next
    // call).
    EXPECT_LE(agent_->transport_stats().segments, 3u);
    EXPECT_EQ(agent_->transport_stats().buffers_via_shm, 20u);
  }
}

TEST_P(TensorRpcTest, ReceivedTensorsAreWritableAndOutliveTheAgent) {
  at::Tensor t = at::zeros({1 << 18});
  at::Tensor r = agent_->rpc_sync<at::Tensor>("server", "fill", t, 3.0);
  EXPECT_EQ(r.sum().item<double>(), 3.0 * (1 << 18));
  EXPECT_EQ(t.sum().item<double>(), 0.0);  // The caller's copy is untouched.
  r.mul_(2);
  agent_->shutdown(true);
  agent_.reset();
  EXPECT_EQ(r.sum().item<double>(), 6.0 * (1 << 18));
}

TEST_P(TensorRpcTest, ManyTensorsInFlight) {
  std::vector<at::Tensor> sent;
  std::vector<Future<double>> sums;
  for (int i = 0; i < 64; ++i) {
    sent.push_back(
        at::full({i % 2 == 0 ? 100 : 300000}, double(i), at::kDouble));
    sums.push_back(agent_->rpc_async<double>("server", "sum", sent.back()));
  }
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(sums[i].wait(30s), double(i) * sent[i].numel()) << i;
  }
}

TEST_P(TensorRpcTest, AWrongArgumentTypeNamesTheArgument) {
  try {
    agent_->rpc_sync<double>("server", "sum", std::string("not a tensor"));
    FAIL() << "expected RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_THAT(
        e.what(), HasSubstr("sum(): argument 1: expected tensor, got string"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Transports,
    TensorRpcTest,
    ::testing::Values("shm", "tcp"),
    [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tide::rpc

namespace {

void run_child_if_requested() {
  const char* port = std::getenv("TIDE_TENSOR_TEST_CHILD");
  if (port == nullptr) {
    return;
  }
  using namespace std::chrono_literals;
  using namespace tide;
  std::string transports = std::getenv("TIDE_TENSOR_TEST_TRANSPORTS");
  rpc::RpcBackendOptions o;
  o.transports = transports == "tcp" ? std::vector<std::string>{"tcp"}
                                     : std::vector<std::string>{"shm", "tcp"};
  auto store = std::make_shared<store::TcpStore>(store::TcpStoreOptions{
      .host = "127.0.0.1",
      .port = static_cast<uint16_t>(std::atoi(port)),
      .timeout = 30s});
  rpc::RpcAgent agent("server", 1, 2, o, store);
  agent.register_function("echo", [](at::Tensor t) { return t; });
  agent.register_function(
      "sum", [](at::Tensor t) { return t.sum().item<double>(); });
  agent.register_function("fill", [](at::Tensor t, double v) {
    t.fill_(v);  // In place, in the received bytes.
    return t;
  });
  agent.register_function("plus_one", [](at::Tensor t) { return t.add(1); });
  agent.register_function("lane_buffers", [&agent] {
    return static_cast<int64_t>(agent.transport_stats().buffers_via_lanes);
  });
  std::printf("ready\n");
  std::fflush(stdout);
  agent.shutdown(true);
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  run_child_if_requested();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
