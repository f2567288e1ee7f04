#pragma once

#include <optional>
#include <string>

#include "tide/agent/worker_spec.h"
#include "tide/launcher/launcher.h"

// What tiderun must know of the torch its Python workers import, asked of
// their interpreter before the first worker starts.
namespace tiderun {

struct TorchFacts {
  // torch's package directory and version (torch/version.py's __version__).
  std::string dir;
  std::string version;
  // torch >= 2.4's TCPStore asks for its libuv backend unless told not to,
  // and a torch built without libuv (Debian's) then fails every store it
  // makes: the agent store's client, which torch makes without reading
  // USE_LIBUV, included.
  bool defaults_to_libuv = false;
  bool has_libuv = true;
};

// Finds the torch that `python` imports without importing it (its version
// file, about 30 ms of interpreter start); for a torch >= 2.4, whether it
// has libuv, which takes importing torch.distributed (seconds) the first
// time and is kept in $XDG_CACHE_HOME/tide (else ~/.cache/tide), keyed by
// torch's directory and its version file's change time. nullopt when
// `python` imports no torch or cannot be run; the facts it could not learn
// are logged and left at torch's defaults (has_libuv).
std::optional<TorchFacts> probe_torch(const std::string& python);

// Fits the launch to the torch a Python entrypoint's interpreter imports
// (nothing for other entrypoints, or `no_python`): for a torch that asks
// for libuv without having it, the workers get USE_LIBUV=0 (unless it is
// set) and, on the static backend, host their own store (--rdzv-conf
// agent_store=0, unless given), made anew each attempt, the agent's store
// being out of their reach; logged once. With --store-fan-in, which needs
// the agent's store, such a torch is an InvalidArgument.
void fit_to_torch(
    const tide::agent::Entrypoint& entrypoint,
    bool no_python,
    tide::launcher::LaunchConfig& config);

}  // namespace tiderun
