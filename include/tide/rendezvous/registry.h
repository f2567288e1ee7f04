#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tide/rendezvous/rendezvous_handler.h"

namespace tide::rendezvous {

using HandlerFactory = std::function<std::unique_ptr<RendezvousHandler>(
    const RendezvousParameters&)>;

// Backends by name (torch's rendezvous_handler_registry). Thread safe.
//
//   handler_registry().add("mine", [](const RendezvousParameters& p) {
//     return std::make_unique<MyRendezvousHandler>(p);
//   });
//   auto h = handler_registry().create({.backend = "mine", ...});
class HandlerRegistry {
 public:
  // Throws InvalidArgument when the name is taken.
  void add(const std::string& backend, HandlerFactory factory);
  // Throws InvalidArgument naming the known backends when params.backend is
  // unknown.
  std::unique_ptr<RendezvousHandler> create(const RendezvousParameters& params);
  std::vector<std::string> backends() const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, HandlerFactory>> factories_;
};

// The process-wide registry, with the built-in backends ("static", "c10d",
// "etcd") added.
HandlerRegistry& handler_registry();

// Loads a shared library that adds backends: it defines
//
//   extern "C" void tide_register_rendezvous(
//       tide::rendezvous::HandlerRegistry& registry);
//
// which is called once with handler_registry(). The library resolves tide's
// symbols from the program loading it (tiderun exports them), so it is
// built against tide's headers without linking tide. Throws InvalidArgument
// naming the library when it cannot be loaded or lacks the function.
void load_handler_plugin(const std::string& path);

// A job's status store (RendezvousHandler::open_job_store) opened from
// outside the job, as `tiderun status` does: a client of the c10d store or
// of etcd at params.endpoint (with params.token), that never joins a round.
// `timeout` bounds connecting and each call. Throws InvalidArgument for a
// backend without one, and what connecting throws (TimeoutError when the
// store cannot be reached, NetworkError when it refuses the token).
std::shared_ptr<store::Store> open_job_store(
    const RendezvousParameters& params, std::chrono::milliseconds timeout);

// The C signature of tide_register_rendezvous.
using RegisterHandlersFn = void (*)(HandlerRegistry&);

}  // namespace tide::rendezvous
