#include "checkpoint/peer_copy.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "checkpoint/region.h"
#include "common/clock.h"
#include "transport/fields.h"
#include "transport/transport.h"

namespace tide::checkpoint {
namespace {

using transport::FieldReader;
using transport::FieldWriter;
using transport::Message;
using transport::Pipe;

constexpr transport::MessageType kPut = 0x10;      // a chunk of a snapshot
constexpr transport::MessageType kAck = 0x11;      // a chunk is in
constexpr transport::MessageType kFetch = 0x12;    // send me these ranks
constexpr transport::MessageType kFetched = 0x13;  // that was all of them

// Why a snapshot travels.
constexpr uint32_t kCopy = 0;     // into the peer's replica slots
constexpr uint32_t kRestore = 1;  // into a fetching node's own slots

// A chunk's place in its snapshot.
constexpr uint32_t kMore = 0;
constexpr uint32_t kLast = 1;
constexpr uint32_t kVoid = 2;  // the slot was written over while sent

// How often the sender looks for new snapshots to copy, and how long it
// waits after a failed copy before trying the peer again.
constexpr auto kPoll = std::chrono::milliseconds(5);
constexpr auto kRetry = std::chrono::seconds(1);

struct Put {
  uint32_t purpose = kCopy;
  uint64_t fetch = 0;
  SlotHead head;
  uint32_t local = 0;
  uint64_t offset = 0;
  uint32_t place = kMore;

  std::string encode() const {
    return FieldWriter()
        .u32(purpose)
        .u64(fetch)
        .u64(head.seq)
        .i64(head.step)
        .i64(head.rank)
        .u64(head.meta_bytes)
        .u64(head.data_bytes)
        .u32(local)
        .u64(offset)
        .u32(place)
        .take();
  }
  static Put decode(const std::string& in) {
    FieldReader r(in, "checkpoint PUT");
    Put p;
    p.purpose = r.u32();
    p.fetch = r.u64();
    p.head.seq = r.u64();
    p.head.step = r.i64();
    p.head.rank = r.i64();
    p.head.meta_bytes = r.u64();
    p.head.data_bytes = r.u64();
    p.local = r.u32();
    p.offset = r.u64();
    p.place = r.u32();
    r.end();
    return p;
  }
};

// Chunk buffers, used again once the transport lets go of them: a new
// allocation of a chunk's size per chunk (received or sent) would fault its
// pages in each time, which costs more than the copy on a VM.
class ChunkPool : public std::enable_shared_from_this<ChunkPool> {
 public:
  explicit ChunkPool(uint64_t bytes) : bytes_(bytes) {}

  // n bytes (at most the chunk size) of a buffer.
  Buffer take(uint64_t n) {
    std::unique_ptr<char[]> b;
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        b = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!b) {
      b = std::make_unique_for_overwrite<char[]>(bytes_);
    }
    char* p = b.release();
    std::weak_ptr<ChunkPool> pool = weak_from_this();
    return Buffer(
        std::shared_ptr<void>(
            p,
            [pool](void* q) {
              std::unique_ptr<char[]> back(static_cast<char*>(q));
              if (auto s = pool.lock()) {
                s->give(std::move(back));
              }
            }),
        p,
        n);
  }

  uint64_t bytes() const {
    return bytes_;
  }

 private:
  void give(std::unique_ptr<char[]> b) {
    std::lock_guard lock(mutex_);
    if (free_.size() < kKeep) {
      free_.push_back(std::move(b));
    }
  }

  // The window's, each way, and a few more.
  static constexpr size_t kKeep = 2 * kWindow + 4;
  const uint64_t bytes_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<char[]>> free_;
};

int random_node_id() {
  std::random_device seed;
  return std::uniform_int_distribution<int>(1, 0x7ffffff0)(seed);
}

bool same(const SlotHead& a, const SlotHead& b) {
  return a.state == kComplete && b.state == kComplete && a.seq == b.seq &&
         a.rank == b.rank && a.step == b.step;
}

}  // namespace

struct PeerCopy::Impl {
  Region& region;
  PeerCopyOptions options;
  const int self_id = random_node_id();
  std::unique_ptr<transport::Transport> transport;

  std::mutex mutex;
  std::condition_variable changed;
  bool stopping = false;

  // The round (guarded by mutex).
  int self_rank = -1;
  std::map<int, PeerNode> nodes;  // by rank
  int peer = -1;                  // a rank of nodes, or -1

  // Snapshots this side sends, by message id (guarded by mutex).
  struct Outgoing {
    const void* pipe = nullptr;
    int acked = 0;
    std::string error;
  };
  std::map<uint64_t, Outgoing> outgoing;
  uint64_t next_id = 1;

  // Fetches other agents asked for (guarded by mutex).
  struct Request {
    Pipe pipe;
    uint64_t id = 0;
    std::vector<int64_t> ranks;
  };
  std::vector<Request> requests;

  // This side's fetch in progress (guarded by mutex).
  struct Fetch {
    std::map<int64_t, int> ranks;  // global -> local
    std::map<int64_t, uint32_t> filled;
    std::map<int64_t, Fetched> got;
    std::set<int> answered;  // node ids (or gone)
    std::string error;

    void add(const std::string& e) {
      if (!e.empty()) {
        error += (error.empty() ? "" : "; ") + e;
      }
    }
  };
  std::map<uint64_t, Fetch> fetches;

  // Snapshots coming in, by (connection, message id); the loop's own.
  struct Incoming {
    int64_t slot = -1;  // -1: dropped (its rank's own slots are full)
    SlotHead head;
    uint64_t fetch = 0;
    uint64_t next = 0;
  };
  std::map<std::pair<const void*, uint64_t>, Incoming> incoming;

  std::shared_ptr<ChunkPool> chunks;
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> bytes_copied{0};
  std::jthread sender;

  Impl(Region& r, PeerCopyOptions o)
      : region(r),
        options(std::move(o)),
        chunks(std::make_shared<ChunkPool>(options.chunk_bytes)) {
    transport::TransportOptions t;
    t.self_id = self_id;
    t.self_name = name(self_id);
    t.listen_host = options.listen_host;
    t.shared_memory = false;
    t.token = options.token;
    // A chunk comes into a buffer of the pool (unless a peer's chunks are
    // larger than this side's: then the transport's own).
    t.placement = [pool = chunks](
                      const transport::Frame& f, size_t index, uint64_t n) {
      return f.type == kPut && index == 0 && n <= pool->bytes() ? pool->take(n)
                                                                : Buffer();
    };
    t.message_types = transport::MessageTypes{
        {kPut, "CHECKPOINT_PUT"},
        {kAck, "CHECKPOINT_ACK"},
        {kFetch, "CHECKPOINT_FETCH"},
        {kFetched, "CHECKPOINT_FETCHED"}};
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
    sender = std::jthread([this](std::stop_token) { send_loop(); });
  }

  ~Impl() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    sender = {};  // joined
    transport->shutdown();
    transport->join();
  }

  static std::string name(int id) {
    return "checkpoint-" + std::to_string(id);
  }

  // --- on the transport's loop ---

  void on_message(const Pipe& pipe, Message m) {
    switch (m.type) {
      case kPut:
        on_put(pipe, std::move(m));
        return;
      case kAck: {
        FieldReader r(m.metadata, "checkpoint ACK");
        std::string error = r.str();
        r.end();
        std::lock_guard lock(mutex);
        if (auto it = outgoing.find(m.id); it != outgoing.end()) {
          ++it->second.acked;
          if (!error.empty() && it->second.error.empty()) {
            it->second.error = error;
          }
        }
        changed.notify_all();
        return;
      }
      case kFetch: {
        FieldReader r(m.metadata, "checkpoint FETCH");
        Request q{.pipe = pipe, .id = m.id};
        for (uint64_t rank : r.u64s()) {
          q.ranks.push_back(static_cast<int64_t>(rank));
        }
        r.end();
        std::lock_guard lock(mutex);
        requests.push_back(std::move(q));
        changed.notify_all();
        return;
      }
      case kFetched: {
        FieldReader r(m.metadata, "checkpoint FETCHED");
        std::string error = r.str();
        r.end();
        std::lock_guard lock(mutex);
        if (auto it = fetches.find(m.id); it != fetches.end()) {
          it->second.answered.insert(pipe.peer());
          it->second.add(error);
        }
        changed.notify_all();
        return;
      }
      default:
        throw ProtocolError("unexpected message");
    }
  }

  void on_put(const Pipe& pipe, Message m) {
    Put p = Put::decode(m.metadata);
    if (m.buffers.size() != 1) {
      throw ProtocolError("a checkpoint chunk has one buffer");
    }
    const Buffer& chunk = m.buffers[0];
    auto key = std::make_pair(pipe.id(), m.id);
    std::string error;
    try {
      auto it = incoming.find(key);
      if (p.offset == 0 && it == incoming.end()) {
        it = incoming.emplace(key, begin_incoming(pipe, p)).first;
      } else if (it == incoming.end() || it->second.next != p.offset) {
        throw ProtocolError(
            "a checkpoint chunk at " + std::to_string(p.offset) +
            " out of order");
      }
      Incoming& in = it->second;
      if (p.offset + chunk.size() > in.head.payload()) {
        throw ProtocolError("a checkpoint chunk past its snapshot's end");
      }
      if (in.slot >= 0) {
        region.write(
            static_cast<uint32_t>(in.slot),
            p.offset,
            chunk.data(),
            chunk.size());
      }
      in.next += chunk.size();
      if (p.place != kMore) {
        finish_incoming(pipe, in, p.place == kLast);
        incoming.erase(it);
      }
    } catch (const Error& e) {
      error = e.what();
      if (auto it = incoming.find(key); it != incoming.end()) {
        if (it->second.slot >= 0) {
          region.set_state(static_cast<uint32_t>(it->second.slot), kEmpty);
        }
        incoming.erase(it);
      }
    }
    pipe.send(Message{
        .type = kAck, .id = m.id, .metadata = FieldWriter().str(error).take()});
  }

  // Where a snapshot that starts coming goes. Throws Error for one that
  // does not fit or has nowhere to go.
  Incoming begin_incoming(const Pipe& pipe, const Put& p) {
    const Layout& l = region.layout();
    if (kHeaderBytes + p.head.payload() > l.slot_bytes) {
      throw Error(
          "the snapshot of rank " + std::to_string(p.head.rank) + " (" +
          human_bytes(p.head.payload()) + ") is over this node's slots (" +
          human_bytes(l.slot_bytes - kHeaderBytes) +
          "): give every node the same --checkpoint-memory");
    }
    Incoming in{.head = p.head, .fetch = p.fetch};
    in.head.state = kWriting;
    if (p.purpose == kCopy) {
      if (l.replicas_from == l.slots || p.local >= l.local_ranks) {
        throw Error(
            "this node holds no copy for local rank " +
            std::to_string(p.local) +
            ": give every node the same "
            "--nproc-per-node and --checkpoint-memory");
      }
      uint32_t a = l.replicas_from + 2 * p.local;
      SlotHead ha = region.head(a);
      SlotHead hb = region.head(a + 1);
      // Over the one that is not the rank's newest copy.
      bool a_newer =
          ha.state == kComplete && ha.rank == p.head.rank &&
          !(hb.state == kComplete && hb.rank == p.head.rank && hb.seq > ha.seq);
      in.slot = a_newer ? a + 1 : a;
      in.head.flags = 0;
      if (holds(p.head)) {
        in.slot = -1;  // a snapshot it fetched from here, say: nothing new
      }
    } else {
      std::lock_guard lock(mutex);
      auto f = fetches.find(p.fetch);
      if (f == fetches.end()) {
        throw Error("no fetch " + std::to_string(p.fetch) + " is waiting");
      }
      auto r = f->second.ranks.find(p.head.rank);
      if (r == f->second.ranks.end()) {
        throw Error(
            "rank " + std::to_string(p.head.rank) + " was not asked for");
      }
      uint32_t used = f->second.filled[p.head.rank]++;
      in.slot =
          used < l.own ? static_cast<int64_t>(r->second) * l.own + used : -1;
      // From the node that takes this one's copies: that node holds it.
      auto peer_node = nodes.find(peer);
      bool from_peer =
          peer_node != nodes.end() && peer_node->second.id == pipe.peer();
      in.head.flags = kFromPeer | (from_peer ? kReplicated : 0);
    }
    if (in.slot >= 0) {
      region.begin(static_cast<uint32_t>(in.slot), in.head);
    }
    return in;
  }

  // Whether a slot holds this very snapshot, whole.
  bool holds(const SlotHead& h) {
    for (uint32_t s = 0; s < region.layout().slots; ++s) {
      SlotHead mine = region.head(s);
      if (mine.state == kComplete && mine.rank == h.rank && mine.seq == h.seq &&
          mine.step == h.step) {
        return true;
      }
    }
    return false;
  }

  void finish_incoming(const Pipe& pipe, const Incoming& in, bool whole) {
    if (whole && in.next != in.head.payload()) {
      throw ProtocolError("a checkpoint snapshot ended short");
    }
    if (in.slot >= 0) {
      region.set_state(
          static_cast<uint32_t>(in.slot), whole ? kComplete : kEmpty);
    }
    if (!whole || in.slot < 0 || in.fetch == 0) {
      return;
    }
    std::lock_guard lock(mutex);
    auto f = fetches.find(in.fetch);
    if (f == fetches.end()) {
      return;
    }
    Fetched& got = f->second.got[in.head.rank];
    got.rank = in.head.rank;
    for (const auto& [rank, node] : nodes) {
      if (node.id == pipe.peer()) {
        got.from = rank;
      }
    }
    got.steps.push_back(in.head.step);
    got.bytes += in.head.payload();
  }

  void on_closed(const Pipe& pipe, const std::string& why) {
    std::lock_guard lock(mutex);
    for (auto& [id, out] : outgoing) {
      if (out.pipe == pipe.id() && out.error.empty()) {
        out.error = "the connection closed: " + why;
      }
    }
    for (auto& [id, f] : fetches) {
      if (pipe.outgoing() && f.answered.insert(pipe.peer()).second) {
        f.add(transport->peer_label(pipe.peer()) + " is gone: " + why);
      }
    }
    for (auto it = incoming.begin(); it != incoming.end();) {
      if (it->first.first == pipe.id()) {
        if (it->second.slot >= 0) {
          region.set_state(static_cast<uint32_t>(it->second.slot), kEmpty);
        }
        it = incoming.erase(it);
      } else {
        ++it;
      }
    }
    changed.notify_all();
  }

  // --- on the sender thread ---

  // Sends the snapshot in slot (as `head` says) on pipe, chunk by chunk;
  // false, with why, when it did not arrive whole.
  bool send(
      const Pipe& pipe,
      uint32_t slot,
      const SlotHead& head,
      Put p,
      std::string& why) {
    uint64_t id = 0;
    {
      std::lock_guard lock(mutex);
      id = next_id++;
      outgoing[id] = Outgoing{.pipe = pipe.id()};
    }
    p.head = head;
    const uint64_t total = head.payload();
    int sent = 0;
    bool whole = true;
    auto wait_for = [&](int unacked) {
      std::unique_lock lock(mutex);
      const Outgoing& out = outgoing[id];
      bool ok = changed.wait_for(lock, options.timeout, [&] {
        return stopping || !out.error.empty() || sent - out.acked <= unacked;
      });
      if (!out.error.empty()) {
        why = out.error;
      } else if (stopping) {
        why = "the agent is stopping";
      } else if (!ok) {
        why = "no answer in " + std::to_string(options.timeout.count()) + " ms";
      }
      return why.empty();
    };
    for (uint64_t at = 0; why.empty() && (at < total || sent == 0);) {
      if (!wait_for(kWindow - 1)) {
        break;
      }
      uint64_t n = std::min(options.chunk_bytes, total - at);
      Buffer bytes = chunks->take(n);
      region.read(slot, at, bytes.data(), n);
      p.offset = at;
      at += n;
      p.place = kMore;
      if (at == total) {
        whole = same(region.head(slot), head);
        p.place = whole ? kLast : kVoid;
      }
      Message m{.type = kPut, .id = id, .metadata = p.encode()};
      m.buffers.push_back(std::move(bytes));
      std::string not_sent;
      if (!pipe.send(std::move(m), &not_sent)) {
        why = not_sent;
        break;
      }
      ++sent;
    }
    if (why.empty()) {
      wait_for(0);
    }
    std::lock_guard lock(mutex);
    outgoing.erase(id);
    if (why.empty() && !whole) {
      why = "written over while it was sent";
    }
    return why.empty();
  }

  void send_loop() {
    auto retry_at = Clock::time_point{};
    while (true) {
      std::vector<Request> todo;
      {
        std::unique_lock lock(mutex);
        changed.wait_for(
            lock, kPoll, [&] { return stopping || !requests.empty(); });
        if (stopping) {
          return;
        }
        todo.swap(requests);
      }
      for (const Request& q : todo) {
        serve(q);
      }
      if (Clock::now() >= retry_at && !copy_newest()) {
        retry_at = Clock::now() + kRetry;
      }
    }
  }

  // Sends every snapshot this region holds of the ranks q asks for,
  // newest first, then says it is done.
  void serve(const Request& q) {
    const Layout& l = region.layout();
    std::string error;
    for (int64_t rank : q.ranks) {
      std::vector<std::pair<uint32_t, SlotHead>> held;
      for (uint32_t s = 0; s < l.slots; ++s) {
        SlotHead h = region.head(s);
        if (h.state == kComplete && h.rank == rank) {
          held.emplace_back(s, h);
        }
      }
      std::sort(held.begin(), held.end(), [](const auto& a, const auto& b) {
        return std::tie(a.second.step, a.second.seq) >
               std::tie(b.second.step, b.second.seq);
      });
      for (const auto& [slot, head] : held) {
        std::string why;
        if (!send(
                q.pipe,
                slot,
                head,
                Put{.purpose = kRestore, .fetch = q.id},
                why) &&
            error.empty()) {
          error = "rank " + std::to_string(rank) + " step " +
                  std::to_string(head.step) + ": " + why;
        }
      }
    }
    q.pipe.send(Message{
        .type = kFetched,
        .id = q.id,
        .metadata = FieldWriter().str(error).take()});
  }

  // Copies each local rank's newest snapshot to the peer unless it holds
  // it already; false when the peer could not take one.
  bool copy_newest() {
    int peer_id = 0;
    {
      std::lock_guard lock(mutex);
      auto it = nodes.find(peer);
      if (peer < 0 || it == nodes.end()) {
        return true;
      }
      peer_id = it->second.id;
    }
    const Layout& l = region.layout();
    for (uint32_t local = 0; local < l.local_ranks; ++local) {
      int64_t newest = -1;
      SlotHead head;
      for (uint32_t s = local * l.own; s < (local + 1) * l.own; ++s) {
        SlotHead h = region.head(s);
        if (h.state == kComplete && (newest < 0 || h.seq > head.seq)) {
          newest = s;
          head = h;
        }
      }
      if (newest < 0 || (head.flags & kReplicated) != 0) {
        continue;
      }
      std::string why;
      bool ok = false;
      try {
        ok = send(
            transport->pipe_to(peer_id),
            static_cast<uint32_t>(newest),
            head,
            Put{.purpose = kCopy, .local = local},
            why);
      } catch (const Error& e) {
        why = e.what();
      }
      if (!ok) {
        region.set_peer(false);
        TIDE_LOG_WARN(
            "[checkpoint] the copy of rank {} step {} to node {} failed: {}; "
            "saves no longer wait for it, and it is tried again in {} s",
            head.rank,
            head.step,
            peer,
            why,
            std::chrono::duration_cast<std::chrono::seconds>(kRetry).count());
        return false;
      }
      SlotHead now = region.head(static_cast<uint32_t>(newest));
      if (same(now, head)) {
        region.set_flags(
            static_cast<uint32_t>(newest), now.flags | kReplicated);
      }
      copies.fetch_add(1);
      bytes_copied.fetch_add(head.payload());
      region.set_peer(true);
    }
    return true;
  }
};

PeerCopy::PeerCopy(Region& region, PeerCopyOptions options)
    : impl_(std::make_unique<Impl>(region, std::move(options))) {}

PeerCopy::~PeerCopy() = default;

uint16_t PeerCopy::port() const {
  return impl_->transport->port();
}

int PeerCopy::id() const {
  return impl_->self_id;
}

void PeerCopy::set_round(int self, std::vector<PeerNode> nodes, int peer) {
  Impl& impl = *impl_;
  std::vector<transport::PeerAddress> addresses;
  for (const PeerNode& n : nodes) {
    if (n.rank != self) {
      addresses.push_back(transport::PeerAddress{
          .id = n.id,
          .name = Impl::name(n.id),
          .host = n.host,
          .port = n.port});
    }
  }
  impl.transport->set_peers(std::move(addresses));
  std::lock_guard lock(impl.mutex);
  impl.self_rank = self;
  impl.nodes.clear();
  for (PeerNode& n : nodes) {
    impl.nodes[n.rank] = std::move(n);
  }
  impl.peer = peer;
  impl.region.set_peer(peer >= 0);
}

FetchResult PeerCopy::fetch(const std::map<int64_t, int>& ranks) {
  Impl& impl = *impl_;
  std::vector<uint64_t> wanted;
  for (const auto& [rank, local] : ranks) {
    wanted.push_back(static_cast<uint64_t>(rank));
  }
  uint64_t id = 0;
  std::vector<int> asked;
  {
    std::lock_guard lock(impl.mutex);
    id = impl.next_id++;
    impl.fetches[id] = Impl::Fetch{.ranks = ranks};
    for (const auto& [rank, node] : impl.nodes) {
      if (rank != impl.self_rank) {
        asked.push_back(node.id);
      }
    }
  }
  for (int node : asked) {
    std::string why;
    if (!impl.transport->pipe_to(node).send(
            Message{
                .type = kFetch,
                .id = id,
                .metadata = FieldWriter().u64s(wanted).take()},
            &why)) {
      std::lock_guard lock(impl.mutex);
      impl.fetches[id].answered.insert(node);
      impl.fetches[id].add(impl.transport->peer_label(node) + ": " + why);
    }
  }
  std::unique_lock lock(impl.mutex);
  Impl::Fetch& f = impl.fetches[id];
  if (!impl.changed.wait_for(lock, impl.options.timeout, [&] {
        return f.answered.size() == asked.size();
      })) {
    f.add(
        std::to_string(asked.size() - f.answered.size()) +
        " node(s) did not answer in " +
        std::to_string(impl.options.timeout.count()) + " ms");
  }
  FetchResult result{.error = f.error};
  for (auto& [rank, g] : f.got) {
    result.got.push_back(std::move(g));
  }
  impl.fetches.erase(id);
  return result;
}

PeerCopy::Stats PeerCopy::stats() const {
  return Stats{
      .copies = impl_->copies.load(),
      .bytes_copied = impl_->bytes_copied.load()};
}

}  // namespace tide::checkpoint
