// A parameter server on RRefs: an embedding table lives on "ps"; the
// trainers hold an RRef to it and work on it through proxies, never
// copying the table. No libtorch.
//
//   tiderun --standalone --nproc-per-node=3 --no-python
//   build/examples/rref_embedding_server
//
// Rank 0 is "ps" and serves. trainer1 (rank 1) creates the table there with
// remote(), hands the RRef to every other trainer (an RRef argument), and
// trains too. Each trainer pulls rows for its ids, computes a toy gradient
// (the rows themselves: every step pulls them towards zero) and pushes it
// back. trainer1 then reads the table's norm through a proxy and exits 1
// unless training lowered it.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tide/rpc/rpc.h"

namespace {

namespace rpc = tide::rpc;

class EmbeddingTable {
 public:
  EmbeddingTable(int64_t rows, int64_t dim)
      : dim_(dim), data_(static_cast<size_t>(rows * dim)) {
    for (size_t i = 0; i < data_.size(); ++i) {
      data_[i] = static_cast<float>((i * 7919) % 100) / 100.0f;
    }
  }

  std::vector<float> lookup(const std::vector<int64_t>& ids) const {
    std::lock_guard lock(mutex_);
    std::vector<float> out;
    for (int64_t id : ids) {
      auto row = data_.begin() + id * dim_;
      out.insert(out.end(), row, row + dim_);
    }
    return out;
  }

  void update(
      const std::vector<int64_t>& ids,
      const std::vector<float>& grads,
      double lr) {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t d = 0; d < dim_; ++d) {
        data_[static_cast<size_t>(ids[i] * dim_ + d)] -=
            static_cast<float>(lr) * grads[i * static_cast<size_t>(dim_) + d];
      }
    }
  }

  double norm() const {
    std::lock_guard lock(mutex_);
    double s = 0;
    for (float v : data_) {
      s += double{v} * v;
    }
    return std::sqrt(s);
  }

 private:
  int64_t dim_;
  mutable std::mutex mutex_;
  std::vector<float> data_;
};

TIDE_RPC_FUNCTION(make_table, [](int64_t rows, int64_t dim) {
  return std::make_shared<EmbeddingTable>(rows, dim);
});

// The table lives behind a shared_ptr (it holds a mutex): the methods take
// the pointer.
using Table = std::shared_ptr<EmbeddingTable>;
TIDE_RPC_METHOD(Table, lookup, [](Table& t, std::vector<int64_t> ids) {
  return t->lookup(ids);
});
TIDE_RPC_METHOD(
    Table,
    update,
    [](Table& t,
       std::vector<int64_t> ids,
       std::vector<float> grads,
       double lr) { t->update(ids, grads, lr); });
TIDE_RPC_METHOD(Table, norm, [](Table& t) { return t->norm(); });

constexpr int64_t kRows = 64;
constexpr int64_t kSteps = 20;

// What a trainer does with the table: kSteps of pull, gradient, push.
int64_t train(const rpc::RRef<Table>& table, int64_t rank) {
  for (int64_t step = 0; step < kSteps; ++step) {
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < 8; ++k) {
      ids.push_back((rank * 13 + step * 5 + k * 3) % kRows);
    }
    auto rows = table.rpc_sync().call<std::vector<float>>("lookup", ids);
    table.rpc_sync().call<void>("update", ids, rows, 0.1);
  }
  return kSteps;
}

TIDE_RPC_FUNCTION(train, [](rpc::RRef<Table> table, int64_t rank) {
  return train(table, rank);
});

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    std::fprintf(stderr, "%s is not set; run me under tiderun\n", name);
    std::exit(2);
  }
  return std::atoi(v);
}

}  // namespace

int main() {
  int rank = env_int("RANK");
  int world = env_int("WORLD_SIZE");
  rpc::init_rpc(
      rank == 0 ? "ps" : "trainer" + std::to_string(rank), rank, world);
  int status = 0;
  if (rank == 1) {
    auto table = rpc::remote<Table>("ps", "make_table", kRows, int64_t{16});
    double before = table.rpc_sync().call<double>("norm");
    std::vector<tide::Future<int64_t>> others;
    for (int r = 2; r < world; ++r) {
      others.push_back(rpc::rpc_async<int64_t>(
          "trainer" + std::to_string(r), "train", table, int64_t{r}));
    }
    int64_t steps = train(table, 1);
    for (auto& f : others) {
      steps += f.wait(std::chrono::seconds(60));
    }
    double after = table.rpc_sync().call<double>("norm");
    std::printf(
        "%lld steps from %d trainers on one table owned by '%s': norm "
        "%.3f -> %.3f\n",
        static_cast<long long>(steps),
        world - 1,
        table.owner_name().c_str(),
        before,
        after);
    status = after < before ? 0 : 1;
  }
  rpc::shutdown();  // deletes the RRefs, waits until every worker is done
  return status;
}
