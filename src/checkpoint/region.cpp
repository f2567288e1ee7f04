#include "checkpoint/region.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
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

Layout plan(uint64_t bytes, int local_ranks, bool peer) {
  if (local_ranks < 1) {
    throw InvalidArgument("checkpoint memory needs at least one local rank");
  }
  const uint32_t own = peer ? 3 : 2;
  const uint64_t ranks = static_cast<uint64_t>(local_ranks);
  const uint64_t slots = ranks * (own + (peer ? 2 : 0));
  const uint64_t page = 4096;
  uint64_t slot = bytes > kHeaderBytes ? (bytes - kHeaderBytes) / slots : 0;
  slot -= slot % page;
  if (slot < kMinSlotBytes) {
    throw InvalidArgument(
        "--checkpoint-memory " + human_bytes(bytes) + " is too small for " +
        std::to_string(local_ranks) + " local ranks: each needs " +
        (peer ? "five slots (three of its own, two for a peer node's copy)"
              : "two slots") +
        " of at least " + human_bytes(kMinSlotBytes) + " (give at least " +
        human_bytes(kHeaderBytes + slots * kMinSlotBytes) + ")");
  }
  return Layout{
      .slots = static_cast<uint32_t>(slots),
      .slot_bytes = slot,
      .bytes = kHeaderBytes + slots * slot,
      .local_ranks = static_cast<uint32_t>(local_ranks),
      .own = own,
      .replicas_from = static_cast<uint32_t>(ranks * own)};
}

Region::Region(
    const std::string& dir, uint64_t bytes, int local_ranks, bool peer)
    : layout_(plan(bytes, local_ranks, peer)) {
  path_ = dir + "/" + kRegionPrefix + std::to_string(::getpid()) + "-" +
          random_id(8);
  fd_.reset(::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  const Fd& fd = fd_;
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
  put32(header + 8, kRegionVersion);
  put32(header + 12, layout_.slots);
  put64(header + 16, layout_.slot_bytes);
  put64(header + 24, layout_.bytes);
  put32(header + 32, layout_.own);
  put32(header + 36, layout_.replicas_from);
  if (::pwrite(fd.get(), header, sizeof header, 0) !=
      static_cast<ssize_t>(sizeof header)) {
    int e = errno;
    ::unlink(path_.c_str());
    throw Error(
        "cannot write the checkpoint memory " + path_ + ": " +
        std::strerror(e));
  }
  map();
}

Region::Region(const std::string& path) : path_(path), owner_(false) {
  fd_.reset(::open(path_.c_str(), O_RDWR | O_CLOEXEC));
  char header[64] = {};
  if (!fd_ || ::pread(fd_.get(), header, sizeof header, 0) !=
                  static_cast<ssize_t>(sizeof header)) {
    throw Error(
        "cannot open the checkpoint memory " + path_ + ": " +
        std::strerror(errno));
  }
  uint32_t version = 0;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&layout_.slots, header + 12, 4);
  std::memcpy(&layout_.slot_bytes, header + 16, 8);
  std::memcpy(&layout_.bytes, header + 24, 8);
  std::memcpy(&layout_.own, header + 32, 4);
  std::memcpy(&layout_.replicas_from, header + 36, 4);
  struct stat st {};
  if (std::memcmp(header, "TIDECKPR", 8) != 0 || version != kRegionVersion ||
      layout_.own == 0 || layout_.replicas_from > layout_.slots ||
      ::fstat(fd_.get(), &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < layout_.bytes ||
      layout_.bytes !=
          kHeaderBytes + uint64_t{layout_.slots} * layout_.slot_bytes) {
    throw Error(
        path_ + " is not a tide checkpoint region (version " +
        std::to_string(kRegionVersion) + ")");
  }
  layout_.local_ranks = layout_.replicas_from / layout_.own;
  map();
}

Region::~Region() {
  if (map_ != nullptr) {
    ::munmap(map_, layout_.bytes);
  }
  if (owner_) {
    ::unlink(path_.c_str());
  }
}

void Region::map() {
  void* at = ::mmap(
      nullptr, layout_.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (at == MAP_FAILED) {
    int e = errno;
    if (owner_) {
      ::unlink(path_.c_str());
    }
    throw Error(
        "cannot map the checkpoint memory " + path_ + ": " + std::strerror(e));
  }
  map_ = static_cast<char*>(at);
}

char* Region::slot(uint32_t i) {
  return map_ + kHeaderBytes + static_cast<uint64_t>(i) * layout_.slot_bytes;
}

namespace {

// A slot's header is shared with other processes (workers write it from
// Python as plain stores) and, in an agent, with its other threads: each
// field is read and written whole, atomically; the state is published
// last, so it is read with acquire and written with release, and a reader
// that must be sure checks it again after reading the rest.
uint64_t load64(const char* at) {
  return __atomic_load_n(
      reinterpret_cast<const uint64_t*>(at), __ATOMIC_RELAXED);
}
void store64(char* at, uint64_t v) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(at), v, __ATOMIC_RELAXED);
}
uint32_t load32(const char* at, int order = __ATOMIC_RELAXED) {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(at), order);
}
void store32(char* at, uint32_t v, int order = __ATOMIC_RELAXED) {
  __atomic_store_n(reinterpret_cast<uint32_t*>(at), v, order);
}

// "TIDECKPS" as the u64 at a slot's start.
uint64_t slot_magic() {
  uint64_t m = 0;
  std::memcpy(&m, "TIDECKPS", 8);
  return m;
}

}  // namespace

SlotHead Region::head(uint32_t i) {
  const char* at = slot(i);
  SlotHead h;
  if (load64(at) != slot_magic() || load32(at + 8) != 1) {
    return h;
  }
  h.state = load32(at + 12, __ATOMIC_ACQUIRE);
  h.seq = load64(at + 16);
  h.step = static_cast<int64_t>(load64(at + 24));
  h.rank = static_cast<int64_t>(load64(at + 32));
  h.meta_bytes = load64(at + 40);
  h.data_bytes = load64(at + 48);
  h.flags = load64(at + 56);
  if (kHeaderBytes + h.payload() > layout_.slot_bytes) {
    return SlotHead{};  // torn, or not ours: never read past the slot
  }
  return h;
}

void Region::begin(uint32_t i, const SlotHead& h) {
  char* at = slot(i);
  set_state(i, kWriting);
  store64(at, slot_magic());
  store32(at + 8, 1);
  store64(at + 16, h.seq);
  store64(at + 24, static_cast<uint64_t>(h.step));
  store64(at + 32, static_cast<uint64_t>(h.rank));
  store64(at + 40, h.meta_bytes);
  store64(at + 48, h.data_bytes);
  store64(at + 56, h.flags);
}

void Region::set_state(uint32_t i, uint32_t state) {
  store32(slot(i) + 12, state, __ATOMIC_RELEASE);
}

void Region::set_flags(uint32_t i, uint64_t flags) {
  store64(slot(i) + 56, flags);
}

uint64_t Region::offset(uint32_t i, uint64_t at, uint64_t n) const {
  if (i >= layout_.slots || at + n + kHeaderBytes > layout_.slot_bytes) {
    throw InvalidArgument(
        "past the end of checkpoint slot " + std::to_string(i));
  }
  return kHeaderBytes + static_cast<uint64_t>(i) * layout_.slot_bytes +
         kHeaderBytes + at;
}

namespace {

// Runs io (pread or pwrite of what is left at an offset) until n bytes are
// through.
template <typename Io>
void all_of(uint64_t n, const std::string& what, Io io) {
  for (uint64_t done = 0; done < n;) {
    ssize_t moved = io(done);
    if (moved <= 0) {
      if (moved < 0 && errno == EINTR) {
        continue;
      }
      throw Error(
          "cannot " + what + ": " +
          (moved == 0 ? "short file" : std::strerror(errno)));
    }
    done += static_cast<uint64_t>(moved);
  }
}

}  // namespace

void Region::read(uint32_t i, uint64_t at, char* to, uint64_t n) const {
  uint64_t from = offset(i, at, n);
  all_of(n, "read the checkpoint memory " + path_, [&](uint64_t done) {
    return ::pread(
        fd_.get(), to + done, n - done, static_cast<off_t>(from + done));
  });
}

void Region::write(uint32_t i, uint64_t at, const char* from, uint64_t n) {
  uint64_t to = offset(i, at, n);
  all_of(n, "write the checkpoint memory " + path_, [&](uint64_t done) {
    return ::pwrite(
        fd_.get(), from + done, n - done, static_cast<off_t>(to + done));
  });
}

bool Region::peer() {
  return load32(map_ + 40, __ATOMIC_ACQUIRE) == 1;
}

void Region::set_peer(bool on) {
  store32(map_ + 40, on ? 1u : 0u, __ATOMIC_RELEASE);
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
