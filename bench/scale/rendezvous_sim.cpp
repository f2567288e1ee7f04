#include "rendezvous_sim.h"

namespace tide::bench::scale {

void add_rendezvous_options(CLI::App& app, RendezvousOptions& o) {
  app.add_option("--nodes", o.nodes)->capture_default_str();
}

int run_rendezvous_bench(const RendezvousOptions&) {
  return 1;
}

}  // namespace tide::bench::scale
