// The books of calls over a real transport: a reply completes its call on
// the thread that reads it, and a continuation that throws there must not
// end the loop.
#include "rpc/calls.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tide/rpc/rpc.h"

#include "rpc/messages.h"
#include "support/eventually.h"
#include "transport/fields.h"

namespace tide::rpc::detail {
namespace {

using namespace std::chrono_literals;

// A replying peer: "echo" answers at once with its arguments, "hold" is
// kept until the test answers it.
struct Server {
  struct Held {
    transport::Pipe pipe;
    uint64_t id;
  };
  std::mutex mutex;
  std::vector<Held> held;  // Guarded by mutex.

  transport::Transport transport{
      {.self_id = 1,
       .self_name = "server",
       .message_types = rpc_message_types()},
      {.on_message =
           [this](const transport::Pipe& pipe, transport::Message m) {
             transport::FieldReader r(m.metadata, "a request");
             std::string fn = r.str();
             if (fn == "hold") {
               std::lock_guard lock(mutex);
               held.push_back({pipe, m.id});
               return;
             }
             m.type = MessageType::kResponse;
             m.metadata.clear();
             pipe.send(std::move(m));
           },
       .on_closed = [](const transport::Pipe&, const std::string&) {}}};
};

TEST(CallsTest, AThrowingContinuationLeavesTheLoopServing) {
  Server server;
  std::unique_ptr<rpc_core::CallTable<transport::Message>> table;
  std::unique_ptr<Calls> calls;
  transport::Transport client(
      {.self_id = 0,
       .self_name = "client",
       .message_types = rpc_message_types()},
      {.on_message =
           [&](const transport::Pipe& pipe, transport::Message m) {
             calls->on_reply(pipe, std::move(m));
           },
       .on_closed =
           [&](const transport::Pipe& pipe, const std::string& why) {
             table->on_closed(pipe, why);
           }});
  table = std::make_unique<rpc_core::CallTable<transport::Message>>(client);
  calls = std::make_unique<Calls>(client, *table);
  client.set_peers(
      {{1,
        "server",
        "127.0.0.1",
        server.transport.port(),
        transport::local_host_key(),
        server.transport.local_name()}});
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) {
    calls->start(1, "hold", 10s, encode_call({}, i))
        .on_complete([&](const Future<Payload>&) {
          ++ran;
          throw std::runtime_error("a careless continuation");
        });
  }
  // Answered only once the continuations are in place: they run on the
  // client's I/O thread, when the replies come.
  ASSERT_TRUE(test::eventually([&] {
    std::lock_guard lock(server.mutex);
    return server.held.size() == 3;
  })) << "calls missing";
  {
    std::lock_guard lock(server.mutex);
    for (auto& h : server.held) {
      std::string one;
      Encoder e(one);
      encode(e, int64_t{1});
      h.pipe.send({MessageType::kResponse, h.id, {}, {Buffer(one)}});
    }
  }
  Payload back =
      calls->start(1, "echo", 10s, encode_call({}, int64_t{42})).wait(10s);
  Decoder d(back.data.view(), back.buffers);
  EXPECT_EQ(std::get<0>(decode_args<std::tuple<int64_t>>(d, "echo")), 42);
  EXPECT_EQ(ran.load(), 3);
  client.shutdown();
  client.join();
}

}  // namespace
}  // namespace tide::rpc::detail
