#include "tide/rendezvous/registry.h"

#include <dlfcn.h>

#include <algorithm>

#include "tide/common/logging.h"
#include "tide/rendezvous/dynamic_rendezvous.h"
#include "tide/rendezvous/static_rendezvous.h"

namespace tide::rendezvous {

void HandlerRegistry::add(const std::string& backend, HandlerFactory factory) {
  std::lock_guard lock(mutex_);
  for (const auto& [name, f] : factories_) {
    if (name == backend) {
      throw InvalidArgument(
          "rendezvous backend \"" + backend + "\" is already registered");
    }
  }
  factories_.emplace_back(backend, std::move(factory));
}

std::unique_ptr<RendezvousHandler> HandlerRegistry::create(
    const RendezvousParameters& params) {
  HandlerFactory factory;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [name, f] : factories_) {
      if (name == params.backend) {
        factory = f;
      }
    }
  }
  if (!factory) {
    std::string known;
    for (const auto& name : backends()) {
      known += (known.empty() ? "" : ", ") + name;
    }
    throw InvalidArgument(
        "unknown rendezvous backend \"" + params.backend +
        "\"; known: " + known);
  }
  return factory(params);
}

std::vector<std::string> HandlerRegistry::backends() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> names;
  for (const auto& [name, f] : factories_) {
    names.push_back(name);
  }
  return names;
}

namespace {

void register_builtins(HandlerRegistry& registry) {
  registry.add("static", [](const RendezvousParameters& p) {
    return std::make_unique<StaticRendezvousHandler>(p);
  });
  registry.add("c10d", make_c10d_handler);
  registry.add("etcd", make_etcd_handler);
}

}  // namespace

HandlerRegistry& handler_registry() {
  static HandlerRegistry* registry = [] {
    auto* r = new HandlerRegistry();
    register_builtins(*r);
    return r;
  }();
  return *registry;
}

std::shared_ptr<store::Store> open_job_store(
    const RendezvousParameters& params, std::chrono::milliseconds timeout) {
  if (params.backend == "c10d") {
    return open_c10d_job_store(params, timeout);
  }
  if (params.backend == "etcd") {
    return open_etcd_job_store(params, timeout);
  }
  throw InvalidArgument(
      "the " + params.backend +
      " rendezvous keeps no status records to read; c10d and etcd jobs do");
}

void load_handler_plugin(const std::string& path) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    throw InvalidArgument(
        "cannot load rendezvous plugin " + path + ": " + ::dlerror());
  }
  auto* fn = reinterpret_cast<RegisterHandlersFn>(
      ::dlsym(lib, "tide_register_rendezvous"));
  if (fn == nullptr) {
    throw InvalidArgument(
        "rendezvous plugin " + path +
        " does not define extern \"C\" tide_register_rendezvous");
  }
  // The library stays loaded: the handlers it registered live in it.
  std::vector<std::string> before = handler_registry().backends();
  fn(handler_registry());
  std::string added;
  for (const std::string& b : handler_registry().backends()) {
    if (std::find(before.begin(), before.end(), b) == before.end()) {
      added += (added.empty() ? "" : ", ") + b;
    }
  }
  TIDE_LOG_INFO(
      "rendezvous plugin {} loaded; it adds the backends: {}",
      path,
      added.empty() ? "none" : added);
}

}  // namespace tide::rendezvous
