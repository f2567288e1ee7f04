#include "rpc/rrefs.h"

#include <algorithm>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "common/demangle.h"
#include "rpc/extensions.h"
#include "rpc/messages.h"
#include "rpc_core/retry.h"

// The books and the protocol's steps; the control functions' handlers and
// RRef<T>'s non-template side are in rref_api.cpp.
namespace tide::rpc::detail {

namespace {

using std::chrono::milliseconds;

// The arguments of the control functions: two ids (or one, for accept),
// encoded as an rpc argument pack so that the functions are ordinary ones.
std::string id_args(const RRefId& a) {
  std::string out;
  Encoder e(out);
  encode_args(e, a.worker, a.local);
  return out;
}
std::string id_args(const RRefId& a, const RRefId& b) {
  std::string out;
  Encoder e(out);
  encode_args(e, a.worker, a.local, b.worker, b.local);
  return out;
}

// tide.rref.create's payload: fn's, with the RRef's ids and fn's name
// (read_creation) between the autograd context (which stays first) and
// fn's arguments.
Payload creation(Payload call, RRefId id, RRefId fork, const std::string& fn) {
  Decoder d(call.data.view());
  read_autograd_ids(d);
  std::string data(call.data.view().substr(0, d.offset()));
  Encoder e(data);
  encode_args(e, id.worker, id.local, fork.worker, fork.local, fn);
  data.append(call.data.view().substr(d.offset()));
  call.data = Buffer(std::move(data));
  return call;
}

bool is_retryable(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError&) {
    return true;
  } catch (const NetworkError&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace
RRefNode::~RRefNode() {
  if (!books) {
    return;
  }
  if (entry) {
    books->handle_gone(*this);
  } else {
    books->user_gone(*this);
  }
}

RRefBooks::RRefBooks(
    int self,
    int world_size,
    Calls& calls,
    NameOf name_of,
    milliseconds rpc_timeout)
    : self_(self),
      calls_(calls),
      name_of_(std::move(name_of)),
      rpc_timeout_(rpc_timeout),
      world_size_(world_size) {}

RRefBooks::~RRefBooks() {
  close();
}

RpcAgent& RRefBooks::agent() {
  std::lock_guard lock(mutex_);
  if (closed_ || agent_ == nullptr) {
    throw NetworkError(
        "the rpc agent of worker '" + name_of(self_) + "' is shut down");
  }
  return *agent_;
}

Creation read_creation(Decoder& d) {
  auto [iw, il, fw, fl, fn] =
      decode_args<std::tuple<int32_t, int64_t, int32_t, int64_t, std::string>>(
          d, kCreate);
  return Creation{RRefId{iw, il}, RRefId{fw, fl}, std::move(fn)};
}

MessageContext RRefBooks::context(int peer) {
  if (peer < 0 || peer >= world_size_) {
    throw InvalidArgument("no rpc worker with id " + std::to_string(peer));
  }
  return MessageContext{.books = this, .peer = peer};
}

RRefId RRefBooks::new_id() {
  return RRefId{self_, next_local_.fetch_add(1)};
}

std::exception_ptr RRefBooks::owner_lost(int owner, const RRefId& id) {
  return std::make_exception_ptr(OwnerLostError(
      "RRef " + id.str() + ": its owner, worker '" + name_of(owner) + "' (id " +
      std::to_string(owner) + "), was lost"));
}

std::exception_ptr RRefBooks::as_owner_lost(
    std::exception_ptr error, int owner, const RRefId& id) {
  return error && is_lost(owner) ? owner_lost(owner, id) : error;
}

bool RRefBooks::is_lost(int peer) {
  std::lock_guard lock(mutex_);
  return lost_.contains(peer);
}

std::shared_ptr<OwnerEntry> RRefBooks::entry_for(
    const RRefId& id, bool create) {
  std::lock_guard lock(mutex_);
  if (create) {
    return entry_locked(id)->second;
  }
  auto it = owners_.find(id);
  return it != owners_.end() ? it->second : nullptr;
}

std::map<RRefId, std::shared_ptr<OwnerEntry>>::iterator RRefBooks::entry_locked(
    const RRefId& id) {
  auto [it, made] = owners_.try_emplace(id);
  if (made) {
    it->second = std::make_shared<OwnerEntry>(id);
  }
  return it;
}

void RRefBooks::own(RRefNode& node, const std::shared_ptr<OwnerEntry>& entry) {
  node.entry = entry;
  ++entry->local_handles;
  owners_.emplace(entry->id, entry);
}

void RRefBooks::handle_gone(RRefNode& node) {
  std::shared_ptr<OwnerEntry> gone;
  std::lock_guard lock(mutex_);
  --node.entry->local_handles;
  if (auto it = owners_.find(node.id);
      it != owners_.end() && it->second == node.entry) {
    gone = release_if_unused(it);
  }
}

std::shared_ptr<OwnerEntry> RRefBooks::release_if_unused(
    std::map<RRefId, std::shared_ptr<OwnerEntry>>::iterator it) {
  const OwnerEntry& e = *it->second;
  if (!e.forks.empty() || e.creating || e.local_handles > 0) {
    return nullptr;
  }
  auto entry = std::move(it->second);
  owners_.erase(it);
  return entry;
}

void RRefBooks::on_arrival(
    int caller, const std::string& fn, const Payload& args) {
  if (fn != kCreate) {
    return;
  }
  Decoder d(args.data.view());
  read_autograd_ids(d);
  Creation c = read_creation(d);
  add_fork(c.id, c.fork, caller);
}

std::shared_ptr<OwnerEntry> RRefBooks::add_fork(
    const RRefId& id, const RRefId& fork, int holder) {
  std::lock_guard lock(mutex_);
  auto it = entry_locked(id);
  if (holder != self_) {
    // A retried request finds its fork there already.
    it->second->forks.emplace(fork, holder);
  }
  return it->second;
}

void RRefBooks::del_fork(const RRefId& id, const RRefId& fork, int caller) {
  std::shared_ptr<OwnerEntry> gone;
  {
    std::lock_guard lock(mutex_);
    auto it = owners_.find(id);
    auto held = it == owners_.end() ? std::map<RRefId, int>::iterator()
                                    : it->second->forks.find(fork);
    if (it != owners_.end() && held != it->second->forks.end() &&
        held->second != caller) {
      // Only the fork's holder may give it up.
      throw InvalidArgument(
          "worker " + std::to_string(caller) + " asked to delete fork " +
          fork.str() + " of RRef " + id.str() + ", which worker " +
          std::to_string(held->second) + " holds");
    }
    if (it == owners_.end() || held == it->second->forks.end()) {
      TIDE_LOG_DEBUG(
          "[{}] ignoring a repeated delete of RRef {} fork {}",
          name_of(self_),
          id.str(),
          fork.str());
      return;
    }
    it->second->forks.erase(held);
    gone = release_if_unused(it);
  }
  // The value may go with it, outside the lock.
}

void RRefBooks::child_accepted(const RRefId& fork, int caller) {
  RRefPtr parent;
  {
    std::lock_guard lock(mutex_);
    auto it = pending_children_.find(fork);
    if (it != pending_children_.end() && it->second.to != caller) {
      throw InvalidArgument(
          "worker " + std::to_string(caller) + " accepted fork " + fork.str() +
          ", which was sent to worker " + std::to_string(it->second.to));
    }
    if (it == pending_children_.end()) {
      TIDE_LOG_DEBUG(
          "[{}] ignoring a repeated accept of fork {}",
          name_of(self_),
          fork.str());
      return;
    }
    parent = std::move(it->second.parent);
    pending_children_.erase(it);
  }
  settled_cv_.notify_all();
}

void RRefBooks::confirm_user(const RRefId& fork, std::exception_ptr error) {
  RRefPtr node;
  {
    std::lock_guard lock(mutex_);
    auto it = pending_users_.find(fork);
    if (it == pending_users_.end()) {
      return;
    }
    node = std::move(it->second);
    pending_users_.erase(it);
    if (error && !node->error) {
      node->error = error;
    }
    if (!closed_) {
      confirmed_users_[fork] = node;
    }
  }
  settled_cv_.notify_all();
  if (error) {
    node->confirmation.set_exception(error);
  } else {
    node->confirmation.set_value();
  }
  // The last reference may go here, outside the lock: it sends the delete.
}

// --- control messages with retries -----------------------------------------

Future<void> RRefBooks::control(int to, std::string fn, std::string args) {
  std::weak_ptr<RRefBooks> weak = weak_from_this();
  auto attempt = [weak, to, fn, args]() -> Future<void> {
    auto books = weak.lock();
    if (!books || books->closed()) {
      return Future<void>::make_failed(
          std::make_exception_ptr(NetworkError("the rpc agent is shut down")));
    }
    Payload p;
    p.data = Buffer(std::string(args));
    return books->calls_.start(to, fn, books->rpc_timeout_, std::move(p))
        .then([](const Payload&) {});
  };
  auto again = [weak, to](const std::exception_ptr& error) {
    auto books = weak.lock();
    return books && !books->closed() && is_retryable(error) &&
           !books->is_lost(to);
  };
  auto on_retry = [weak, to, fn](int, std::chrono::milliseconds pause) {
    if (auto books = weak.lock()) {
      books->retries_.fetch_add(1);
      TIDE_LOG_DEBUG(
          "[{}] retrying {} to worker {} in {} ms",
          books->name_of(books->self()),
          fn,
          to,
          pause.count());
    }
  };
  return rpc_core::retry(
      calls_.transport(), std::move(attempt), std::move(again), on_retry);
}

bool RRefBooks::closed() {
  std::lock_guard lock(mutex_);
  return closed_;
}

// --- a user's side -----------------------------------------------------------

RRefPtr RRefBooks::local(Value value) {
  auto node = std::make_shared<RRefNode>();
  node->books = shared_from_this();
  node->id = new_id();
  node->owner = self_;
  node->type = std::string(value.type->name);
  auto entry = std::make_shared<OwnerEntry>(node->id);
  entry->promise.set_value(std::move(value));
  node->confirmation.set_value();
  std::lock_guard lock(mutex_);
  own(*node, entry);
  return node;
}

RRefPtr RRefBooks::start_remote(
    int to,
    const std::string& fn,
    milliseconds timeout,
    Payload args,
    const ValueType* type) {
  auto node = std::make_shared<RRefNode>();
  node->books = shared_from_this();
  node->id = new_id();
  node->owner = to;
  node->type = std::string(type->name);
  RRefId fork;
  if (to == self_) {
    // The owner's handle; the books keep the entry until the call returns.
    auto entry = std::make_shared<OwnerEntry>(node->id);
    entry->creating = true;
    node->confirmation.set_value();
    fork = node->id;
    std::lock_guard lock(mutex_);
    own(*node, entry);
  } else {
    fork = new_id();
    node->fork = fork;
    std::lock_guard lock(mutex_);
    if (lost_.contains(to)) {
      node->error = owner_lost(to, node->id);
      node->deleted = true;
      node->confirmation.set_exception(node->error);
      return node;
    }
    pending_users_.emplace(fork, node);
  }
  std::weak_ptr<RRefBooks> weak = weak_from_this();
  RRefId id = node->id;
  calls_
      .start(
          to,
          std::string(kCreate),
          timeout,
          creation(std::move(args), id, fork, fn),
          fn)
      .on_complete([weak, to, id, fork](const Future<Payload>& f) {
        auto books = weak.lock();
        if (!books) {
          return;
        }
        if (to == books->self_) {
          std::shared_ptr<OwnerEntry> gone;
          std::lock_guard lock(books->mutex_);
          if (auto it = books->owners_.find(id); it != books->owners_.end()) {
            it->second->creating = false;
            gone = books->release_if_unused(it);
          }
          return;
        }
        auto error = books->as_owner_lost(f.error(), to, id);
        books->confirm_user(fork, error);
      });
  return node;
}

void RRefBooks::check_usable(const RRefNode& node) {
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    error = node.error;
    if (!error && node.owner != self_ && lost_.contains(node.owner)) {
      error = owner_lost(node.owner, node.id);
    }
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

Future<Payload> RRefBooks::call_owner(
    const RRefPtr& node,
    const std::string& fn,
    milliseconds timeout,
    Payload args) {
  try {
    check_usable(*node);
  } catch (...) {
    return Future<Payload>::make_failed(std::current_exception());
  }
  if (timeout.count() <= 0) {
    timeout = rpc_timeout_;
  }
  std::weak_ptr<RRefBooks> weak = weak_from_this();
  int owner = node->owner;
  RRefId id = node->id;
  Promise<Payload> result;
  Future<Payload> out = result.get_future();
  calls_.start(owner, fn, timeout, std::move(args))
      .on_complete([weak, owner, id, result](const Future<Payload>& f) mutable {
        if (auto error = f.error()) {
          if (auto books = weak.lock()) {
            error = books->as_owner_lost(error, owner, id);
          }
          result.set_exception(error);
        } else {
          result.set_value(f.wait(milliseconds(0)));
        }
      });
  return out;
}

void RRefBooks::user_gone(RRefNode& node) {
  RRefId id = node.id;
  RRefId fork = node.fork;
  int owner = node.owner;
  {
    std::lock_guard lock(mutex_);
    confirmed_users_.erase(fork);
    if (node.deleted || closing_ || closed_ || lost_.contains(owner)) {
      return;
    }
    node.deleted = true;
  }
  control(owner, "tide.rref.delete", id_args(id, fork))
      .on_complete([](const Future<void>& f) {
        if (auto e = f.error()) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& x) {
            TIDE_LOG_DEBUG("an RRef delete was not acknowledged: {}", x.what());
          }
        }
      });
}

// --- passing RRefs
// -------------------------------------------------------------

void RRefBooks::write(Encoder& e, const RRefPtr& node) {
  const MessageContext* wire = e.context();
  if (wire == nullptr || wire->books != this) {
    throw InvalidArgument(
        "an RRef can be sent only in a call of the agent it belongs to");
  }
  check_usable(*node);
  RRefId fork = new_id();
  {
    std::lock_guard lock(mutex_);
    if (node->entry) {
      // Early registration: the owner knows the fork before it travels.
      node->entry->forks.emplace(fork, wire->peer);
    } else {
      pending_children_.emplace(fork, Child{node, wire->peer});
    }
  }
  e.write_tag(Tag::kRRef);
  e.write_fixed<int32_t>(node->owner);
  e.write_fixed<int32_t>(node->id.worker);
  e.write_fixed<int64_t>(node->id.local);
  e.write_fixed<int32_t>(fork.worker);
  e.write_fixed<int64_t>(fork.local);
  e.write_fixed<int32_t>(self_);  // the parent
  e.write_varint(node->type.size());
  e.write_raw(node->type.data(), node->type.size());
}

RRefPtr RRefBooks::read(Decoder& d, const ValueType* want) {
  Tag t = d.read_tag();
  if (t != Tag::kRRef) {
    d.mismatch("rref", t);
  }
  int owner = d.read_fixed<int32_t>();
  RRefId id{d.read_fixed<int32_t>(), d.read_fixed<int64_t>()};
  RRefId fork{d.read_fixed<int32_t>(), d.read_fixed<int64_t>()};
  int parent = d.read_fixed<int32_t>();
  std::string type(d.read_raw(d.read_count("an RRef's type", 1)));
  int n = world_size_;
  if (owner < 0 || owner >= n || parent < 0 || parent >= n) {
    d.fail("an RRef names a worker outside the group");
  }
  if (type != want->name) {
    // Refused: the fork must not stay registered, nor its parent wait.
    if (parent == owner) {
      control(owner, "tide.rref.delete", id_args(id, fork));
    } else {
      control(parent, "tide.rref.accept", id_args(fork));
    }
    d.fail(
        "expected RRef<" + std::string(want->name) + ">, got RRef<" + type +
        ">");
  }
  auto node = std::make_shared<RRefNode>();
  node->books = shared_from_this();
  node->id = id;
  node->owner = owner;
  node->type = std::move(type);
  if (owner == self_) {
    // Back at its owner: a handle on the entry, and no fork of its own.
    std::shared_ptr<OwnerEntry> gone;
    {
      std::lock_guard lock(mutex_);
      auto it = owners_.find(id);
      if (it == owners_.end()) {
        d.fail("RRef " + id.str() + " is unknown on its owner");
      }
      own(*node, it->second);
      if (parent == self_) {
        it->second->forks.erase(fork);
        gone = release_if_unused(it);
      }
    }
    node->confirmation.set_value();
    if (parent != self_) {
      control(parent, "tide.rref.accept", id_args(fork));
    }
    return node;
  }
  node->fork = fork;
  if (parent == owner) {
    // The owner registered the fork before sending it.
    node->confirmation.set_value();
    std::lock_guard lock(mutex_);
    confirmed_users_[fork] = node;
    return node;
  }
  {
    std::lock_guard lock(mutex_);
    pending_users_.emplace(fork, node);
  }
  if (ArgumentWaits* waits = d.context()->waits; waits != nullptr) {
    waits->add(node->confirmed);
  }
  std::weak_ptr<RRefBooks> weak = weak_from_this();
  control(owner, "tide.rref.fork", id_args(id, fork))
      .on_complete([weak, owner, id, fork, parent](const Future<void>& f) {
        auto books = weak.lock();
        if (!books) {
          return;
        }
        auto error = books->as_owner_lost(f.error(), owner, id);
        books->confirm_user(fork, error);
        if (!error) {
          books->control(parent, "tide.rref.accept", id_args(fork));
        }
      });
  return node;
}

// --- lost peers, reports, shutdown -------------------------------------------

void RRefBooks::peer_lost(int peer, const std::string& reason) {
  std::vector<RRefPtr> failed;
  std::vector<std::shared_ptr<OwnerEntry>> gone;
  std::vector<Child> orphans;
  {
    std::lock_guard lock(mutex_);
    if (closed_ || peer == self_ || !lost_.insert(peer).second) {
      return;
    }
    for (auto it = owners_.begin(); it != owners_.end();) {
      auto& forks = it->second->forks;
      std::erase_if(forks, [peer](const auto& f) { return f.second == peer; });
      auto next = std::next(it);
      if (auto e = release_if_unused(it)) {
        gone.push_back(std::move(e));
      }
      it = next;
    }
    for (auto it = pending_users_.begin(); it != pending_users_.end();) {
      if (it->second->owner == peer) {
        failed.push_back(std::move(it->second));
        it = pending_users_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = pending_children_.begin(); it != pending_children_.end();) {
      if (it->second.to == peer || it->second.parent->owner == peer) {
        orphans.push_back(std::move(it->second));
        it = pending_children_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& node : failed) {
      node->error = owner_lost(peer, node->id);
      node->deleted = true;
    }
  }
  settled_cv_.notify_all();
  for (auto& node : failed) {
    node->confirmation.set_exception(node->error);
  }
  TIDE_LOG_INFO(
      "[{}] worker '{}' lost ({}): {} RRef value(s) it alone used freed here, "
      "{} of its RRefs failed",
      name_of(self_),
      name_of(peer),
      reason,
      gone.size(),
      failed.size());
}

RRefReport RRefBooks::report() {
  RRefReport r;
  r.control_retries = retries_.load();
  std::lock_guard lock(mutex_);
  for (const auto& [id, entry] : owners_) {
    RRefReport::Owned o;
    o.id = id;
    o.ready = entry->value.ready();
    if (o.ready && !entry->value.error()) {
      o.type = std::string(entry->value.wait(milliseconds(0)).type->name);
    }
    for (const auto& [fork, holder] : entry->forks) {
      o.users.emplace_back(fork, name_of(holder));
    }
    r.owned.push_back(std::move(o));
  }
  auto held = [&](const RRefNode& n, bool confirmed) {
    r.held.push_back(
        RRefReport::Held{n.id, n.fork, name_of(n.owner), n.type, confirmed});
  };
  for (const auto& [fork, node] : pending_users_) {
    held(*node, false);
  }
  for (const auto& [fork, weak] : confirmed_users_) {
    if (auto node = weak.lock()) {
      held(*node, true);
    }
  }
  for (const auto& [fork, child] : pending_children_) {
    r.passing.emplace_back(fork, name_of(child.to));
  }
  return r;
}

std::vector<std::string> RRefBooks::delete_all(milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::vector<std::string> unfinished;
  std::vector<RRefPtr> users;
  {
    std::unique_lock lock(mutex_);
    settled_cv_.wait_until(lock, deadline, [this] {
      return pending_users_.empty() && pending_children_.empty();
    });
    for (const auto& [fork, node] : pending_users_) {
      unfinished.push_back(
          "RRef " + node->id.str() + " fork " + fork.str() +
          " still unconfirmed by its owner '" + name_of(node->owner) + "'");
    }
    for (const auto& [fork, child] : pending_children_) {
      unfinished.push_back(
          "fork " + fork.str() + " passed to '" + name_of(child.to) +
          "' still unaccepted");
    }
    for (auto& [fork, weak] : confirmed_users_) {
      if (auto node = weak.lock(); node && !node->deleted) {
        node->deleted = true;
        users.push_back(std::move(node));
      }
    }
    confirmed_users_.clear();
    closing_ = true;
  }
  std::vector<std::pair<Future<void>, std::string>> acks;
  for (const auto& node : users) {
    if (is_lost(node->owner)) {
      continue;
    }
    acks.emplace_back(
        control(node->owner, "tide.rref.delete", id_args(node->id, node->fork)),
        "RRef " + node->id.str() + " fork " + node->fork.str() + " on '" +
            name_of(node->owner) + "'");
  }
  for (auto& [ack, what] : acks) {
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    try {
      ack.wait(std::max(left, milliseconds(0)));
    } catch (const std::exception& e) {
      unfinished.push_back("delete of " + what + " failed: " + e.what());
    }
  }
  return unfinished;
}

std::vector<std::string> RRefBooks::leaks() {
  std::vector<std::string> out;
  std::lock_guard lock(mutex_);
  for (const auto& [id, entry] : owners_) {
    for (const auto& [fork, holder] : entry->forks) {
      out.push_back(
          "owned RRef " + id.str() + " still has fork " + fork.str() +
          " held by '" + name_of(holder) + "'");
    }
  }
  for (const auto& [fork, node] : pending_users_) {
    out.push_back(
        "RRef " + node->id.str() + " fork " + fork.str() +
        " never confirmed by '" + name_of(node->owner) + "'");
  }
  for (const auto& [fork, child] : pending_children_) {
    out.push_back(
        "fork " + fork.str() + " passed to '" + name_of(child.to) +
        "' never accepted");
  }
  return out;
}

void RRefBooks::close() {
  std::map<RRefId, std::shared_ptr<OwnerEntry>> owners;
  std::map<RRefId, RRefPtr> users;
  std::map<RRefId, Child> children;
  {
    std::lock_guard lock(mutex_);
    if (closed_) {
      return;
    }
    closed_ = true;
    owners.swap(owners_);
    users.swap(pending_users_);
    children.swap(pending_children_);
    confirmed_users_.clear();
  }
  settled_cv_.notify_all();
  for (auto& [fork, node] : users) {
    node->deleted = true;
  }
}

}  // namespace tide::rpc::detail
