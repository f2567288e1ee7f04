// How the agent starts a worker: its environment (torchrun's variables), its
// launch (the program or function, binding, output), cold or handed to a
// prestarted interpreter (--prestart, agent/prestart.h).
#include <cctype>

#include <fmt/ranges.h>

#include "tide/agent/local_elastic_agent.h"
#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "agent/entrypoint_run.h"
#include "agent/group_processes.h"
#include "agent/worker_process.h"

namespace tide::agent::detail {

namespace {

const char* py_bool(bool b) {
  return b ? "True" : "False";
}

// Python's string.Template.safe_substitute over `values`: $name and
// ${name} replaced, $$ a $, anything else left as it is.
std::string substitute(
    const std::string& text, const std::map<std::string, std::string>& values) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    if (text[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    bool braced = text[i + 1] == '{';
    size_t start = i + (braced ? 2 : 1);
    size_t end = start;
    while (end < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[end])) != 0 ||
            text[end] == '_')) {
      ++end;
    }
    auto it = values.find(text.substr(start, end - start));
    if (it == values.end() ||
        (braced && (end == text.size() || text[end] != '}'))) {
      out += text[i];
      continue;
    }
    out += it->second;
    i = braced ? end : end - 1;
  }
  return out;
}

// --virtual-local-rank's CUDA_VISIBLE_DEVICES: the agent's entry for this
// local rank, or the local rank itself when the agent has no list.
std::string own_device(
    const std::map<std::string, std::string>& env, int local_rank) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it == env.end()) {
    return std::to_string(local_rank);
  }
  auto devices = split(it->second, ',');
  if (static_cast<size_t>(local_rank) >= devices.size()) {
    throw InvalidArgument(
        "local_rank " + std::to_string(local_rank) +
        " exceeds available GPUs in CUDA_VISIBLE_DEVICES=" + it->second);
  }
  return std::string(trim(devices[static_cast<size_t>(local_rank)]));
}

}  // namespace

std::vector<std::string> GroupProcesses::worker_env(const Worker& w) const {
  const WorkerSpec& spec = view_.spec;
  std::map<std::string, std::string> env = base_env_;
  for (const auto& [k, v] : spec.env) {
    env[k] = v;
  }
  auto set = [&](const char* k, const std::string& v) { env[k] = v; };
  if (spec.virtual_local_rank) {
    set("CUDA_VISIBLE_DEVICES", own_device(env, w.local_rank));
    set("LOCAL_RANK", "0");
  } else {
    set("LOCAL_RANK", std::to_string(w.local_rank));
  }
  set("RANK", std::to_string(w.global_rank));
  set("GROUP_RANK", std::to_string(view_.group.group_rank));
  set("ROLE_RANK", std::to_string(w.role_rank));
  set("ROLE_NAME", spec.role);
  set("LOCAL_WORLD_SIZE", std::to_string(spec.local_world_size));
  set("WORLD_SIZE", std::to_string(w.world_size));
  set("GROUP_WORLD_SIZE", std::to_string(view_.group.group_world_size));
  set("ROLE_WORLD_SIZE", std::to_string(w.role_world_size));
  set("MASTER_ADDR",
      spec.master_addr.value_or(view_.rdzv.bootstrap.master_addr));
  set("MASTER_PORT",
      std::to_string(
          spec.master_port.value_or(view_.rdzv.bootstrap.master_port)));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(view_.restarts.used));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(spec.max_restarts));
  set("TORCHELASTIC_RUN_ID", spec.rdzv_handler->get_run_id());
  set("TORCHELASTIC_USE_AGENT_STORE",
      py_bool(spec.rdzv_handler->use_agent_store()));
  set("TORCHELASTIC_ERROR_FILE",
      error_files_[static_cast<size_t>(w.local_rank)]);
  // The components' own (timers, heartbeats), then what every worker gets.
  if (options_.component_env) {
    options_.component_env(env);
  }
  // tide's rpc proves this secret (unless the job chose its own token).
  env.emplace("TIDE_RPC_TOKEN", rpc_secret_);
  // torch 1.13 and today's torch name this differently; set both.
  env.emplace("NCCL_ASYNC_ERROR_HANDLING", "1");
  env.emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) {
    out.push_back(k + "=" + v);
  }
  return out;
}

std::string GroupProcesses::resolve_exe() const {
  const auto* c = std::get_if<Command>(&view_.spec.entrypoint);
  if (c == nullptr) {
    return "";
  }
  auto path = base_env_.find("PATH");
  std::string exe =
      find_executable(c->argv[0], path == base_env_.end() ? "" : path->second);
  if (exe.empty()) {
    throw InvalidArgument(
        "cannot run \"" + c->argv[0] +
        "\": no such executable (PATH searched)");
  }
  return exe;
}

LaunchSpec GroupProcesses::launch_spec(
    const Worker& w,
    const std::string& exe,
    const std::vector<RankBinding>& numa,
    const std::string& dir) const {
  const WorkerSpec& spec = view_.spec;
  LaunchSpec ls;
  ls.local_rank = w.local_rank;
  ls.env = worker_env(w);
  if (!numa.empty()) {
    const RankBinding& b = numa[static_cast<size_t>(w.local_rank)];
    ls.binding = Binding::make(b.cpus, b.mem_nodes);
    for (const auto& [k, v] : numa_env(spec.numa_binding, b)) {
      std::erase_if(
          ls.env, [&](const std::string& e) { return e.starts_with(k + "="); });
      ls.env.push_back(k + "=" + v);
    }
  }
  std::string rank_dir = dir + "/" + std::to_string(w.local_rank);
  if (const auto* c = std::get_if<Command>(&spec.entrypoint)) {
    ls.path = exe;
    ls.argv = c->argv;
  } else {
    const auto& f = std::get<FunctionCall>(spec.entrypoint);
    ls.result_file = result_files_[static_cast<size_t>(w.local_rank)];
    if (spec.start_method == StartMethod::kFork) {
      ls.function = f.name;
      ls.function_args = f.args;
    } else {
      ls.path = "/proc/self/exe";
      ls.argv.push_back(std::string("tide-worker:") + f.name);
      ls.argv.insert(ls.argv.end(), f.args.begin(), f.args.end());
      ls.env.push_back(std::string(kFunctionEnv) + "=" + f.name);
      ls.env.push_back(std::string(kResultFileEnv) + "=" + ls.result_file);
    }
  }
  bool shown = spec.local_ranks_filter.empty() ||
               spec.local_ranks_filter.count(w.local_rank) > 0;
  auto target = [&](Std bit, const char* file) {
    StreamTarget t;
    auto has = [&](const StdSpec& s) {
      return (static_cast<int>(s.for_rank(w.local_rank)) &
              static_cast<int>(bit)) != 0;
    };
    if (has(spec.tee) && shown) {
      t.mode = StreamTarget::Mode::kTee;
    } else if (has(spec.redirects) || has(spec.tee) || !shown) {
      t.mode = StreamTarget::Mode::kFile;
    }
    t.path = rank_dir + "/" + file;
    return t;
  };
  ls.out = target(Std::kOut, "stdout.log");
  ls.err = target(Std::kErr, "stderr.log");
  if (ls.out.mode == StreamTarget::Mode::kTee) {
    ls.out.duplicate = duplicate_out_;
  }
  if (ls.err.mode == StreamTarget::Mode::kTee) {
    ls.err.duplicate = duplicate_err_;
  }
  ls.console_prefix =
      spec.log_line_prefix_template.empty()
          ? "[" + spec.role + std::to_string(w.local_rank) + "]:"
          : substitute(
                spec.log_line_prefix_template,
                {{"role_name", spec.role},
                 {"rank", std::to_string(w.global_rank)},
                 {"local_rank", std::to_string(w.local_rank)}});
  return ls;
}

std::unique_ptr<WorkerProcess> GroupProcesses::start_process(
    const LaunchSpec& ls) {
  const WorkerSpec& spec = view_.spec;
  if (prestart_) {
    std::string why_not;
    if (auto p = prestart_->take(ls, *prestart_cmd_, &why_not)) {
      TIDE_LOG_INFO(
          "[{}] local rank {}: handed to prestarted interpreter {}",
          spec.role,
          ls.local_rank,
          p->pid());
      return p;
    }
    TIDE_LOG_INFO(
        "[{}] local rank {}: cold start: {}",
        spec.role,
        ls.local_rank,
        why_not);
  }
  return std::make_unique<WorkerProcess>(ls, janitor_.get());
}

void GroupProcesses::open_prestart() {
  const WorkerSpec& spec = view_.spec;
  std::string exe = resolve_exe();
  std::string why_not = "the workers run a C++ function";
  if (const auto* c = std::get_if<Command>(&spec.entrypoint)) {
    prestart_cmd_ = PythonCommand::parse(exe, c->argv, &why_not);
  }
  if (!prestart_cmd_) {
    TIDE_LOG_WARN("[{}] --prestart does not apply: {}", spec.role, why_not);
    return;
  }
  prestart_ = std::make_unique<PrestartPool>(
      PrestartPool::Options{
          .imports = spec.prestart.imports,
          .spares = spec.prestart.spares,
          .log_dir = view_.run_log_dir + "/prestart",
      },
      janitor_.get());
  // Started now, so that their imports run while the rendezvous does.
  fill_prestart(exe, plan_numa(spec));
  TIDE_LOG_INFO(
      "[{}] prestarting Python interpreters: {} (one per local rank, {} "
      "spares), importing {}",
      spec.role,
      spec.local_world_size + spec.prestart.spares,
      spec.prestart.spares,
      spec.prestart.imports.empty()
          ? std::string("nothing")
          : fmt::format("{}", fmt::join(spec.prestart.imports, ",")));
}

void GroupProcesses::fill_prestart(
    const std::string& exe, const std::vector<RankBinding>& numa, bool gated) {
  if (!prestart_) {
    return;
  }
  // The slots' environments and bindings as the next attempt's workers
  // will have them, but for what changes per attempt (dropped by the pool).
  const WorkerSpec& spec = view_.spec;
  if (error_files_.size() < static_cast<size_t>(spec.local_world_size)) {
    error_files_.resize(static_cast<size_t>(spec.local_world_size));
    result_files_.resize(static_cast<size_t>(spec.local_world_size));
  }
  std::vector<LaunchSpec> slots;
  for (int i = 0; i < spec.local_world_size; ++i) {
    slots.push_back(launch_spec(Worker{.local_rank = i}, exe, numa, ""));
  }
  prestart_->fill(exe, slots, gated);
}

}  // namespace tide::agent::detail
