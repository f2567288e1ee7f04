#include "torch_probe.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <variant>

#include "tide/common/logging.h"

#include "agent/command.h"

namespace tiderun {

namespace {

namespace fs = std::filesystem;
using tide::agent::detail::run_command;

// Where `import torch` would load from, without loading it.
constexpr const char* kFindTorch = R"(
import importlib.util
try:
    s = importlib.util.find_spec("torch")
    d = s.submodule_search_locations[0] if s and s.submodule_search_locations else ""
except Exception:
    d = ""
print("tide-torch", d, sep="\t")
)";

// Whether torch's TCPStore has its libuv backend: only making one tells.
constexpr const char* kAskLibuv = R"(
import torch.distributed as d
try:
    d.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True, wait_for_workers=False)
    print("tide-libuv", 1, sep="\t")
except RuntimeError as e:
    if "libuv" not in str(e):
        raise
    print("tide-libuv", 0, sep="\t")
)";

// The value after "<tag>\t" on a line of its own in `output`, if any.
std::optional<std::string> tagged(
    const std::string& output, const std::string& tag) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(tag + "\t", 0) == 0) {
      return line.substr(tag.size() + 1);
    }
  }
  return std::nullopt;
}

std::string version_of(const fs::path& version_file) {
  std::ifstream in(version_file);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::smatch m;
  static const std::regex version(R"re(__version__\s*=\s*['"]([^'"]+)['"])re");
  return std::regex_search(text, m, version) ? m[1].str() : "";
}

bool at_least(const std::string& version, int major, int minor) {
  int ma = 0;
  int mi = 0;
  if (std::sscanf(version.c_str(), "%d.%d", &ma, &mi) != 2) {
    return false;
  }
  return ma > major || (ma == major && mi >= minor);
}

fs::path cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') {
    return fs::path(xdg) / "tide";
  }
  const char* home = std::getenv("HOME");
  return home != nullptr && *home == '/' ? fs::path(home) / ".cache/tide"
                                         : fs::path();
}

// The cache entry of one torch: its directory, its version file's change
// time, and 1 or 0 (libuv or not).
struct CacheEntry {
  fs::path file;
  std::string key;
};

std::optional<CacheEntry> cache_entry(const TorchFacts& t) {
  fs::path dir = cache_dir();
  struct stat st {};
  if (dir.empty() || ::stat((t.dir + "/version.py").c_str(), &st) != 0) {
    return std::nullopt;
  }
  char name[32];
  std::snprintf(
      name, sizeof name, "torch-%016zx", std::hash<std::string>{}(t.dir));
  return CacheEntry{
      .file = dir / name,
      .key = t.dir + "\n" + std::to_string(st.st_ctim.tv_sec) + "." +
             std::to_string(st.st_ctim.tv_nsec) + "\n"};
}

std::optional<bool> cached_libuv(const CacheEntry& e) {
  std::ifstream in(e.file);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.size() != e.key.size() + 2 || text.rfind(e.key, 0) != 0 ||
      (text[e.key.size()] != '0' && text[e.key.size()] != '1')) {
    return std::nullopt;
  }
  return text[e.key.size()] == '1';
}

void keep_libuv(const CacheEntry& e, bool has) {
  std::error_code ec;
  fs::create_directories(e.file.parent_path(), ec);
  fs::path tmp = e.file;
  tmp += "." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << e.key << (has ? '1' : '0') << '\n';
    if (!out.flush()) {
      TIDE_LOG_DEBUG("cannot keep what torch has in {}", e.file.string());
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, e.file, ec);
}

}  // namespace

std::optional<TorchFacts> probe_torch(const std::string& python) {
  auto found =
      run_command({python, "-c", kFindTorch}, std::chrono::seconds(60));
  auto dir = tagged(found.output, "tide-torch");
  if (found.exitcode != 0 || !dir) {
    TIDE_LOG_DEBUG(
        "{} could not be asked where its torch is: {}", python, found.output);
    return std::nullopt;
  }
  if (dir->empty()) {
    return std::nullopt;
  }
  TorchFacts t{.dir = *dir, .version = version_of(*dir + "/version.py")};
  t.defaults_to_libuv = at_least(t.version, 2, 4);
  if (!t.defaults_to_libuv) {
    return t;
  }
  auto entry = cache_entry(t);
  if (auto has = entry ? cached_libuv(*entry) : std::nullopt) {
    t.has_libuv = *has;
    return t;
  }
  TIDE_LOG_INFO(
      "asking torch {} ({}) whether it has libuv, once (kept in {})",
      t.version,
      t.dir,
      entry ? entry->file.string() : "no cache: no HOME");
  auto asked = run_command({python, "-c", kAskLibuv}, std::chrono::minutes(5));
  auto has = tagged(asked.output, "tide-libuv");
  if (asked.exitcode != 0 || !has) {
    TIDE_LOG_WARN(
        "could not tell whether torch {} ({}) has libuv; its defaults are "
        "kept: {}",
        t.version,
        t.dir,
        asked.timed_out ? "no answer in 5 minutes" : asked.output);
    return t;
  }
  t.has_libuv = *has == "1";
  if (entry) {
    keep_libuv(*entry, t.has_libuv);
  }
  return t;
}

void fit_to_torch(
    const tide::agent::Entrypoint& entrypoint,
    bool no_python,
    tide::launcher::LaunchConfig& config) {
  const auto* cmd = std::get_if<tide::agent::Command>(&entrypoint);
  if (no_python || cmd == nullptr || cmd->argv.size() < 3 ||
      cmd->argv[1] != "-u") {
    return;
  }
  auto torch = probe_torch(cmd->argv[0]);
  if (!torch || !torch->defaults_to_libuv || torch->has_libuv) {
    return;
  }
  if (config.store_fan_in) {
    throw tide::InvalidArgument(
        "--store-fan-in: torch " + torch->version + " (" + torch->dir +
        ") asks for libuv by default and was built without it, and it makes "
        "a worker's client of its agent's store (which a fan-in is) with "
        "libuv whatever USE_LIBUV says: its workers cannot reach a fan-in; "
        "use a torch built with libuv, or leave --store-fan-in off");
  }
  const char* use_libuv = std::getenv("USE_LIBUV");
  if (use_libuv == nullptr) {
    ::setenv("USE_LIBUV", "0", 1);
  }
  bool own_store = config.rdzv_backend == "static" &&
                   config.rdzv_configs.emplace("agent_store", "0").second;
  TIDE_LOG_INFO(
      "torch {} ({}) asks for libuv by default and was built without it: "
      "{}{}",
      torch->version,
      torch->dir,
      use_libuv == nullptr
          ? "workers get USE_LIBUV=0"
          : std::string("USE_LIBUV=") + use_libuv + " is kept (set)",
      own_store ? "; rank 0's worker hosts the workers' store, made anew "
                  "each attempt (the agent's store needs libuv there)"
                : "");
}

}  // namespace tiderun
