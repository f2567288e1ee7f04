#include "checkpoint/region.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tide/common/error.h"
#include "tide/common/fd.h"
#include "tide/common/strings.h"

#include "common/random.h"

namespace tide::checkpoint {
namespace {

void put32(char* at, uint32_t v) {
  std::memcpy(at, &v, sizeof v);  // little-endian hosts only (x86, arm64)
}
void put64(char* at, uint64_t v) {
  std::memcpy(at, &v, sizeof v);
}

}  // namespace

Layout plan(uint64_t bytes, int local_ranks) {
  if (local_ranks < 1) {
    throw InvalidArgument("checkpoint memory needs at least one local rank");
  }
  const uint64_t slots = 2 * static_cast<uint64_t>(local_ranks);
  const uint64_t page = 4096;
  uint64_t slot = bytes > kHeaderBytes ? (bytes - kHeaderBytes) / slots : 0;
  slot -= slot % page;
  if (slot < kMinSlotBytes) {
    throw InvalidArgument(
        "--checkpoint-memory " + human_bytes(bytes) + " is too small for " +
        std::to_string(local_ranks) + " local ranks: each needs two slots of " +
        "at least " + human_bytes(kMinSlotBytes) + " (give at least " +
        human_bytes(kHeaderBytes + slots * kMinSlotBytes) + ")");
  }
  return Layout{
      .slots = static_cast<uint32_t>(slots),
      .slot_bytes = slot,
      .bytes = kHeaderBytes + slots * slot};
}

Region::Region(const std::string& dir, uint64_t bytes, int local_ranks)
    : layout_(plan(bytes, local_ranks)) {
  path_ = dir + "/" + kRegionPrefix + std::to_string(::getpid()) + "-" +
          random_id(8);
  Fd fd(::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) {
    throw Error(
        "cannot create the checkpoint memory " + path_ + ": " +
        std::strerror(errno));
  }
  struct statvfs fs {};
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
  if (::fstatvfs(fd.get(), &fs) == 0) {
    free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    total_bytes = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
  }
  int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(layout_.bytes));
  if (err != 0) {
    ::unlink(path_.c_str());
    throw Error(
        "--checkpoint-memory " + human_bytes(layout_.bytes) +
        " does not fit in " + dir + ": " + human_bytes(free_bytes) +
        " free of " + human_bytes(total_bytes) + " (" + std::strerror(err) +
        "); give the machine or container a larger " + dir +
        " (docker: --shm-size) or lower --checkpoint-memory");
  }
  char header[64] = {};
  std::memcpy(header, "TIDECKPR", 8);
  put32(header + 8, 1);
  put32(header + 12, layout_.slots);
  put64(header + 16, layout_.slot_bytes);
  put64(header + 24, layout_.bytes);
  if (::pwrite(fd.get(), header, sizeof header, 0) !=
      static_cast<ssize_t>(sizeof header)) {
    int e = errno;
    ::unlink(path_.c_str());
    throw Error(
        "cannot write the checkpoint memory " + path_ + ": " +
        std::strerror(e));
  }
}

Region::~Region() {
  ::unlink(path_.c_str());
}

int remove_stale(const std::string& dir) {
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(kRegionPrefix, 0) != 0) {
      continue;
    }
    // tide-checkpoint-<pid>-<random>
    pid_t pid = static_cast<pid_t>(
        std::atol(name.c_str() + std::strlen(kRegionPrefix)));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH &&
        ::unlink(entry.path().c_str()) == 0) {
      ++removed;
    }
  }
  return removed;
}

}  // namespace tide::checkpoint
