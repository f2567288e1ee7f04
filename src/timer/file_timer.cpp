#include "tide/timer/file_timer.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "tide/common/logging.h"

namespace tide::timer {

namespace {

// A request line is at most PIPE_BUF bytes (torch's limit, for atomic
// writes); anything much longer without a newline is garbage to drop.
constexpr size_t kMaxLine = 64 * 1024;

// A write to a FIFO whose reader is gone raises SIGPIPE, which would kill a
// C++ worker: block it for this thread and swallow the pending one, so the
// caller sees EPIPE instead.
ssize_t write_without_sigpipe(int fd, const std::string& data) {
  sigset_t pipe_set;
  sigset_t old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  ssize_t n = ::write(fd, data.data(), data.size());
  int err = errno;
  if (n < 0 && err == EPIPE) {
    timespec zero{};
    ::sigtimedwait(&pipe_set, nullptr, &zero);
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return n;
}

}  // namespace

FileTimerServer::FileTimerServer(std::string path, TimerServerOptions options)
    : TimerServer(std::move(options)), path_(std::move(path)) {
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISFIFO(st.st_mode)) {
      throw Error(
          "timer file " + path_ +
          " exists and is not a FIFO; refusing to replace it");
    }
    ::unlink(path_.c_str());
  }
  if (::mkfifo(path_.c_str(), 0600) != 0) {
    throw Error(
        "cannot create the timer FIFO " + path_ + ": " + std::strerror(errno));
  }
  // Read-write, so the server never sees end-of-file when the last writer
  // closes, and opening never blocks waiting for one.
  fd_.reset(::open(path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (!fd_) {
    int err = errno;
    ::unlink(path_.c_str());
    throw Error(
        "cannot open the timer FIFO " + path_ + ": " + std::strerror(err));
  }
}

FileTimerServer::~FileTimerServer() {
  stop();
  fd_.reset();
  ::unlink(path_.c_str());
}

void FileTimerServer::read_requests(std::vector<TimerRequest>& out) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd_.get(), buf, sizeof buf);
    if (n <= 0) {
      break;
    }
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      parse_line(std::string_view(partial_).substr(start, nl - start), out);
    }
    partial_.erase(0, start);
    if (partial_.size() > kMaxLine) {
      ++malformed_;
      TIDE_LOG_WARN(
          "[timer] dropping {} bytes without a newline from {}",
          partial_.size(),
          path_);
      partial_.clear();
    }
  }
}

namespace {

// Reads the exact layout torch's client and tide's write, byte for byte:
//   {"version": 1, "pid": 12, "scope_id": "s", "expiration_time": 1.5,
//   "signal": 9}
// with a scope free of escapes. A general JSON parse costs most of the
// server's time per request; anything else takes that path.
bool parse_common_layout(std::string_view line, TimerRequest& r) {
  auto expect = [&](std::string_view lit) {
    if (line.substr(0, lit.size()) != lit) {
      return false;
    }
    line.remove_prefix(lit.size());
    return true;
  };
  auto number = [&](auto& v) {
    auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
    if (ec != std::errc() || ptr == line.data()) {
      return false;
    }
    line.remove_prefix(static_cast<size_t>(ptr - line.data()));
    return true;
  };
  int64_t pid = 0;
  int64_t sig = 0;
  if (!expect("{\"version\": 1, \"pid\": ") || !number(pid) ||
      !expect(", \"scope_id\": \"")) {
    return false;
  }
  size_t end = line.find_first_of("\"\\");
  if (end == std::string_view::npos || line[end] != '"') {
    return false;
  }
  r.scope_id.assign(line.substr(0, end));
  line.remove_prefix(end + 1);
  if (!expect(", \"expiration_time\": ") || !number(r.expiration_time) ||
      !expect(", \"signal\": ") || !number(sig) || !expect("}") ||
      !line.empty()) {
    return false;
  }
  r.worker_id = static_cast<pid_t>(pid);
  r.signal = static_cast<int>(sig);
  return true;
}

}  // namespace

void FileTimerServer::parse_line(
    std::string_view line, std::vector<TimerRequest>& out) {
  if (line.empty()) {
    return;
  }
  if (TimerRequest r; parse_common_layout(line, r)) {
    out.push_back(std::move(r));
    return;
  }
  auto skip = [&](const char* why) {
    ++malformed_;
    TIDE_LOG_WARN(
        "[timer] skipping a malformed request ({}): {}",
        why,
        std::string(line.substr(0, 200)));
  };
  nlohmann::json j =
      nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    // A client that died mid-message leaves a fragment that the next
    // request's line starts with; keep that request.
    auto next = line.rfind("{\"version\"");
    if (next != std::string_view::npos && next > 0) {
      skip("a fragment before a request");
      return parse_line(line.substr(next), out);
    }
    return skip("not a JSON object");
  }
  auto number = [&](const char* key) -> const nlohmann::json* {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? &*it : nullptr;
  };
  const auto* version = number("version");
  const auto* pid = number("pid");
  const auto* expiration = number("expiration_time");
  const auto* signal = number("signal");
  auto scope = j.find("scope_id");
  if (!version || version->get<double>() != 1) {
    return skip("version is not 1");
  }
  if (!pid || !pid->is_number_integer() || !expiration || !signal ||
      !signal->is_number_integer() || scope == j.end() || !scope->is_string()) {
    return skip("missing or mistyped fields");
  }
  out.push_back(TimerRequest{
      .worker_id = static_cast<pid_t>(pid->get<int64_t>()),
      .scope_id = scope->get<std::string>(),
      .expiration_time = expiration->get<double>(),
      .signal = static_cast<int>(signal->get<int64_t>()),
  });
}

FileTimerClient::FileTimerClient(
    std::string path,
    int signal,
    std::chrono::milliseconds timeout,
    bool keep_open)
    : TimerChannelClient(signal),
      path_(std::move(path)),
      timeout_(timeout),
      keep_open_(keep_open) {}

void FileTimerClient::send(
    const std::string& scope_id, double expiration_time, int signal) {
  // The layout of torch's json.dumps, built by hand: this is the hot path.
  auto append_int = [](std::string& out, int64_t v) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, end);
  };
  std::string line;
  line.reserve(96 + scope_id.size());
  line += "{\"version\": 1, \"pid\": ";
  append_int(line, ::getpid());
  line += ", \"scope_id\": ";
  bool plain = std::none_of(scope_id.begin(), scope_id.end(), [](char c) {
    return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
  });
  if (plain) {
    line.append("\"").append(scope_id).append("\"");
  } else {
    line += nlohmann::json(scope_id).dump();
  }
  line += ", \"expiration_time\": ";
  char num[64];
  auto [end, ec] = std::to_chars(
      num, num + sizeof num, expiration_time, std::chars_format::fixed, 6);
  line.append(num, end);
  line += ", \"signal\": ";
  append_int(line, signal);
  line += "}\n";
  if (line.size() > PIPE_BUF) {
    throw InvalidArgument(
        "timer scope \"" + scope_id.substr(0, 64) +
        "...\" makes a request longer than "
        "PIPE_BUF (" +
        std::to_string(PIPE_BUF) + " bytes)");
  }
  std::lock_guard lock(mutex_);
  // A server that is not up yet, or whose pipe is full, gets some time.
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    if (!fd_) {
      fd_.reset(::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
      if (!fd_) {
        if ((errno == ENXIO || errno == ENOENT) &&
            std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        throw Error(
            "no timer server on " + path_ + ": " + std::strerror(errno) +
            " (is TORCHELASTIC_ENABLE_FILE_TIMER=1 set for the agent?)");
      }
    }
    ssize_t n = write_without_sigpipe(fd_.get(), line);
    if (n == static_cast<ssize_t>(line.size())) {
      if (!keep_open_) {
        fd_.reset();
      }
      return;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && errno == EAGAIN &&
        std::chrono::steady_clock::now() < deadline) {
      pollfd p{.fd = fd_.get(), .events = POLLOUT, .revents = 0};
      ::poll(&p, 1, 100);
      continue;
    }
    int err = n < 0 ? errno : EIO;
    fd_.reset();
    if (err == EPIPE && std::chrono::steady_clock::now() < deadline) {
      continue;  // The server went away; a new one may take its place.
    }
    throw Error(
        "cannot send a timer request to " + path_ + ": " + std::strerror(err));
  }
}

}  // namespace tide::timer
