#include "transport/shm/segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <string>

#include "tide/common/error.h"

namespace tide::transport::shm {

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// Maps a segment read-write, faulted in now, once: every later message
// through it finds its pages. MAP_FAILED (errno set) when it cannot.
void* map_populated(const Fd& fd, size_t size) {
  return ::mmap(
      nullptr,
      size,
      PROT_READ | PROT_WRITE,
      MAP_SHARED | MAP_POPULATE,
      fd.get(),
      0);
}

}  // namespace

size_t segment_size_for(size_t n) {
  return std::max(kMinSegment, std::bit_ceil(n));
}

Segment& SendSegments::acquire(size_t n) {
  size_t size = segment_size_for(n);
  if (auto it = free_.lower_bound(size);
      it != free_.end() && it->first == size) {
    uint64_t id = it->second;
    free_.erase(it);
    in_use_[id].peer = true;
    return segments_.at(id);
  }
  Fd fd(::memfd_create("tide-rpc", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) {
    throw NetworkError("memfd_create: " + errno_text());
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, kSeals) != 0) {
    throw NetworkError("sizing a shared-memory segment: " + errno_text());
  }
  void* base = map_populated(fd, size);
  if (base == MAP_FAILED) {
    throw NetworkError("mapping a shared-memory segment: " + errno_text());
  }
  uint64_t id = next_id_++;
  bytes_ += size;
  in_use_[id].peer = true;
  std::shared_ptr<char> memory(
      static_cast<char*>(base), [size](char* p) { ::munmap(p, size); });
  return segments_[id] = Segment{
             id,
             std::move(fd),
             static_cast<char*>(base),
             size,
             std::move(memory),
             false};
}

bool SendSegments::release(uint64_t id) {
  auto it = in_use_.find(id);
  if (it == in_use_.end() || !it->second.peer) {
    return false;
  }
  it->second.peer = false;
  free_if_unused(id, it->second);
  return true;
}

Segment* SendSegments::hold_local(uint64_t id) {
  auto it = in_use_.find(id);
  if (it == in_use_.end() || !it->second.peer) {
    return nullptr;
  }
  ++it->second.local;
  return &segments_.at(id);
}

void SendSegments::drop_local(uint64_t id) {
  auto it = in_use_.find(id);
  if (it == in_use_.end() || it->second.local == 0) {
    return;
  }
  --it->second.local;
  free_if_unused(id, it->second);
}

void SendSegments::free_if_unused(uint64_t id, const Use& use) {
  if (!use.peer && use.local == 0) {
    free_.emplace(segments_.at(id).size, id);
  }
}

Mapping::Mapping(Fd fd, size_t size) : size_(size) {
  struct stat st {};
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  bool ok = ::fstat(fd.get(), &st) == 0 && seals >= 0 &&
            (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) ==
                (F_SEAL_SHRINK | F_SEAL_SEAL) &&
            static_cast<uint64_t>(st.st_size) == size && size > 0;
  if (!ok) {
    throw ProtocolError(
        "the peer passed a shared-memory segment that is not a sealed memfd "
        "of the " +
        std::to_string(size) + " bytes it claims");
  }
  // Not populated: a page costs this side only once a buffer in it is read
  // (a peer could pass sealed segments it never wrote, and have us fault
  // in gigabytes of zeros).
  void* base =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    throw ProtocolError(
        "mapping the peer's shared-memory segment: " + errno_text());
  }
  base_ = static_cast<char*>(base);
}

Mapping::~Mapping() {
  ::munmap(base_, size_);
}

}  // namespace tide::transport::shm
