#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "tide/common/logging.h"

#include "rpc_core/call_table.h"
#include "rpc_core/message_types.h"
#include "rpc_core/options.h"
#include "rpc_core/peer_group.h"
#include "transport/transport.h"
#include "transport/workers.h"

// One worker's end of an rpc group, the middle both front ends stand on:
// its transport, the threads that serve requests and complete calls, the
// table of its calls, and the group it met. A front end (the C++ agent, the
// torch backend's agent) brings the codec: what its requests and replies
// carry, and how a request is served.
//
//   messages on a connection this side opened   replies: Handlers::on_reply
//                                               (the front end reads one
//                                               and ends its call here)
//   messages on a connection a peer opened      requests: Handlers::on_request
//   a connection this side opened closing       its calls end kLost
//
// Stopping is one sequence: the transport shuts down and its thread ends,
// the calls left end kStopped, then the pools finish what they hold.
//
// Thread safety: the accessors from any thread; meet() and stop() from the
// front end's owner.
namespace tide::rpc_core {

template <typename Reply>
class Endpoint {
 public:
  struct Handlers {
    // On the loop; what they throw drops the connection (transport.h).
    std::function<void(const transport::Pipe&, transport::Message)> on_request;
    std::function<void(const transport::Pipe&, transport::Message)> on_reply;
    // Any connection closing, before its calls end (optional): a front end
    // that retries learns first that the peer is lost.
    std::function<void(const transport::Pipe&, const std::string&)> on_closed;
    // Whether a reply carries the callee's exception, for the metrics
    // (CallTable's is_error). Empty: an ERROR message when Reply is a
    // transport::Message (the C++ agent's), else none.
    typename CallTable<Reply>::IsError is_error_reply;
  };

  // Starts the transport on checked `options` (rpc_core::checked) for
  // worker `rank` called `name`, taking `types`; `thread_init` runs first
  // on each pool thread. Throws as Transport's constructor.
  Endpoint(
      const Options& options,
      int rank,
      std::string name,
      const transport::MessageTypes& types,
      Handlers handlers,
      std::function<void()> thread_init = {})
      : name_(std::move(name)), handlers_(std::move(handlers)) {
    transport_ = std::make_unique<transport::Transport>(
        transport_options(options, rank, name_, types),
        transport::TransportHandlers{
            .on_message =
                [this](const transport::Pipe& pipe, transport::Message m) {
                  if (pipe.outgoing()) {
                    handlers_.on_reply(pipe, std::move(m));
                  } else {
                    handlers_.on_request(pipe, std::move(m));
                  }
                },
            .on_closed =
                [this](const transport::Pipe& pipe, const std::string& why) {
                  if (handlers_.on_closed) {
                    handlers_.on_closed(pipe, why);
                  }
                  if (pipe.outgoing()) {
                    calls_->on_closed(pipe, why);
                  }
                },
        });
    auto threads = static_cast<size_t>(options.num_worker_threads);
    workers_ =
        std::make_unique<transport::Workers>(*transport_, threads, thread_init);
    completions_ = std::make_shared<transport::Workers>(
        *transport_, threads, std::move(thread_init));
    auto is_error = handlers_.is_error_reply;
    if constexpr (std::is_same_v<Reply, transport::Message>) {
      if (!is_error) {
        is_error = [](const transport::Message& m) {
          return m.type == MessageType::kError;
        };
      }
    }
    calls_ = std::make_unique<CallTable<Reply>>(*transport_, is_error);
  }
  ~Endpoint() {
    stop("the rpc agent of worker '" + name_ + "' is shut down");
  }
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  transport::Transport& transport() {
    return *transport_;
  }
  // Run the requests served here; a function may block its thread.
  transport::Workers& workers() {
    return *workers_;
  }
  // Complete this worker's calls, whose continuations run user code that
  // may block: threads of their own, so that a completion never waits
  // behind functions that block (they may be waiting for it), nor runs on
  // the loop (a continuation blocking there would stop the reading).
  // Shared: futures may hold it past the endpoint (joined, it runs work on
  // the completing thread).
  const std::shared_ptr<transport::Workers>& completions() {
    return completions_;
  }
  CallTable<Reply>& calls() {
    return *calls_;
  }

  // Meets the group through `store` (peer_group.h's meet) and tells the
  // transport where everyone listens; returns the peers by rank. Throws as
  // meet().
  std::vector<transport::PeerAddress> meet(
      GroupStore& store,
      int rank,
      const std::string& listen_host,
      int world_size,
      std::chrono::milliseconds timeout) {
    transport::PeerAddress me{
        rank,
        name_,
        listen_host,
        transport_->port(),
        transport::local_host_key(),
        transport_->local_name()};
    auto peers = rpc_core::meet(store, me, world_size, timeout);
    transport_->set_peers(peers);
    TIDE_LOG_DEBUG(
        "[{}] rpc worker up: rank {} of {}, port {}",
        name_,
        rank,
        world_size,
        transport_->port());
    return peers;
  }

  // Shuts the transport down and waits for its thread, ends the calls left
  // kStopped with `why`, then lets the pools finish. Idempotent.
  void stop(const std::string& why) {
    if (stopped_) {
      return;
    }
    stopped_ = true;
    transport_->shutdown();
    transport_->join();
    calls_->fail_all(why);
    workers_->join();
    completions_->join();
  }

 private:
  const std::string name_;
  const Handlers handlers_;
  bool stopped_ = false;
  // The calls and pools outlive the transport, which reports to them until
  // its thread ends.
  std::unique_ptr<CallTable<Reply>> calls_;
  std::unique_ptr<transport::Workers> workers_;
  std::shared_ptr<transport::Workers> completions_;
  std::unique_ptr<transport::Transport> transport_;
};

}  // namespace tide::rpc_core
