#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "tide/common/error.h"
#include "tide/common/future.h"
#include "tide/rpc/rpc.h"
#include "tide/rpc/tensor.h"

// RemoteModule<M>: a torch::nn::Module built on another worker and called
// like a local one (torch.distributed.nn.RemoteModule). Include it, like
// tensor.h, only where libtorch is linked.
//
//   struct Stage : torch::nn::Module {
//     Stage(int64_t in, int64_t out) : fc(register_module("fc",
//                                          torch::nn::Linear(in, out))) {}
//     at::Tensor forward(at::Tensor x) { return torch::relu(fc(x)); }
//     torch::nn::Linear fc;
//   };
//   TIDE_RPC_MODULE(Stage, int64_t, int64_t);  // on every worker: how to
//                                              // build one, its methods
//
//   RemoteModule<Stage> s("worker1/cpu", int64_t{4}, int64_t{8});
//   at::Tensor y = s.forward<at::Tensor>(x);
//   Future<at::Tensor> f = s.forward_async<at::Tensor>(x);
//   std::vector<RRef<at::Tensor>> params = s.remote_parameters();
//
// C++ cannot send a class: TIDE_RPC_MODULE registers a factory under the
// module type's name, with the constructor's argument types, and the
// methods a RemoteModule calls (forward, train, parameters). The module
// lives on its owner behind an RRef<std::shared_ptr<M>> (module_rref()); a
// RemoteModule passed in an rpc travels as that RRef and is the same
// module on the other side. What cannot work remotely (parameters() as
// local tensors, to(), state_dict(), hooks) is not there; CPU only.
namespace tide::rpc {

namespace detail {

template <typename M>
std::string module_factory() {
  return "tide.module." + std::string(type_name<M>());
}

// "worker1/cpu", "worker1", "rank:1/cpu" -> the worker's name.
inline std::string remote_device_worker(
    const RpcAgent& agent, const std::string& remote_device) {
  std::string where = remote_device;
  std::string device = "cpu";
  if (auto slash = remote_device.find('/'); slash != std::string::npos) {
    where = remote_device.substr(0, slash);
    device = remote_device.substr(slash + 1);
  }
  if (device != "cpu") {
    throw InvalidArgument(
        "RemoteModule on '" + remote_device +
        "': tide runs remote modules on the CPU only, not on '" + device + "'");
  }
  if (where.rfind("rank:", 0) == 0) {
    int rank = -1;
    try {
      rank = std::stoi(where.substr(5));
    } catch (const std::exception&) {
    }
    auto infos = agent.worker_infos();
    if (rank < 0 || static_cast<size_t>(rank) >= infos.size()) {
      throw InvalidArgument(
          "RemoteModule on '" + remote_device + "': no worker of that rank");
    }
    return infos[static_cast<size_t>(rank)].name;
  }
  if (where.empty()) {
    throw InvalidArgument(
        "RemoteModule needs a remote device like \"worker1/cpu\" or "
        "\"rank:1/cpu\"; got '" +
        remote_device + "'");
  }
  return agent.get_worker_info(where).name;
}

// forward() of M, as a method of the RRef's std::shared_ptr<M>.
template <typename M, typename R, typename C, typename... A>
void register_forward(R (C::*)(A...)) {
  register_method_of<std::shared_ptr<M>>(
      "forward",
      std::function<R(std::shared_ptr<M>&, A...)>(
          [](std::shared_ptr<M>& m, A... a) {
            return m->forward(std::forward<A>(a)...);
          }));
}

template <typename M, typename... A>
bool register_module() {
  using Ptr = std::shared_ptr<M>;
  register_global_function(module_factory<M>(), [](A... args) {
    return std::make_shared<M>(std::move(args)...);
  });
  register_forward<M>(&M::forward);
  register_method_of<Ptr>("train", [](Ptr& m, bool on) { m->train(on); });
  register_method_of<Ptr>("parameters", [](Ptr& m, bool recurse) {
    std::vector<RRef<at::Tensor>> out;
    for (const at::Tensor& p : m->parameters(recurse)) {
      out.emplace_back(p);  // shares the parameter's storage
    }
    return out;
  });
  return true;
}

}  // namespace detail

template <typename M>
class RemoteModule {
 public:
  using ModulePtr = std::shared_ptr<M>;

  // Builds an M on `remote_device` ("worker/cpu", "rank:1/cpu") with
  // `args` (TIDE_RPC_MODULE's types), through the process's agent or
  // `agent`. Returns at once; an error of the construction surfaces on the
  // first call.
  template <typename... A>
  explicit RemoteModule(const std::string& remote_device, const A&... args)
      : RemoteModule(current_agent(), remote_device, args...) {}
  template <typename... A>
  RemoteModule(
      RpcAgent& agent, const std::string& remote_device, const A&... args)
      : module_(agent.remote<ModulePtr>(
            detail::remote_device_worker(agent, remote_device),
            detail::module_factory<M>(),
            args...)) {}
  // Another RemoteModule on the module `module_rref` refers to (torch's
  // init_from_module_rref).
  explicit RemoteModule(RRef<ModulePtr> module_rref)
      : module_(std::move(module_rref)) {}

  // module.forward(args...) on the owner; R is what forward returns.
  template <typename R, typename... A>
  R forward(const A&... args) const {
    return module_.rpc_sync().template call<R>("forward", args...);
  }
  template <typename R, typename... A>
  Future<R> forward_async(const A&... args) const {
    return module_.rpc_async().template call<R>("forward", args...);
  }

  // An RRef to each parameter, owned where the module is (for a
  // distributed optimizer).
  std::vector<RRef<at::Tensor>> remote_parameters(bool recurse = true) const {
    return module_.rpc_sync().template call<std::vector<RRef<at::Tensor>>>(
        "parameters", recurse);
  }

  void train(bool on = true) const {
    module_.rpc_sync().template call<void>("train", on);
  }
  void eval() const {
    train(false);
  }

  const RRef<ModulePtr>& module_rref() const {
    return module_;
  }
  WorkerInfo owner() const {
    return module_.owner();
  }

 private:
  RRef<ModulePtr> module_;
};

template <typename M>
struct Codec<RemoteModule<M>> {
  static void write(Encoder& e, const RemoteModule<M>& m) {
    detail::write(e, m.module_rref());
  }
  static RemoteModule<M> read(Decoder& d) {
    return RemoteModule<M>(
        detail::read<RRef<typename RemoteModule<M>::ModulePtr>>(d));
  }
};

}  // namespace tide::rpc

// Registers module type M for RemoteModule<M> on every agent of the
// process: its factory, taking the constructor arguments of the types
// listed, and the methods RemoteModule calls. Once per program, in a file
// the linker keeps: TIDE_RPC_MODULE(Stage, int64_t, int64_t);
#define TIDE_RPC_MODULE(M, ...)                                           \
  [[maybe_unused]] static const bool TIDE_RPC_METHOD_NAME_(__COUNTER__) = \
      ::tide::rpc::detail::register_module<M __VA_OPT__(, ) __VA_ARGS__>()
