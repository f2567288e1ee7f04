#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/rpc/rpc_agent.h>

#include "rpc_core/options.h"

// tide as a backend of torch.distributed.rpc (docs/rpc.md, "From Python"):
// torch's RpcAgent on tide's transport. torch's frontend makes the
// messages (calls, RRef control, distributed autograd, TorchScript) and its
// RequestCallbackImpl serves them; this agent only carries them: requests
// with their deadlines, responses matched by id, the worker table, join()
// and shutdown. Tensors travel out of band: torch's own pickler writes their
// metadata, and each storage's bytes go as a buffer of the transport (no
// copy on TCP, one into shared memory between processes of a host).
namespace tide::torch_rpc {

namespace tr = torch::distributed::rpc;

// torch's options (the rpc timeout, the init method) and those the rpc
// front ends share (rpc_core/options.h: threads, transports, lanes, token,
// polling, listen host), checked where the C++ agent's are.
struct AgentOptions : tr::RpcBackendOptions, rpc_core::Options {
  AgentOptions() = default;
};

class Agent : public tr::RpcAgent {
 public:
  // Meets the other world_size - 1 workers through `store` (their names,
  // addresses), within the options' rpc timeout. `callback` serves the
  // requests that come (torch's RequestCallbackImpl for Python programs).
  // `worker_thread_init` runs once on each worker thread first.
  // Throws on bad options, a name taken twice, or a group that does not
  // complete.
  Agent(
      const c10::intrusive_ptr<c10d::Store>& store,
      std::string name,
      int rank,
      int world_size,
      AgentOptions options,
      std::unique_ptr<tr::RequestCallback> callback,
      std::function<void()> worker_thread_init = {});
  ~Agent() override;

  c10::intrusive_ptr<tr::JitFuture> send(
      const tr::WorkerInfo& to,
      c10::intrusive_ptr<tr::Message> message,
      float rpc_timeout_seconds = tr::kUnsetRpcTimeout,
      const tr::DeviceMap& device_map = {}) override;

  using tr::RpcAgent::getWorkerInfo;
  const tr::WorkerInfo& getWorkerInfo(
      const std::string& worker_name) const override;
  const tr::WorkerInfo& getWorkerInfo(tr::worker_id_t id) const override;
  std::vector<tr::WorkerInfo> getWorkerInfos() const override;

  // Returns once no worker of the group has a request in flight (rounds of
  // counts through the store); with `shutdown`, this worker then accepts no
  // new request from its callbacks.
  void join(bool shutdown = false, float timeout = 0) override;
  void sync() override {}
  void startImpl() override;
  void shutdownImpl() override;

  std::unordered_map<std::string, std::string> getMetrics() override;

  // "shm" or "tcp" for the connection to `worker`, "" before the first
  // message to it.
  std::string connection_kind(const std::string& worker);
  const AgentOptions& options() const;

  struct Impl;

 private:
  void addGilWaitTime(std::chrono::microseconds gil_wait_time) override;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tide::torch_rpc
