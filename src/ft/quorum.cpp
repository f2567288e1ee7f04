#include "tide/ft/quorum.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/etcd/etcd_store.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

#include "net/address.h"

namespace tide::ft {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr char kPending[] = "pending";
constexpr char kDead[] = "dead";
constexpr char kChanges[] = "changes";
constexpr char kCurrent[] = "current";

std::string round_key(int64_t round, const char* what) {
  return "round/" + std::to_string(round) + "/" + what;
}

// A round's outcome, as round/R/done holds it.
struct Decision {
  bool commit = false;
  int64_t changes = 0;
  std::string why;

  static std::string commit_text(int64_t changes) {
    return "commit " + std::to_string(changes);
  }
  static std::string abort_text(int64_t changes, const std::string& why) {
    return "abort " + std::to_string(changes) + " " + why;
  }

  static Decision parse(const std::string& text) {
    std::istringstream in(text);
    std::string word;
    Decision d;
    if (!(in >> word >> d.changes) || (word != "commit" && word != "abort")) {
      throw ProtocolError(
          "a round's outcome must read 'commit N' or 'abort N why', not '" +
          text.substr(0, 80) + "'");
    }
    d.commit = word == "commit";
    std::getline(in >> std::ws, d.why);
    return d;
  }
};

// round/R/quorum: who takes part from round R on, and their steps.
struct Record {
  int64_t round = 0;
  int64_t changes = 0;
  std::vector<QuorumMember> members;
  // Who proposed it: of several who propose the same members at once, one
  // record wins, and its writer alone admits the joiners.
  std::string by;

  std::string encode() const {
    json m = json::array();
    for (const auto& x : members) {
      m.push_back({{"id", x.id}, {"ranks", x.ranks}, {"step", x.step}});
    }
    return json{
        {"round", round}, {"changes", changes}, {"members", m}, {"by", by}}
        .dump();
  }

  static Record parse(const std::string& text, int64_t round) {
    try {
      json j = json::parse(text);
      Record r{
          .round = j.at("round").get<int64_t>(),
          .changes = j.at("changes").get<int64_t>(),
          .by = j.value("by", "")};
      for (const auto& m : j.at("members")) {
        r.members.push_back(QuorumMember{
            .id = m.at("id").get<std::string>(),
            .ranks = m.at("ranks").get<int>(),
            .step = m.at("step").get<int64_t>()});
      }
      if (r.round != round) {
        throw ProtocolError("it names round " + std::to_string(r.round));
      }
      return r;
    } catch (const std::exception& e) {
      throw ProtocolError(
          "the quorum record of round " + std::to_string(round) +
          " is not one tide wrote (" + e.what() + ")");
    }
  }

  bool has(const std::string& id) const {
    return std::any_of(members.begin(), members.end(), [&](const auto& m) {
      return m.id == id;
    });
  }
  int64_t max_step() const {
    int64_t s = 0;
    for (const auto& m : members) {
      s = std::max(s, m.step);
    }
    return s;
  }
};

// Lines "id\tfield..." of an append-only key, by id (the last line wins).
std::map<std::string, std::vector<std::string>> lines(const std::string& v) {
  std::map<std::string, std::vector<std::string>> out;
  std::istringstream in(v);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::istringstream f(line);
    for (std::string x; std::getline(f, x, '\t');) {
      fields.push_back(x);
    }
    if (!fields.empty() && !fields[0].empty()) {
      out[fields[0]] =
          std::vector<std::string>(fields.begin() + 1, fields.end());
    }
  }
  return out;
}

int64_t bump_changes(store::Store& store) {
  int64_t c = store.add(kChanges, 1);
  store.set("change/" + std::to_string(c), "");
  return c;
}

// Decides round r as aborted unless it is decided already; returns its
// outcome. Whoever waits for the round's members to meet is woken too.
std::string abort_round(
    store::Store& store, int64_t r, int64_t changes, const std::string& why) {
  std::string mine = Decision::abort_text(changes, why);
  std::string got = store.compare_set(round_key(r, "done"), "", mine);
  if (got == mine) {
    store.compare_set(round_key(r, "met"), "", "aborted");
  }
  return got;
}

// The first round at or after `from` without an outcome. Rounds are
// decided in order, so this probes forward by doubling, then bisects.
int64_t first_undecided(store::Store& store, int64_t from) {
  auto decided = [&](int64_t r) { return store.check({round_key(r, "done")}); };
  if (!decided(from)) {
    return from;
  }
  int64_t lo = from;  // decided
  int64_t hi = from + 1;
  while (decided(hi)) {
    lo = hi;
    hi = from + 2 * (hi - from);
  }
  while (hi - lo > 1) {  // lo decided, hi not
    int64_t mid = lo + (hi - lo) / 2;
    (decided(mid) ? lo : hi) = mid;
  }
  return hi;
}

void check_name(const std::string& what, const std::string& s) {
  bool ok = !s.empty() && s.size() <= 128 &&
            std::all_of(s.begin(), s.end(), [](char c) {
              return std::isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                     c == '_' || c == '-';
            });
  if (!ok) {
    throw InvalidArgument(
        "a replica group's " + what +
        " must be 1 to 128 letters, digits, "
        "'.', '_' or '-', not '" +
        s + "'");
  }
}

// The options, checked (before anything connects).
QuorumOptions checked(QuorumOptions o) {
  if (o.group_world_size < 1 || o.group_rank < 0 ||
      o.group_rank >= o.group_world_size) {
    throw InvalidArgument(
        "group rank " + std::to_string(o.group_rank) +
        " is not in a group of " + std::to_string(o.group_world_size));
  }
  if (o.min_replica_size < 1 || o.expected_groups < 1) {
    throw InvalidArgument(
        "min_replica_size and expected_groups must be at least 1");
  }
  if (o.heartbeat_interval.count() <= 0 ||
      o.heartbeat_timeout <= o.heartbeat_interval || o.timeout.count() <= 0) {
    throw InvalidArgument(
        "the heartbeat interval must be positive and below its timeout, "
        "and the timeout positive");
  }
  return o;
}

}  // namespace

std::string QuorumClient::member_id(
    const std::string& group, const std::string& incarnation) {
  check_name("id", group);
  check_name("incarnation", incarnation);
  return group + ":" + incarnation;
}

void QuorumClient::declare_dead(
    store::Store& store, const std::string& member, const std::string& why) {
  std::string reason = why.empty() ? "out" : why;
  std::replace(reason.begin(), reason.end(), '\n', ' ');
  store.append(kDead, member + "\t" + reason + "\n");
  int64_t c = bump_changes(store);
  if (!store.check({kCurrent})) {
    return;  // no quorum yet: nobody waits for it
  }
  int64_t current = std::stoll(store.get(kCurrent));
  if (!Record::parse(store.get(round_key(current, "quorum")), current)
           .has(member)) {
    return;
  }
  // Abort the round it is in: its votes will not come. A round decided
  // before this death was seen is followed by one with it still in, so go
  // on until a round's decider saw the death (the next round's members are
  // decided again) or a quorum without it is reached.
  std::string why_out = member + " is out: " + reason;
  for (int64_t r = first_undecided(store, current);; ++r) {
    if (r != current && store.check({round_key(r, "quorum")}) &&
        !Record::parse(store.get(round_key(r, "quorum")), r).has(member)) {
      return;
    }
    std::string got = abort_round(store, r, c, why_out);
    if (got == Decision::abort_text(c, why_out)) {
      return;
    }
    Decision d = Decision::parse(got);
    if (!d.commit || d.changes >= c) {
      return;
    }
  }
}

struct QuorumClient::Impl {
  std::shared_ptr<store::Store> store;
  std::shared_ptr<store::Store> beats;  // the heartbeat's
  QuorumOptions options;
  std::string me;

  // The training loop's (one thread).
  std::optional<Record> record;  // the quorum in force
  int64_t round = -1;
  bool decided = true;     // the round's outcome is known
  Decision last;           // of the round before the next
  int64_t step = 0;        // this process's own
  int64_t round_step = 0;  // the up-to-date members' step in this round

  // Shared with the heartbeat.
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::string watched;  // the member after this one in the quorum
  std::jthread heartbeat;

  Impl(const Connect& connect, QuorumOptions o, int64_t start_step)
      : options(checked(std::move(o))),
        me(member_id(options.group, options.incarnation)),
        step(start_step) {
    if (start_step < 0) {
      throw InvalidArgument("a step cannot be negative");
    }
    store = connect();
    store->set_timeout(options.timeout);
    // The vote is an add_wait: a store without it (a torch server) is
    // named now, not at the first step's vote.
    store->add_wait(kChanges, 0, 0, kChanges);
    store->append(kPending, "");
    store->append(kDead, "");
    if (options.group_rank == 0) {
      beats = connect();
      // No one request may hold the beat for long: an etcd member that
      // lost its leader keeps a request up to 7 s before failing it, longer
      // than a neighbour waits; bounded, the next member is tried.
      beats->set_timeout(
          std::max(options.heartbeat_interval, options.heartbeat_timeout / 4));
      heartbeat = std::jthread([this] { beat(); });
    }
  }

  ~Impl() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    wake.notify_all();
  }

  // --- the heartbeat's thread ---

  void beat() {
    std::string target;
    int64_t seen = -1;
    Clock::time_point since = Clock::now();
    // When this process's own last beat got through. A store that did not
    // take its beats for a while (etcd electing a leader, a client moving
    // to another member) did not take the neighbour's either: silence is
    // counted only from the end of such a gap.
    Clock::time_point beat_ok = since;
    std::unique_lock lock(mutex);
    while (!stopping) {
      std::string now_watched = watched;
      lock.unlock();
      try {
        beats->add("hb/" + me, 1);
        auto now = Clock::now();
        if (now - beat_ok > options.heartbeat_timeout / 2) {
          since = now;
        }
        beat_ok = now;
        if (now_watched != target) {
          target = now_watched;
          seen = -1;
        }
        if (!target.empty()) {
          int64_t v = beats->add("hb/" + target, 0);
          if (v != seen) {
            seen = v;
            since = Clock::now();
          } else if (Clock::now() - since > options.heartbeat_timeout) {
            auto ms = std::chrono::duration_cast<milliseconds>(
                options.heartbeat_timeout);
            TIDE_LOG_WARN(
                "replica group member {}: no heartbeat for {} ms; it is out",
                target,
                ms.count());
            declare_dead(
                *beats,
                target,
                "no heartbeat for " + std::to_string(ms.count()) + " ms");
            target.clear();
            lock.lock();
            if (watched == now_watched) {
              watched.clear();
            }
            lock.unlock();
          }
        }
      } catch (const std::exception& e) {
        TIDE_LOG_WARN("replica group heartbeat: {}", e.what());
      }
      lock.lock();
      wake.wait_for(lock, options.heartbeat_interval, [&] { return stopping; });
    }
  }

  // --- the training loop's ---

  Quorum start_quorum() {
    if (!decided) {
      throw InvalidArgument(
          "start_quorum() called again before should_commit() decided round " +
          std::to_string(round));
    }
    if (!record) {
      join();
    } else if (last.commit && last.changes == record->changes) {
      ++round;  // the same members: a fast quorum
    } else {
      adopt(propose(round + 1, true));
    }
    decided = false;
    return view();
  }

  bool should_commit(bool ok) {
    if (decided) {
      throw InvalidArgument("should_commit() called without start_quorum()");
    }
    std::string done = round_key(round, "done");
    int total = 0;
    for (const auto& m : record->members) {
      total += m.ranks;
    }
    int groups = static_cast<int>(record->members.size());
    if (!ok || groups < options.min_replica_size) {
      std::string why =
          !ok ? me + " rank " + std::to_string(options.group_rank) + " voted no"
              : "only " + std::to_string(groups) + " groups of the " +
                    std::to_string(options.min_replica_size) + " needed";
      abort_round(*store, round, record->changes, why);
    }
    // One request: the vote, answered with the outcome. The vote that
    // completes the count gets none yet and decides (unless an abort won).
    // The rounds of one quorum record count on one counter: a round
    // commits only once all its votes are in, and the round after an
    // abort has a record of its own, so round k of the record is complete
    // at (k + 1) x total, and no counter is left behind per round.
    std::string votes = round_key(record->round, "votes");
    int64_t complete = (round - record->round + 1) * total;
    std::string outcome = store->add_wait(votes, 1, complete, done).value;
    if (outcome.empty()) {
      outcome = store->compare_set(
          done, "", Decision::commit_text(store->add(kChanges, 0)));
    }
    last = Decision::parse(outcome);
    decided = true;
    if (last.commit) {
      step = std::max(step, round_step) + 1;
      round_step += 1;
    }
    return last.commit;
  }

  bool meet() {
    if (decided) {
      throw InvalidArgument("meet() called without start_quorum()");
    }
    int total = 0;
    for (const auto& m : record->members) {
      total += m.ranks;
    }
    std::string met = round_key(round, "met");
    std::string outcome =
        store->add_wait(round_key(round, "arrived"), 1, total, met).value;
    if (outcome.empty()) {
      outcome = store->compare_set(met, "", "all");
    }
    return outcome == "all";
  }

  // Waits to be admitted to a quorum: proposes one when none is alive.
  void join() {
    int64_t seen = 0;
    if (options.group_rank == 0) {
      store->append(
          kPending,
          me + "\t" + std::to_string(options.group_world_size) + "\t" +
              std::to_string(step) + "\n");
      seen = bump_changes(*store);
    }
    auto start = Clock::now();
    auto give_up = start + options.join_timeout + options.timeout;
    std::string admit = "admit/" + me;
    while (Clock::now() < give_up) {
      if (store->check({admit})) {
        std::string v = store->get(admit);
        if (v.rfind("refused", 0) == 0) {
          throw InvalidArgument("replica group " + me + " was " + v);
        }
        int64_t r = std::stoll(v);
        adopt(Record::parse(store->get(round_key(r, "quorum")), r));
        return;
      }
      milliseconds wait = options.heartbeat_timeout;
      if (options.group_rank == 0) {
        if (!store->check({kCurrent})) {
          if (ready_to_form(start)) {
            adopt_if_member(propose(0, false));
            if (record) {
              return;
            }
          }
          // Until a change (a join, a death) or the join timeout.
          wait = std::chrono::duration_cast<milliseconds>(std::max(
              Clock::duration::zero(),
              start + options.join_timeout - Clock::now()));
          wait_for_change(seen, wait);
          seen = store->add(kChanges, 0);
          continue;
        }
        int64_t current = std::stoll(store->get(kCurrent));
        Record q =
            Record::parse(store->get(round_key(current, "quorum")), current);
        auto dead = lines(store->get(kDead));
        bool alive =
            std::any_of(q.members.begin(), q.members.end(), [&](const auto& m) {
              return !dead.contains(m.id);
            });
        if (!alive) {
          // Every member is out: end their round and start anew.
          int64_t r = first_undecided(*store, current);
          abort_round(
              *store, r, store->add(kChanges, 0), "every member is out");
          adopt_if_member(propose(r + 1, false));
          if (record) {
            return;
          }
        }
      }
      try {
        store->wait({admit}, std::min(wait, options.heartbeat_timeout));
      } catch (const TimeoutError&) {
        // look again: the quorum's members may be out by now
      }
    }
    throw TimeoutError(
        "replica group " + me + " was not admitted to a quorum within " +
        std::to_string(std::chrono::duration_cast<milliseconds>(
                           options.join_timeout + options.timeout)
                           .count()) +
        " ms");
  }

  // The first quorum forms once every expected group asked to join, or,
  // after the join timeout, once min_replica_size did.
  bool ready_to_form(Clock::time_point start) {
    auto pending = lines(store->get(kPending));
    auto dead = lines(store->get(kDead));
    int alive = 0;
    for (const auto& [id, _] : pending) {
      alive += dead.contains(id) ? 0 : 1;
    }
    return alive >= options.expected_groups ||
           (Clock::now() - start >= options.join_timeout &&
            alive >= options.min_replica_size);
  }

  void wait_for_change(int64_t seen, milliseconds wait) {
    try {
      store->wait({"change/" + std::to_string(seen + 1)}, wait);
    } catch (const TimeoutError&) {
    }
  }

  // Decides round r's members (or reads who did): the members before it
  // (with_previous) and those that asked to join, less those that are out.
  Record propose(int64_t r, bool with_previous) {
    int64_t changes = store->add(kChanges, 0);
    auto pending = lines(store->get(kPending));
    auto dead = lines(store->get(kDead));
    Record next{.round = r, .changes = changes, .by = me};
    std::vector<std::string> joiners;
    std::vector<std::pair<std::string, std::string>> refused;
    if (with_previous) {
      for (const auto& m : record->members) {
        if (!dead.contains(m.id)) {
          next.members.push_back({m.id, m.ranks, round_step});
        }
      }
    }
    for (const auto& [id, f] : pending) {
      if (dead.contains(id) || next.has(id) || f.size() < 2) {
        continue;
      }
      QuorumMember m{
          .id = id, .ranks = std::stoi(f[0]), .step = std::stoll(f[1])};
      if (with_previous && !next.members.empty() && m.step > round_step) {
        refused.emplace_back(
            id,
            "refused: it claims step " + std::to_string(m.step) +
                " but the quorum is at step " + std::to_string(round_step));
        continue;
      }
      next.members.push_back(m);
      joiners.push_back(id);
    }
    std::sort(next.members.begin(), next.members.end(), [](auto& a, auto& b) {
      return a.id < b.id;
    });
    std::string text = next.encode();
    std::string got = store->compare_set(round_key(r, "quorum"), "", text);
    Record won = Record::parse(got, r);
    if (got != text) {
      return won;
    }
    for (const auto& [id, why] : refused) {
      TIDE_LOG_WARN("replica group member {} {}", id, why);
      store->set("admit/" + id, why);
      store->append(kDead, id + "\t" + why + "\n");
    }
    for (const auto& id : joiners) {
      store->set("admit/" + id, std::to_string(r));
    }
    store->set(kCurrent, std::to_string(r));
    // A member declared out after this record was read, and before
    // `current` named it, is not seen by the one that declared it: abort
    // its round here.
    auto now_dead = lines(store->get(kDead));
    for (const auto& m : won.members) {
      if (now_dead.contains(m.id)) {
        abort_round(
            *store,
            r,
            store->add(kChanges, 0),
            m.id + " is out: " + now_dead[m.id][0]);
        break;
      }
    }
    TIDE_LOG_INFO(
        "replica groups: round {} has {} members ({} joined)",
        r,
        won.members.size(),
        joiners.size());
    return won;
  }

  void adopt_if_member(Record r) {
    if (r.has(me)) {
      adopt(std::move(r));
    }
  }

  void adopt(Record r) {
    if (!r.has(me)) {
      auto dead = lines(store->get(kDead));
      std::string why = dead.contains(me) && !dead[me].empty()
                            ? dead[me][0]
                            : "it is not among the members";
      throw Error(
          "replica group " + me + " is out of the quorum of round " +
          std::to_string(r.round) + " (" + why +
          "); it must start again as a new incarnation");
    }
    round = r.round;
    round_step = r.max_step();
    record = std::move(r);
    std::lock_guard lock(mutex);
    const auto& ms = record->members;
    auto it =
        std::find_if(ms.begin(), ms.end(), [&](auto& m) { return m.id == me; });
    auto next = std::next(it) == ms.end() ? ms.begin() : std::next(it);
    watched = next->id == me ? "" : next->id;
  }

  Quorum view() const {
    Quorum q{
        .id = record->round,
        .round = round,
        .members = record->members,
        .replica_world_size = static_cast<int>(record->members.size()),
        .max_step = round_step,
        .step = step,
        .store_prefix = "pg/" + std::to_string(record->round) + "/"};
    // In the round its record was written for, a member below the step of
    // the others heals from one of them, spread round-robin (later rounds
    // of the quorum have everyone up to date).
    std::vector<int> up;
    for (int i = 0; i < q.replica_world_size; ++i) {
      if (q.members[i].id == me) {
        q.replica_rank = i;
      }
      if (record->round != round || q.members[i].step >= round_step) {
        up.push_back(i);
      }
    }
    for (int i = 0; i < q.replica_world_size && !up.empty(); ++i) {
      if (record->round != round || q.members[i].step >= round_step) {
        continue;
      }
      int from = up[static_cast<size_t>(i) % up.size()];
      if (i == q.replica_rank) {
        q.heal_from = q.members[from].id;
        q.heal_from_rank = from;
      }
      if (from == q.replica_rank) {
        q.heal_to.push_back(i);
      }
    }
    return q;
  }
};

QuorumClient::QuorumClient(
    const Connect& connect, QuorumOptions options, int64_t step)
    : impl_(std::make_unique<Impl>(connect, std::move(options), step)) {}

QuorumClient::~QuorumClient() = default;

Quorum QuorumClient::start_quorum() {
  return impl_->start_quorum();
}

bool QuorumClient::meet() {
  return impl_->meet();
}

bool QuorumClient::should_commit(bool ok) {
  return impl_->should_commit(ok);
}

int64_t QuorumClient::step() const {
  return impl_->step;
}

void QuorumClient::healed(int64_t step) {
  impl_->step = step;
}

void QuorumClient::leave(const std::string& why) {
  declare_dead(*impl_->store, impl_->me, "left: " + why);
}

std::shared_ptr<store::Store> connect_quorum_store(
    const std::string& address, milliseconds timeout) {
  std::string_view rest = address;
  bool etcd = rest.starts_with("etcd:");
  if (etcd) {
    rest.remove_prefix(5);
  }
  std::string job = "default";
  if (auto slash = rest.find('/'); slash != std::string_view::npos) {
    job = std::string(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
    check_name("job (after the '/' of the store's address)", job);
  }
  if (rest.empty()) {
    throw InvalidArgument(
        "a replica groups' store is HOST:PORT[/JOB] or "
        "etcd:HOST:PORT[,HOST:PORT...][/JOB], not '" +
        address + "'");
  }
  std::string prefix = "tide_ft/" + job;
  if (etcd) {
    return std::make_shared<etcd::EtcdStore>(
        std::string(rest), prefix, timeout);
  }
  net::HostPort hp = net::parse_host_port(rest);
  return std::make_shared<store::PrefixStore>(
      prefix,
      std::make_shared<store::TcpStore>(store::TcpStoreOptions{
          .host = hp.host,
          .port = hp.port,
          .dialect = store::Dialect::kModern,
          .timeout = timeout}));
}

}  // namespace tide::ft
