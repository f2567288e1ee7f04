#pragma once

#include <chrono>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tide/agent/worker_spec.h"
#include "tide/rendezvous/registry.h"

#include "support/temp_dir.h"

// A fixture for tests of one agent in this process: a spec on a standalone
// static rendezvous whose logs go in a temporary directory.
namespace tide::test {

class AgentTest : public ::testing::Test {
 protected:
  agent::WorkerSpec spec(agent::Entrypoint e, int nproc = 2) {
    using namespace std::chrono_literals;
    return agent::WorkerSpec{
        .local_world_size = nproc,
        .entrypoint = std::move(e),
        .rdzv_handler = rendezvous::handler_registry().create({
            .backend = "static",
            .endpoint = "127.0.0.1:0",
            .run_id = "test",
        }),
        .max_restarts = 0,
        .log_dir = (dir_ / "logs").string(),
        .shutdown_grace = 5s,
    };
  }

  static agent::Command sh(const std::string& script) {
    return agent::Command{{"/bin/sh", "-c", script}};
  }

  TempDir tmp_;
  const std::filesystem::path dir_ = tmp_.path();
};

}  // namespace tide::test
