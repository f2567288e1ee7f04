// A rendezvous backend of your own, loaded by tiderun as a plugin.
//
// "hostlist": the job's nodes are a fixed list of addresses, as a batch
// scheduler hands them out (SLURM_NODELIST, an MPI host file). A node's rank
// is its address' place in the list; the first node hosts the store.
//
//   cmake --build build --target hostlist_rendezvous
//   # on each host (here two on this machine; the other has 127.0.0.2):
//   export TIDE_RDZV_PLUGINS=build/examples/libhostlist_rendezvous.so
//   tiderun --rdzv-backend=hostlist --rdzv-endpoint=127.0.0.1,127.0.0.2
//           --rdzv-conf=port=29555 --nnodes=2 --local-addr=127.0.0.1 train.py
//
// The plugin is compiled against tide's headers and resolves tide's symbols
// from tiderun when loaded; it links nothing of tide itself.
#include <memory>
#include <string>
#include <vector>

#include "tide/common/strings.h"
#include "tide/rendezvous/registry.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

namespace {

using namespace tide;
using namespace tide::rendezvous;

class HostListRendezvousHandler final : public RendezvousHandler {
 public:
  explicit HostListRendezvousHandler(const RendezvousParameters& p)
      : run_id_(p.run_id),
        port_(static_cast<uint16_t>(p.get_as_int("port", 29555))) {
    for (std::string_view h : split(p.endpoint, ',')) {
      hosts_.emplace_back(h);
    }
    if (hosts_.empty() || hosts_.size() != static_cast<size_t>(p.max_nodes) ||
        p.min_nodes != p.max_nodes) {
      throw InvalidArgument(
          "hostlist: --rdzv-endpoint must list exactly --nnodes hosts, "
          "comma-separated");
    }
    for (size_t i = 0; i < hosts_.size(); ++i) {
      if (hosts_[i] == p.local_addr) {
        rank_ = static_cast<int>(i);
      }
    }
    if (rank_ < 0) {
      throw InvalidArgument(
          "hostlist: this node's --local-addr " + p.local_addr +
          " is not in --rdzv-endpoint " + p.endpoint);
    }
  }

  std::string get_backend() const override {
    return "hostlist";
  }

  RendezvousInfo next_rendezvous() override {
    if (!store_) {
      store_ = std::make_shared<store::TcpStore>(store::TcpStoreOptions{
          .host = hosts_[0], .port = port_, .is_server = rank_ == 0});
    }
    return RendezvousInfo{
        .store = std::make_shared<store::PrefixStore>(run_id_, store_),
        .rank = rank_,
        .world_size = static_cast<int>(hosts_.size()),
        .bootstrap = {.master_addr = hosts_[0], .master_port = port_},
    };
  }

  bool is_closed() override {
    return false;
  }
  void set_closed() override {}
  int num_nodes_waiting() override {
    return 0;
  }
  std::string get_run_id() const override {
    return run_id_;
  }
  bool shutdown() override {
    return true;
  }

 private:
  std::string run_id_;
  uint16_t port_;
  std::vector<std::string> hosts_;
  int rank_ = -1;
  std::shared_ptr<store::TcpStore> store_;
};

}  // namespace

extern "C" void tide_register_rendezvous(HandlerRegistry& registry) {
  registry.add("hostlist", [](const RendezvousParameters& p) {
    return std::make_unique<HostListRendezvousHandler>(p);
  });
}
