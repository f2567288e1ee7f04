#pragma once

#include <initializer_list>
#include <string>

#include "tide/rendezvous/rendezvous_handler.h"

namespace tide::rendezvous {

// Logs a warning for every --rdzv-conf key the backend does not know (a
// typo would otherwise silently keep the default).
void warn_unknown_conf_keys(
    const RendezvousParameters& params,
    std::initializer_list<const char*> known);

}  // namespace tide::rendezvous
