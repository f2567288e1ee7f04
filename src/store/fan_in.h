#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <asio.hpp>

#include "tide/store/tcp_store.h"

#include "store/mux_connection.h"
#include "store/wire.h"

// A store fan-in's forwarding (TcpStoreServerOptions::upstream,
// docs/store-fan-in.md). The server's connections parse their clients'
// requests as always; instead of a map of keys, the Forwarder sends them to
// the upstream store over one connection in tagged frames, and hands each
// reply back to the client that asked.
//
// What arrives in one turn of the loop goes out in one write: first the
// writes in their order (a run of SETs as one MULTI_SET), then the requests
// with a reply: identical reads (GET, CHECK, MULTI_GET, GETNUMKEYS,
// QUEUE_LEN) asked once, the ADDs to one key summed into one ADD whose
// result is split back in arrival order, and WAITs for the same keys sharing
// one upstream WAIT for as long as it is in flight. Every client has at
// most one request with a reply in flight besides its WAITs (its connection
// is held until the reply), so moving the requests with a reply after the
// others' writes of the same turn reorders only requests that were in
// flight together: each client's own order is kept, and so is torch's
// semantics. A WAIT is answered whenever its keys exist, the requests after
// it meanwhile, as a server holding the keys does.
//
// If the upstream connection is lost, the reads and waits in flight are
// asked again on a new one; a client whose ADD, COMPARE_SET, ... or whose
// last writes may not have reached the store is disconnected, as it would
// be from a store that went away, rather than risk a lost or doubled write.
//
// Loop thread only, but for counts().
namespace tide::store::detail {

class Connection;

class Forwarder {
 public:
  Forwarder(
      asio::io_context& io,
      const StoreUpstream& upstream,
      std::unordered_set<std::shared_ptr<Connection>>& connections);

  // Connects (retrying until the upstream's connect_timeout); throws what
  // connect_tagged throws.
  void start();
  void close();

  // A client's request (neither VALIDATE, AUTH, PING nor CANCEL_WAIT,
  // which the server answers itself). One with a reply, but for WAIT,
  // holds conn until it is answered.
  void forward(const std::shared_ptr<Connection>& conn, wire::Request& req);
  // CANCEL_WAIT: ends conn's WAITs and answers WAIT_CANCELED.
  void cancel_wait(Connection& conn);

  struct Counts {
    uint64_t requests = 0;  // from clients
    uint64_t frames = 0;    // to the upstream store
  };
  Counts counts() const {
    return {requests_.load(), frames_.load()};
  }

 private:
  struct Target {
    std::weak_ptr<Connection> conn;
    // ADD: the deltas of this and the earlier targets of the same ADD.
    int64_t upto = 0;
  };
  struct Entry {
    wire::Request req;
    std::vector<Target> targets;
  };

  void schedule();
  void flush();
  // Sends req under a new tag; registers targets for its reply.
  uint64_t send(wire::Request req, std::vector<Target> targets);
  void write();
  void read();
  void on_reply(uint64_t tag, Entry entry, wire::Reply& reply);
  void lost(const std::string& why);
  void connect(Clock::time_point deadline, bool retry);

  asio::io_context& io_;
  const MuxEndpoint endpoint_;
  const std::string where_;
  std::unordered_set<std::shared_ptr<Connection>>& connections_;
  asio::ip::tcp::socket socket_;
  bool up_ = false;
  bool closed_ = false;
  bool writing_now_ = false;
  std::string out_;
  std::string writing_;
  std::string in_;
  std::vector<char> chunk_ = std::vector<char>(16 * 1024);
  uint64_t next_tag_ = 1;
  // Replies come for frames in the order they were sent (a WAIT's when it
  // is met): a reply to tag t means every frame before t was applied.
  uint64_t confirmed_ = 0;
  std::unordered_map<uint64_t, Entry> pending_;
  // The upstream WAIT in flight for a set of keys (sorted), by its tag.
  std::map<std::vector<std::string>, uint64_t> waits_;
  std::vector<std::pair<std::weak_ptr<Connection>, wire::Request>> window_;
  bool flush_posted_ = false;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> frames_{0};
};

}  // namespace tide::store::detail
