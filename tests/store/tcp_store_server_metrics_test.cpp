// The store server's native metrics (docs/observability.md): requests and
// their time by operation, clients, keys, bytes and bad frames, as the
// process's exposition shows them. The registry is the process's: the
// tests compare before and after.
#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "tide/metrics/registry.h"
#include "tide/store/tcp_store.h"

#include "support/raw_client.h"

namespace tide::store {
namespace {

using namespace std::chrono_literals;

// A sample of the process's metrics; 0 before its series is made.
double sample(const std::string& series) {
  return metrics::sample_value(series).value_or(0);
}

struct Samples {
  double sets = sample("tide_store_requests_total{op=\"set\"}");
  double gets = sample("tide_store_requests_total{op=\"get\"}");
  double adds = sample("tide_store_requests_total{op=\"add\"}");
  double set_seconds = sample("tide_store_request_seconds_count{op=\"set\"}");
  double bad = sample("tide_store_bad_requests_total");
  double received = sample("tide_store_bytes_received_total");
  double sent = sample("tide_store_bytes_sent_total");
  double clients = sample("tide_store_clients");
  double keys = sample("tide_store_keys");
};

TEST(TcpStoreServerMetricsTest, CountsRequestsByOperationClientsAndKeys) {
  Samples before;
  auto server = TcpStoreServer::start({});
  {
    TcpStore client({.port = server->port(), .timeout = 10s});
    client.set("a", "1");
    client.set("b", "2");
    client.set("c", "3");
    client.add("n", 5);
    // A request is counted before its reply leaves: once get() returns,
    // every earlier request of this connection is counted.
    EXPECT_EQ(client.get("a"), "1");
    Samples during;
    EXPECT_EQ(during.sets - before.sets, 3);
    EXPECT_EQ(during.adds - before.adds, 1);
    // TcpStore's get() is a WAIT, then a GET.
    EXPECT_EQ(during.gets - before.gets, 1);
    // One request in 16 of each operation is timed, from the first.
    EXPECT_EQ(during.set_seconds - before.set_seconds, 1);
    EXPECT_EQ(during.keys - before.keys, 4);
    EXPECT_GE(during.clients - before.clients, 1);
    EXPECT_GT(during.received, before.received);
    EXPECT_GT(during.sent, before.sent);
  }
  std::string text = metrics::exposition();
  EXPECT_NE(
      text.find("# TYPE tide_store_request_seconds histogram"),
      std::string::npos);
  EXPECT_NE(
      text.find("tide_store_request_seconds_bucket{op=\"set\",le=\"1e-06\"}"),
      std::string::npos)
      << text;
  server.reset();
  // A server that stops takes its clients and keys out of the gauges.
  Samples after;
  EXPECT_EQ(after.clients, before.clients);
  EXPECT_EQ(after.keys, before.keys);
}

TEST(TcpStoreServerMetricsTest, BadFramesAreCountedAndTheServerGoesOn) {
  auto server = TcpStoreServer::start({});
  Samples before;
  {
    test::RawClient raw(server->port());
    ASSERT_TRUE(raw.send("\x63"));  // no such command
    EXPECT_TRUE(raw.closed_within(5s));
  }
  // The close follows the count on the loop thread.
  EXPECT_EQ(Samples().bad - before.bad, 1);
  TcpStore client({.port = server->port(), .timeout = 10s});
  client.set("still", "here");
  EXPECT_EQ(client.get("still"), "here");
}

}  // namespace
}  // namespace tide::store
