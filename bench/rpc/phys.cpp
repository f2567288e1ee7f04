// phys: the physical limits an RPC's figures are read against (bench/rpc/run.sh
// runs it next to rpc_bench and torch): what one TCP connection and one memcpy
// do on this machine, with nothing on top.
//
//   phys pingpong [--iters 20000] [--size 64] [--warmup 2000] [--poll] [ENDS]
//       Round trips of a --size message over one TCP_NODELAY connection: the
//       connecting end writes it, the listening end reads it whole and writes
//       it back. Median and p99 (nearest rank) in microseconds. With --poll
//       both ends wait for bytes by polling the socket (non-blocking reads in
//       a loop) instead of sleeping in read: the round trip with no wake-up
//       in it, each end busy on a core of its own.
//   phys bulk [--mib 1024] [ENDS]
//       The connecting end writes --mib MiB in 1 MiB writes, the listening end
//       reads them all and answers one byte; bytes / (first write -> answer).
//   phys memcpy [--mib 64] [--reps 20]
//       memcpy of --mib MiB between two buffers whose every page was written
//       before; median over --reps copies (after 2 uncounted) of bytes copied
//       per second.
//
// ENDS: nothing (fork: both ends on 127.0.0.1, a port the kernel picks), or
// `--listen HOST:PORT` for the listening end and `--connect HOST:PORT` for the
// measuring one, so that run.sh can put them in two network namespaces. The
// connecting end retries until the listener is up; both give up after
// --timeout seconds (default 60) without progress. HOST is an IPv4 address.
// --cpu N pins this process to CPU N; in fork mode the listening end too,
// unless --peer-cpu M puts it on CPU M. (Where the two ends run matters: a
// wake-up on another CPU can cost more than the rest of the round trip.)
//
// The measuring end prints one JSON line on stdout:
//   {"impl":"phys","metric":"tcp_pingpong_us","median":..,"p99":..,"n":..,
//    "size":..,"wait":"sleep"|"poll"}
//   {"impl":"phys","metric":"tcp_bytes_per_s","value":..,"bytes":..}
//   {"impl":"phys","metric":"memcpy_bytes_per_s","value":..,"bytes":..,"n":..}
// The listening end prints nothing. Errors go to stderr; the exit status is 1
// on an error, 2 on bad arguments.
//
// No tide library code (bench/common's helpers only): a figure here must not
// move when tide changes.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "bench_util.h"

namespace {

using tide::bench::Fd;

using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kBulkChunk = kMiB;
constexpr int kMemcpyWarmup = 2;
// Tags the first bytes the connecting end sends, so that two ends started
// with different modes fail at once instead of misreading each other.
constexpr uint32_t kPingTag = 0x676e6970;  // "ping"
constexpr uint32_t kBulkTag = 0x6b6c7562;  // "bulk"

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::runtime_error sys_error(std::string_view what) {
  return std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

struct Options {
  std::string mode;
  int iters = 20000;            // pingpong: measured round trips
  int warmup = 2000;            // pingpong: round trips before measuring
  size_t size = 64;             // pingpong: message bytes
  bool poll = false;            // pingpong: both ends poll, never sleep
  std::optional<size_t> mib;    // bulk: 1024; memcpy: 64
  int reps = 20;                // memcpy: measured copies
  std::string listen;           // HOST:PORT, or empty
  std::string connect;          // HOST:PORT, or empty
  double timeout_s = 60;        // without progress, either end gives up
  std::optional<int> cpu;       // where this process runs
  std::optional<int> peer_cpu;  // fork: where the listening end runs
};

void pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) {
    throw sys_error("sched_setaffinity(CPU " + std::to_string(cpu) + ")");
  }
}

sockaddr_in parse_endpoint(const std::string& endpoint) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) {
    throw UsageError("expected HOST:PORT, got '" + endpoint + "'");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  std::string host = endpoint.substr(0, colon);
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    throw UsageError("expected an IPv4 address, got '" + host + "'");
  }
  char* end = nullptr;
  long port = std::strtol(endpoint.c_str() + colon + 1, &end, 10);
  if (end == endpoint.c_str() + colon + 1 || *end != '\0' || port < 0 ||
      port > 65535) {
    throw UsageError("expected a port 0-65535 in '" + endpoint + "'");
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// Reads and writes of a stalled peer fail after timeout_s instead of hanging.
void set_io_timeout(int fd, double timeout_s) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_s);
  tv.tv_usec = static_cast<suseconds_t>((timeout_s - tv.tv_sec) * 1e6);
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    throw sys_error("setsockopt(SO_RCVTIMEO/SO_SNDTIMEO)");
  }
}

void set_nodelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    throw sys_error("setsockopt(TCP_NODELAY)");
  }
}

Fd listen_on(const sockaddr_in& addr) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    throw sys_error("socket");
  }
  int one = 1;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) {
    throw sys_error("setsockopt(SO_REUSEADDR)");
  }
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) !=
      0) {
    throw sys_error("bind");
  }
  if (::listen(fd.get(), 1) != 0) {
    throw sys_error("listen");
  }
  return fd;
}

sockaddr_in bound_address(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw sys_error("getsockname");
  }
  return addr;
}

Fd accept_one(int listener, double timeout_s) {
  pollfd p{.fd = listener, .events = POLLIN, .revents = 0};
  int ready = ::poll(&p, 1, static_cast<int>(timeout_s * 1000));
  if (ready < 0) {
    throw sys_error("poll");
  }
  if (ready == 0) {
    throw std::runtime_error(
        "no connection within " + std::to_string(timeout_s) + " s");
  }
  Fd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (fd.get() < 0) {
    throw sys_error("accept");
  }
  set_nodelay(fd.get());
  set_io_timeout(fd.get(), timeout_s);
  return fd;
}

// Retries while nobody listens yet (the other end may start later, in
// another namespace), until timeout_s.
Fd connect_to(const sockaddr_in& addr, double timeout_s) {
  auto give_up = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      throw sys_error("socket");
    }
    if (::connect(
            fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) ==
        0) {
      set_nodelay(fd.get());
      set_io_timeout(fd.get(), timeout_s);
      return fd;
    }
    bool not_yet = errno == ECONNREFUSED || errno == ENETUNREACH ||
                   errno == EHOSTUNREACH || errno == ETIMEDOUT;
    if (!not_yet || Clock::now() > give_up) {
      throw sys_error("connect");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) {
      continue;
    }
    if (k < 0) {
      throw sys_error("write");
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// False if the peer closed before the first byte; throws if it closed after.
// With `poll`, spins on non-blocking reads instead of sleeping in read(), and
// gives up after timeout_s without a byte.
bool read_all(
    int fd, void* data, size_t n, bool poll = false, double timeout_s = 60) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  auto last_byte = Clock::now();
  uint32_t spins = 0;
  while (got < n) {
    ssize_t k = ::recv(fd, p + got, n - got, poll ? MSG_DONTWAIT : 0);
    if (k < 0 && errno == EINTR) {
      continue;
    }
    if (k < 0 && poll && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (++spins % 4096 == 0 &&
          Clock::now() - last_byte > std::chrono::duration<double>(timeout_s)) {
        throw std::runtime_error("no byte from the peer while polling");
      }
      continue;
    }
    if (k > 0) {
      last_byte = Clock::now();
    }
    if (k < 0) {
      throw sys_error("read");
    }
    if (k == 0) {
      if (got == 0) {
        return false;
      }
      throw std::runtime_error(
          "the peer closed the connection mid-message (" + std::to_string(got) +
          " of " + std::to_string(n) + " bytes)");
    }
    got += static_cast<size_t>(k);
  }
  return true;
}

struct Header {
  uint32_t tag;
  uint32_t flags;  // pingpong: kPollFlag
  uint64_t value;  // pingpong: message bytes; bulk: total bytes
};
constexpr uint32_t kPollFlag = 1;

Header read_header(int fd, uint32_t expected_tag) {
  Header h{};
  if (!read_all(fd, &h, sizeof h)) {
    throw std::runtime_error("the peer closed before its header");
  }
  if (h.tag != expected_tag) {
    throw std::runtime_error(
        "the connecting end runs another mode (header tag mismatch)");
  }
  return h;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  size_t n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

// Nearest rank: the ceil(0.99 n)-th smallest.
double p99(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  auto rank =
      static_cast<size_t>(std::ceil(0.99 * static_cast<double>(xs.size())));
  return xs[std::max<size_t>(rank, 1) - 1];
}

// ---------------------------------------------------------------------------
// The two ends of each TCP mode. The listening end serves one connection.

void serve_pingpong(int fd) {
  Header h = read_header(fd, kPingTag);
  bool poll = (h.flags & kPollFlag) != 0;
  std::vector<char> buf(h.value);
  while (read_all(fd, buf.data(), buf.size(), poll)) {
    write_all(fd, buf.data(), buf.size());
  }
}

void measure_pingpong(int fd, const Options& o) {
  Header h{.tag = kPingTag, .flags = o.poll ? kPollFlag : 0u, .value = o.size};
  write_all(fd, &h, sizeof h);
  std::vector<char> buf(o.size, 'p');
  std::vector<double> rtts_us;
  rtts_us.reserve(static_cast<size_t>(o.iters));
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    auto t0 = Clock::now();
    write_all(fd, buf.data(), buf.size());
    if (!read_all(fd, buf.data(), buf.size(), o.poll, o.timeout_s)) {
      throw std::runtime_error("the listening end closed the connection");
    }
    if (i >= o.warmup) {
      rtts_us.push_back(
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
  }
  std::printf(
      "{\"impl\":\"phys\",\"metric\":\"tcp_pingpong_us\",\"median\":%.2f,"
      "\"p99\":%.2f,\"n\":%d,\"size\":%zu,\"wait\":\"%s\"}\n",
      median(rtts_us),
      p99(rtts_us),
      o.iters,
      o.size,
      o.poll ? "poll" : "sleep");
}

void serve_bulk(int fd) {
  Header h = read_header(fd, kBulkTag);
  std::vector<char> buf(kBulkChunk);
  uint64_t left = h.value;
  while (left > 0) {
    ssize_t k = ::read(fd, buf.data(), std::min<uint64_t>(left, buf.size()));
    if (k < 0 && errno == EINTR) {
      continue;
    }
    if (k < 0) {
      throw sys_error("read");
    }
    if (k == 0) {
      throw std::runtime_error("the peer closed the connection mid-transfer");
    }
    left -= static_cast<uint64_t>(k);
  }
  char done = 1;
  write_all(fd, &done, 1);
}

void measure_bulk(int fd, const Options& o) {
  uint64_t total = *o.mib * kMiB;
  Header h{.tag = kBulkTag, .flags = 0, .value = total};
  write_all(fd, &h, sizeof h);
  std::vector<char> buf(kBulkChunk, 'b');
  auto t0 = Clock::now();
  for (uint64_t sent = 0; sent < total; sent += buf.size()) {
    write_all(fd, buf.data(), std::min<uint64_t>(buf.size(), total - sent));
  }
  char done = 0;
  if (!read_all(fd, &done, 1)) {
    throw std::runtime_error("the listening end closed before its answer");
  }
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "{\"impl\":\"phys\",\"metric\":\"tcp_bytes_per_s\",\"value\":%.0f,"
      "\"bytes\":%llu}\n",
      static_cast<double>(total) / seconds,
      static_cast<unsigned long long>(total));
}

// Both ends on 127.0.0.1: the child serves, this process measures.
void run_forked(
    const Options& o,
    void (*serve)(int),
    void (*measure)(int, const Options&)) {
  sockaddr_in any_port{};
  any_port.sin_family = AF_INET;
  any_port.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  Fd listener = listen_on(any_port);
  sockaddr_in addr = bound_address(listener.get());
  std::fflush(stdout);
  pid_t child = ::fork();
  if (child < 0) {
    throw sys_error("fork");
  }
  if (child == 0) {
    int code = 0;
    try {
      if (o.peer_cpu) {
        pin_to_cpu(*o.peer_cpu);
      }
      Fd conn = accept_one(listener.get(), o.timeout_s);
      serve(conn.get());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "phys: listening end: %s\n", e.what());
      code = 1;
    }
    std::_Exit(code);
  }
  listener = Fd();
  try {
    Fd conn = connect_to(addr, o.timeout_s);
    measure(conn.get(), o);
  } catch (...) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    throw;
  }
  int status = 0;
  if (::waitpid(child, &status, 0) < 0) {
    throw sys_error("waitpid");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("the listening end failed");
  }
}

void run_tcp(
    const Options& o,
    void (*serve)(int),
    void (*measure)(int, const Options&)) {
  if (!o.listen.empty()) {
    Fd listener = listen_on(parse_endpoint(o.listen));
    Fd conn = accept_one(listener.get(), o.timeout_s);
    serve(conn.get());
  } else if (!o.connect.empty()) {
    Fd conn = connect_to(parse_endpoint(o.connect), o.timeout_s);
    measure(conn.get(), o);
  } else {
    run_forked(o, serve, measure);
  }
}

void measure_memcpy(const Options& o) {
  size_t n = *o.mib * kMiB;
  auto src = std::make_unique_for_overwrite<char[]>(n);
  auto dst = std::make_unique_for_overwrite<char[]>(n);
  // Every page written once, so that no copy pays a page fault.
  for (size_t i = 0; i < n; ++i) {
    src[i] = static_cast<char>(i * 131);
  }
  std::memset(dst.get(), 0, n);
  std::vector<double> rates;
  for (int r = 0; r < kMemcpyWarmup + o.reps; ++r) {
    auto t0 = Clock::now();
    std::memcpy(dst.get(), src.get(), n);
    // As if dst were read here: no copy is dropped as overwritten by the next.
    asm volatile("" : : "r"(dst.get()) : "memory");
    double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r >= kMemcpyWarmup) {
      rates.push_back(static_cast<double>(n) / seconds);
    }
  }
  if (std::memcmp(dst.get(), src.get(), n) != 0) {
    throw std::runtime_error("memcpy's copy differs from its source");
  }
  std::printf(
      "{\"impl\":\"phys\",\"metric\":\"memcpy_bytes_per_s\",\"value\":%.0f,"
      "\"bytes\":%zu,\"n\":%d}\n",
      median(rates),
      n,
      o.reps);
}

// ---------------------------------------------------------------------------

constexpr const char* kUsage =
    "usage: phys pingpong [--iters N] [--size BYTES] [--warmup N] [--poll] "
    "[ENDS]\n"
    "       phys bulk [--mib M] [ENDS]\n"
    "       phys memcpy [--mib M] [--reps R]\n"
    "ENDS: --listen HOST:PORT | --connect HOST:PORT (default: fork, "
    "127.0.0.1); --timeout S; --cpu N; --peer-cpu M (fork only)\n";

long parse_number(std::string_view flag, const char* text, long min) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < min) {
    throw UsageError(
        std::string(flag) + " expects an integer >= " + std::to_string(min) +
        ", got '" + text + "'");
  }
  return v;
}

Options parse_options(int argc, char** argv) {
  if (argc < 2) {
    throw UsageError("missing the mode");
  }
  Options o;
  o.mode = argv[1];
  if (o.mode != "pingpong" && o.mode != "bulk" && o.mode != "memcpy") {
    throw UsageError("unknown mode '" + o.mode + "'");
  }
  for (int i = 2; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (flag == "--poll") {
      o.poll = true;
      continue;
    }
    if (i + 1 >= argc) {
      throw UsageError(std::string(flag) + " needs a value");
    }
    const char* value = argv[++i];
    if (flag == "--iters") {
      o.iters = static_cast<int>(parse_number(flag, value, 1));
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(parse_number(flag, value, 0));
    } else if (flag == "--size") {
      o.size = static_cast<size_t>(parse_number(flag, value, 1));
    } else if (flag == "--mib") {
      o.mib = static_cast<size_t>(parse_number(flag, value, 1));
    } else if (flag == "--reps") {
      o.reps = static_cast<int>(parse_number(flag, value, 1));
    } else if (flag == "--listen") {
      o.listen = value;
    } else if (flag == "--connect") {
      o.connect = value;
    } else if (flag == "--cpu") {
      o.cpu = static_cast<int>(parse_number(flag, value, 0));
    } else if (flag == "--peer-cpu") {
      o.peer_cpu = static_cast<int>(parse_number(flag, value, 0));
    } else if (flag == "--timeout") {
      o.timeout_s = static_cast<double>(parse_number(flag, value, 1));
    } else {
      throw UsageError("unknown option '" + std::string(flag) + "'");
    }
  }
  if (!o.listen.empty() && !o.connect.empty()) {
    throw UsageError("--listen and --connect are the two ends: give one");
  }
  if (o.peer_cpu &&
      (!o.listen.empty() || !o.connect.empty() || o.mode == "memcpy")) {
    throw UsageError(
        "--peer-cpu is for the forked end: pingpong or bulk "
        "without --listen or --connect");
  }
  if (o.poll && o.mode != "pingpong") {
    throw UsageError("--poll is for pingpong");
  }
  if (!o.mib) {
    o.mib = o.mode == "bulk" ? 1024 : 64;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  // A peer that goes away must fail a write with EPIPE, not kill this process.
  ::signal(SIGPIPE, SIG_IGN);
  try {
    Options o = parse_options(argc, argv);
    if (o.cpu) {
      pin_to_cpu(*o.cpu);
    }
    if (o.mode == "pingpong") {
      run_tcp(o, serve_pingpong, measure_pingpong);
    } else if (o.mode == "bulk") {
      run_tcp(o, serve_bulk, measure_bulk);
    } else {
      measure_memcpy(o);
    }
    std::fflush(stdout);
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "phys: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phys %s: %s\n", argc > 1 ? argv[1] : "", e.what());
    return 1;
  }
}
