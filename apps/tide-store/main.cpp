// tide-store: a standalone TCP store server, wire compatible with torch's
// TCPStore, or with --upstream a store fan-in in front of one. Prints
// "tide-store listening on HOST:PORT" once it accepts connections; exits 0
// on SIGTERM or SIGINT, 2 on a bad command line, 1 when it cannot listen or
// reach its upstream.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/store/tcp_store.h"

#include "cli.h"
#include "net/address.h"

int main(int argc, char** argv) {
  tide::store::TcpStoreServerOptions options;
  options.port = tide::store::kDefaultPort;
  double request_timeout_s = 30;
  std::string upstream;

  CLI::App app{
      "tide-store: a TCP key-value store server that speaks torch's c10d "
      "TCPStore protocol (1.13 and 2.x dialects)",
      "tide-store"};
  app.add_option("--host", options.host, "address to listen on")
      ->capture_default_str();
  app.add_option(
         "--port", options.port, "port to listen on; 0 picks a free one")
      ->capture_default_str();
  app.add_option(
         "--token",
         options.token,
         "require clients to present this token (also TIDE_STORE_TOKEN)")
      ->envname("TIDE_STORE_TOKEN");
  app.add_option(
         "--request-timeout",
         request_timeout_s,
         "seconds a client may take to send one whole request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-key-bytes", options.limits.max_key_bytes)
      ->capture_default_str();
  app.add_option("--max-value-bytes", options.limits.max_value_bytes)
      ->capture_default_str();
  app.add_option("--max-keys-per-call", options.limits.max_keys_per_call)
      ->capture_default_str();
  app.add_option("--max-total-bytes", options.limits.max_total_bytes)
      ->capture_default_str();
  app.add_option(
         "--max-pending-reply-bytes", options.limits.max_pending_reply_bytes)
      ->capture_default_str();
  app.add_option(
      "--upstream",
      upstream,
      "HOST:PORT of a tide store to forward every request to (a store "
      "fan-in: it holds no keys; its clients' identical reads and waits "
      "are asked once; docs/store-fan-in.md); its token from "
      "TIDE_UPSTREAM_TOKEN");
  app.set_version_flag("--version", std::string("tide-store ") + TIDE_VERSION);
  if (auto done = tide::apps::parse_command_line(app, argc, argv)) {
    return *done;
  }
  options.request_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(request_timeout_s * 1000));
  if (!upstream.empty()) {
    try {
      auto [host, port] = tide::net::parse_host_port(upstream);
      const char* token = std::getenv("TIDE_UPSTREAM_TOKEN");
      options.upstream = tide::store::StoreUpstream{
          .host = host, .port = port, .token = token ? token : ""};
    } catch (const tide::Error& e) {
      std::fprintf(
          stderr,
          "tide-store: --upstream must be HOST:PORT, not \"%s\" (%s)\n",
          upstream.c_str(),
          e.what());
      return 2;
    }
  }

  // Block the stop signals in every thread; main waits for them below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  std::unique_ptr<tide::store::TcpStoreServer> server;
  try {
    server = tide::store::TcpStoreServer::start(options);
  } catch (const tide::Error& e) {
    std::fprintf(stderr, "tide-store: %s\n", e.what());
    return 1;
  }
  std::printf(
      "tide-store listening on %s:%u\n", options.host.c_str(), server->port());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop, &sig);
  TIDE_LOG_INFO("tide-store: {} received, shutting down", strsignal(sig));
  server->shutdown();
  server->join();
  return 0;
}
