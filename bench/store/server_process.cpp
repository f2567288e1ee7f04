#include "server_process.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

namespace tide::bench {

using std::chrono::milliseconds;

ServerProcess::ServerProcess(
    std::string name,
    const std::vector<std::string>& argv,
    milliseconds start_timeout)
    : name_(std::move(name)),
      child_(
          argv,
          ChildOptions{
              .pipes = true,
              .stop_grace_ns = std::chrono::nanoseconds(kStopTimeout).count(),
              .name = name_,
          }) {
  try {
    port_ = read_port(start_timeout);
  } catch (...) {
    stop();
    throw;
  }
}

ServerProcess::~ServerProcess() {
  stop();
}

bool ServerProcess::alive() {
  return child_.running();
}

uint64_t ServerProcess::rss_kb() const {
  return rss_kb_of(child_.pid());
}

double ServerProcess::cpu_seconds() const {
  return cpu_seconds_of(child_.pid());
}

size_t ServerProcess::open_fds() const {
  return open_fds_of(child_.pid());
}

void ServerProcess::stop() noexcept {
  child_.stop();
}

uint16_t ServerProcess::read_port(milliseconds timeout) {
  LineReader reader(child_.out());
  std::optional<std::string> line;
  try {
    line = reader.next(
        mono_ns() + std::chrono::nanoseconds(timeout).count(), "its port");
  } catch (const DeadlineExceeded&) {
    throw std::runtime_error(
        name_ + " did not print its port within " +
        std::to_string(timeout.count() / 1000) + " s");
  }
  if (!line) {
    throw std::runtime_error(
        name_ + " exited before printing its port (its stderr is above)");
  }
  size_t end = line->find_last_not_of(" \r\t");
  if (end != std::string::npos) {
    size_t begin = line->find_last_not_of("0123456789", end);
    begin = begin == std::string::npos ? 0 : begin + 1;
    long port = std::strtol(line->c_str() + begin, nullptr, 10);
    if (begin <= end && port > 0 && port < 65536) {
      return static_cast<uint16_t>(port);
    }
  }
  throw std::runtime_error(
      name_ + " printed \"" + *line + "\" where its port was expected");
}

}  // namespace tide::bench
