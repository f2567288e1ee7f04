#pragma once

#include <string>
#include <vector>

#include "tide/rendezvous/rendezvous_handler.h"

namespace tide::rendezvous {

// Logs a warning for every --rdzv-conf key the backend does not know (a
// typo would otherwise silently keep the default).
void warn_unknown_conf_keys(
    const RendezvousParameters& params, const std::vector<std::string>& known);

// The keys of DynamicRendezvousSettings, which every dynamic backend reads,
// plus read_timeout; a backend adds its own.
std::vector<std::string> dynamic_conf_keys(
    std::initializer_list<const char*> backend_keys);

}  // namespace tide::rendezvous
