#include "ft/state_transfer.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

#include "tide/common/error.h"

#include "transport/fields.h"
#include "transport/transport.h"

namespace tide::ft {
namespace {

using transport::FieldReader;
using transport::FieldWriter;
using transport::Message;
using transport::Pipe;

constexpr transport::MessageType kMeta = 0x10;   // the description
constexpr transport::MessageType kReady = 0x11;  // send the tensors
constexpr transport::MessageType kData = 0x12;   // a part of the tensors
constexpr transport::MessageType kGot = 0x13;    // every part is in
// Tensors per message (a frame carries at most 1,024 buffers).
constexpr size_t kPerPart = 512;

int random_peer_id() {
  std::random_device seed;
  return std::uniform_int_distribution<int>(1, 0x7ffffff0)(seed);
}

std::string ms_text(milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

}  // namespace

struct StateTransfer::Impl {
  std::mutex mutex;
  std::condition_variable changed;

  // A state coming in, by tag (one source per tag).
  struct Incoming {
    Pipe from;  // the source's connection
    bool has_meta = false;
    std::string meta;
    uint64_t count = 0;  // tensors
    uint32_t parts = 0;
    uint32_t got = 0;
    bool ready = false;  // targets given
    std::vector<std::pair<void*, size_t>> targets;
    std::string error;
  };
  std::map<uint64_t, Incoming> incoming;

  // A state going out, by tag.
  struct Outgoing {
    const void* pipe = nullptr;
    bool ready = false;
    bool got = false;
    std::string error;
  };
  std::map<uint64_t, Outgoing> outgoing;

  const int self_id = random_peer_id();
  std::string host;
  std::unique_ptr<transport::Transport> transport;

  Impl(const std::string& listen_host, const std::string& token)
      : host(listen_host) {
    transport::TransportOptions t;
    t.self_id = self_id;
    t.self_name = "heal-" + std::to_string(self_id);
    t.listen_host = listen_host;
    t.token = token;
    // TCP, also on one host: each tensor's bytes land straight in the
    // healer's own tensor (placement), already in memory, where a
    // shared-memory segment would be new pages to fault in each time.
    t.shared_memory = false;
    // A state is sent whole, however large: its sender waits for it.
    t.max_queued_bytes = uint64_t{1} << 40;
    t.placement = [this](const transport::Frame& f, size_t index, uint64_t n) {
      return place(f, index, n);
    };
    t.message_types = transport::MessageTypes{
        {kMeta, "HEAL_META"},
        {kReady, "HEAL_READY"},
        {kData, "HEAL_DATA"},
        {kGot, "HEAL_GOT"}};
    transport = std::make_unique<transport::Transport>(
        std::move(t),
        transport::TransportHandlers{
            .on_message = [this](
                              const Pipe& pipe,
                              Message m) { on_message(pipe, std::move(m)); },
            .on_closed =
                [this](const Pipe& pipe, const std::string& why) {
                  on_closed(pipe, why);
                }});
  }

  ~Impl() {
    transport->shutdown();
    transport->join();
  }

  // --- on the transport's loop ---

  static std::tuple<uint32_t, uint32_t, uint64_t> part_of(
      std::string_view metadata) {
    FieldReader r(metadata, "a part of a healing state");
    uint32_t part = r.u32();
    uint32_t parts = r.u32();
    uint64_t first = r.u64();
    r.end();
    return {part, parts, first};
  }

  // Tensor bytes go where the healer said (the sizes checked again on
  // arrival); anything else into the transport's own buffer.
  Buffer place(const transport::Frame& f, size_t index, uint64_t n) {
    if (f.type != kData) {
      return {};
    }
    auto [part, parts, first] = part_of(f.metadata);
    std::lock_guard lock(mutex);
    auto it = incoming.find(f.id);
    if (it == incoming.end() || !it->second.ready ||
        first + index >= it->second.targets.size()) {
      return {};
    }
    auto [to, size] = it->second.targets[first + index];
    return size == n && n > 0 ? Buffer(std::shared_ptr<void>(), to, n)
                              : Buffer();
  }

  void on_message(const Pipe& pipe, Message m) {
    switch (m.type) {
      case kMeta: {
        FieldReader r(m.metadata, "a healing state's description");
        uint32_t parts = r.u32();
        uint64_t count = r.u64();
        r.end();
        if (m.buffers.size() != 1) {
          throw ProtocolError("healing: a description is one buffer");
        }
        std::lock_guard lock(mutex);
        Incoming& in = incoming[m.id];
        in = Incoming{
            .from = pipe,
            .has_meta = true,
            .meta = std::string(m.buffers[0].view()),
            .count = count,
            .parts = parts};
        changed.notify_all();
        return;
      }
      case kData:
        on_data(pipe, std::move(m));
        return;
      case kReady:
      case kGot: {
        std::string error;
        if (m.type == kGot) {
          FieldReader r(m.metadata, "a healing acknowledgement");
          error = r.str();
          r.end();
        }
        std::lock_guard lock(mutex);
        if (auto it = outgoing.find(m.id); it != outgoing.end()) {
          (m.type == kReady ? it->second.ready : it->second.got) = true;
          it->second.error = error;
        }
        changed.notify_all();
        return;
      }
      default:
        throw ProtocolError("healing: an unknown message");
    }
  }

  void on_data(const Pipe& pipe, Message m) {
    auto [part, parts, first] = part_of(m.metadata);
    bool done = false;
    {
      std::lock_guard lock(mutex);
      auto it = incoming.find(m.id);
      if (it == incoming.end() || !it->second.ready ||
          it->second.from.id() != pipe.id()) {
        throw ProtocolError("healing: tensors before the healer was ready");
      }
      Incoming& in = it->second;
      if (part != in.got || parts != in.parts ||
          first + m.buffers.size() > in.targets.size()) {
        throw ProtocolError(
            "healing: part " + std::to_string(part) + " of " +
            std::to_string(parts) + " came after " + std::to_string(in.got) +
            " of " + std::to_string(in.parts));
      }
      for (size_t i = 0; i < m.buffers.size(); ++i) {
        auto [to, size] = in.targets[first + i];
        const Buffer& b = m.buffers[i];
        if (b.size() != size) {
          throw ProtocolError(
              "healing: tensor " + std::to_string(first + i) + " came with " +
              std::to_string(b.size()) + " bytes, not " + std::to_string(size));
        }
        if (b.data() != to && size > 0) {
          std::memcpy(to, b.data(), size);
        }
      }
      done = ++in.got == in.parts;
      changed.notify_all();
    }
    if (done) {
      pipe.send(Message{
          .type = kGot, .id = m.id, .metadata = FieldWriter().str("").take()});
    }
  }

  void on_closed(const Pipe& pipe, const std::string& why) {
    std::lock_guard lock(mutex);
    for (auto& [tag, in] : incoming) {
      if (in.has_meta && in.from.id() == pipe.id() && in.got < in.parts) {
        in.error = "the source went away with " + std::to_string(in.got) +
                   " of " + std::to_string(in.parts) + " parts sent (" + why +
                   ")";
      }
    }
    for (auto& [tag, out] : outgoing) {
      if (out.pipe == pipe.id() && !out.got) {
        out.error = "the healing process went away (" + why + ")";
      }
    }
    changed.notify_all();
  }

  // Waits until `done` holds or an error is set; throws on either failure.
  template <typename Entry, typename Done>
  void wait(
      std::unique_lock<std::mutex>& lock,
      Entry& entry,
      milliseconds timeout,
      const char* what,
      Done done) {
    bool in_time = changed.wait_for(
        lock, timeout, [&] { return done() || !entry.error.empty(); });
    if (!entry.error.empty()) {
      throw NetworkError("healing: " + entry.error);
    }
    if (!in_time) {
      throw TimeoutError(
          std::string("healing: ") + what + " within " + ms_text(timeout));
    }
  }
};

StateTransfer::StateTransfer(
    const std::string& listen_host, const std::string& token)
    : impl_(std::make_unique<Impl>(listen_host, token)) {}

StateTransfer::~StateTransfer() = default;

std::string StateTransfer::address() const {
  return FieldWriter()
      .i32(impl_->self_id)
      .str(impl_->host)
      .u32(impl_->transport->port())
      .take();
}

void StateTransfer::send(
    const std::string& to,
    uint64_t tag,
    const std::string& meta,
    const std::vector<std::pair<const void*, size_t>>& buffers,
    milliseconds timeout) {
  Impl& impl = *impl_;
  transport::PeerAddress a;
  {
    FieldReader r(to, "a healing process's address");
    a.id = r.i32();
    a.host = r.str();
    uint32_t port = r.u32();
    r.end();
    if (port == 0 || port > 65535) {
      throw InvalidArgument(
          "a healing process's address names port " + std::to_string(port));
    }
    a.port = static_cast<uint16_t>(port);
    a.name = "heal-" + std::to_string(a.id);
  }
  impl.transport->set_peers({a});
  Pipe pipe = impl.transport->pipe_to(a.id);
  uint32_t parts = static_cast<uint32_t>(
      std::max<size_t>(1, (buffers.size() + kPerPart - 1) / kPerPart));
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::chrono::duration_cast<milliseconds>(std::max(
        deadline - std::chrono::steady_clock::now(),
        std::chrono::steady_clock::duration::zero()));
  };
  auto post = [&](Message m) {
    std::string why;
    if (!pipe.send(std::move(m), &why)) {
      throw NetworkError(
          "healing: cannot send to " + impl.transport->peer_label(a.id) + ": " +
          why);
    }
  };
  std::unique_lock lock(impl.mutex);
  Impl::Outgoing& out = impl.outgoing[tag];
  out = Impl::Outgoing{.pipe = pipe.id()};
  struct Forget {
    Impl& impl;
    std::unique_lock<std::mutex>& lock;
    uint64_t tag;
    ~Forget() {
      if (!lock.owns_lock()) {
        lock.lock();
      }
      impl.outgoing.erase(tag);
    }
  } forget{impl, lock, tag};
  lock.unlock();
  Message head{
      .type = kMeta,
      .id = tag,
      .metadata = FieldWriter()
                      .u32(parts)
                      .u64(static_cast<uint64_t>(buffers.size()))
                      .take()};
  head.buffers.emplace_back(meta);
  post(std::move(head));
  lock.lock();
  impl.wait(
      lock, out, left(), "the healer was not ready", [&] { return out.ready; });
  lock.unlock();
  for (uint32_t p = 0; p < parts; ++p) {
    size_t first = p * kPerPart;
    Message m{
        .type = kData,
        .id = tag,
        .metadata = FieldWriter().u32(p).u32(parts).u64(first).take()};
    for (size_t i = first; i < std::min(buffers.size(), first + kPerPart);
         ++i) {
      m.buffers.emplace_back(
          std::shared_ptr<void>(),
          const_cast<void*>(buffers[i].first),
          buffers[i].second);
    }
    post(std::move(m));
  }
  lock.lock();
  try {
    impl.wait(lock, out, left(), "the state was not received", [&] {
      return out.got;
    });
  } catch (const TimeoutError&) {
    // Its bytes must not be read after this returns.
    lock.unlock();
    impl.transport->cancel(a.id, tag);
    lock.lock();
    throw;
  }
}

std::string StateTransfer::receive_meta(uint64_t tag, milliseconds timeout) {
  Impl& impl = *impl_;
  std::unique_lock lock(impl.mutex);
  Impl::Incoming& in = impl.incoming[tag];
  impl.wait(lock, in, timeout, "no state came", [&] { return in.has_meta; });
  // Older states (of rounds that were aborted) are of no use now.
  impl.incoming.erase(impl.incoming.begin(), impl.incoming.lower_bound(tag));
  return in.meta;
}

void StateTransfer::receive_into(
    uint64_t tag,
    const std::vector<std::pair<void*, size_t>>& targets,
    milliseconds timeout) {
  Impl& impl = *impl_;
  std::unique_lock lock(impl.mutex);
  auto it = impl.incoming.find(tag);
  if (it == impl.incoming.end() || !it->second.has_meta) {
    throw InvalidArgument("healing: receive_into() before receive_meta()");
  }
  Impl::Incoming& in = it->second;
  if (targets.size() != in.count) {
    throw InvalidArgument(
        "healing: " + std::to_string(targets.size()) +
        " places for a state of " + std::to_string(in.count) + " tensors");
  }
  in.targets = targets;
  in.ready = true;
  Pipe from = in.from;
  lock.unlock();
  std::string why;
  if (!from.send(Message{.type = kReady, .id = tag}, &why)) {
    throw NetworkError("healing: the source went away (" + why + ")");
  }
  lock.lock();
  struct Forget {
    Impl& impl;
    uint64_t tag;
    ~Forget() {
      impl.incoming.erase(tag);  // under the caller's lock
    }
  } forget{impl, tag};
  try {
    impl.wait(lock, in, timeout, "the state did not come whole", [&] {
      return in.got == in.parts;
    });
  } catch (const Error&) {
    // A tensor may be half written: no byte may land in `targets` once
    // this returns, so this side's connections end here, and with them
    // this StateTransfer.
    lock.unlock();
    impl.transport->shutdown();
    impl.transport->join();
    lock.lock();
    throw;
  }
}

}  // namespace tide::ft
