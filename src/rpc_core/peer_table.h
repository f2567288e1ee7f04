#pragma once

#include <map>
#include <string>
#include <vector>

// The group's workers as a front end names them (tide's WorkerInfo,
// torch's), by id and by name: filled once from what PeerGroup's meet()
// returns, in id order, and read-only after that.
//
// Thread safety: any thread once filled (no writer after the group met).
namespace tide::rpc_core {

template <typename Info>
class PeerTable {
 public:
  // The next worker; peers come in id order (0, 1, ...).
  void add(const std::string& name, Info info) {
    ids_.emplace(name, static_cast<int>(infos_.size()));
    names_ += (names_.empty() ? "" : ", ") + name;
    infos_.push_back(std::move(info));
  }
  // The worker named `name`, or null.
  const Info* find(const std::string& name) const {
    auto it = ids_.find(name);
    return it == ids_.end() ? nullptr
                            : &infos_[static_cast<size_t>(it->second)];
  }
  // The worker of id `id`, or null.
  const Info* find(int id) const {
    return id >= 0 && static_cast<size_t>(id) < infos_.size()
               ? &infos_[static_cast<size_t>(id)]
               : nullptr;
  }
  const std::vector<Info>& all() const {
    return infos_;
  }
  // "a, b, c", in id order: for an error that lists the group.
  const std::string& names() const {
    return names_;
  }

 private:
  std::vector<Info> infos_;  // by id
  std::map<std::string, int> ids_;
  std::string names_;
};

}  // namespace tide::rpc_core
