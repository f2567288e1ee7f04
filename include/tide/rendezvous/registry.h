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

// The process-wide registry, with the built-in backends ("static") added.
HandlerRegistry& handler_registry();

}  // namespace tide::rendezvous
