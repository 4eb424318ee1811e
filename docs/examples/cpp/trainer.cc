// A data-parallel C++ trainer on baton::Session, written the way a Horovod or
// BytePS user writes one: initialize from the launcher's environment,
// broadcast the initial parameters from rank 0, average the gradients over
// every rank before each update, shut down.
//
// The model is a linear regression y = x . w + b fitted by SGD to the mean
// squared error; each rank holds its own synthetic shard of the data. Rank 0
// prints the loss (averaged over ranks) and, at the end, the learned
// parameters and the job as the coordinator reports it. Start it with
// batonrun (one command line):
//
//   build/bin/batonrun --nodes 2 --procs-per-node 2 --job ex --
//       build/bin/baton-example-trainer
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "baton/job_status.h"
#include "baton/session.h"
#include "baton/status_format.h"
#include "gflags/gflags.h"

DEFINE_int32(steps, 60, "SGD steps");
DEFINE_int32(samples, 256, "samples in each rank's shard");
DEFINE_double(learning_rate, 0.1, "SGD learning rate");

namespace {

constexpr int kDim = 8;

baton::Buffer FloatBuffer(std::vector<float>& values) {
  return {values.data(),
          baton::v1::DATA_TYPE_FLOAT32,
          {static_cast<int64_t>(values.size())}};
}

// The model's parameters (and, with the same layout, their gradients).
struct Parameters {
  std::vector<float> w = std::vector<float>(kDim);
  std::vector<float> b = std::vector<float>(1);
};

// This rank's samples of y = x . w_true + b_true + noise.
class Shard {
 public:
  Shard(int samples, const Parameters& truth, std::mt19937& rng)
      : x_(samples * kDim), y_(samples) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int i = 0; i < samples; ++i) {
      y_[i] = truth.b[0] + 0.01f * normal(rng);
      for (int d = 0; d < kDim; ++d) {
        x_[i * kDim + d] = normal(rng);
        y_[i] += x_[i * kDim + d] * truth.w[d];
      }
    }
  }

  // The gradient of the mean squared error at `p` on this shard; returns
  // the error itself.
  float Gradient(const Parameters& p, Parameters& gradient) const {
    const int samples = static_cast<int>(y_.size());
    gradient = Parameters();
    float squared_error = 0;
    for (int i = 0; i < samples; ++i) {
      float error = p.b[0] - y_[i];
      for (int d = 0; d < kDim; ++d) error += x_[i * kDim + d] * p.w[d];
      squared_error += error * error;
      for (int d = 0; d < kDim; ++d) {
        gradient.w[d] += 2 * error * x_[i * kDim + d] / samples;
      }
      gradient.b[0] += 2 * error / samples;
    }
    return squared_error / samples;
  }

 private:
  std::vector<float> x_;
  std::vector<float> y_;
};

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "example trainer: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  return 3;
}

// The job as the coordinator at BATON_COORDINATOR (batonrun sets it)
// reports it, once it counts every step.
void PrintJobStatus() {
  const char* address = std::getenv("BATON_COORDINATOR");
  const char* job = std::getenv("BATON_JOB");
  if (address == nullptr || job == nullptr) return;
  absl::StatusOr<baton::v1::JobStatus> status =
      baton::FetchJobStatus(address, job, FLAGS_steps - 1);
  if (!status.ok()) {
    std::fprintf(stderr, "example trainer: %s\n",
                 status.status().ToString().c_str());
    return;
  }
  std::printf("\n%s", baton::FormatJob(*status, absl::Now()).c_str());
}

int Train() {
  absl::StatusOr<std::unique_ptr<baton::Session>> init = baton::Session::Init();
  if (!init.ok()) {
    std::fprintf(stderr, "example trainer: %s\n",
                 init.status().ToString().c_str());
    return 2;
  }
  baton::Session& session = **init;
  const int rank = session.rank();
  if (rank == 0) {
    std::printf(
        "%d ranks, %d per node; fitting y = x.w + b by SGD, gradients "
        "averaged with push-pull\n",
        session.size(), session.local_size());
  }

  Parameters truth;
  for (int d = 0; d < kDim; ++d) truth.w[d] = 0.5f * (d + 1) - 2.0f;
  truth.b[0] = 0.75f;
  std::mt19937 rng(1234 + rank);
  const Shard shard(FLAGS_samples, truth, rng);

  // Every rank starts from rank 0's random parameters.
  Parameters p;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : p.w) v = normal(rng);
  p.b[0] = normal(rng);
  absl::Status status = session.BroadcastParameters(
      {{"w", FloatBuffer(p.w)}, {"b", FloatBuffer(p.b)}}, /*root_rank=*/0);
  if (!status.ok()) return Fail("broadcasting the parameters", status);

  const float learning_rate = static_cast<float>(FLAGS_learning_rate);
  for (int64_t step = 0; step < FLAGS_steps; ++step) {
    Parameters gradient;
    std::vector<float> loss = {shard.Gradient(p, gradient)};
    // Start all three, then synchronize: they travel together.
    std::vector<std::pair<std::string, baton::Buffer>> averaged = {
        {"Gradient.w", FloatBuffer(gradient.w)},
        {"Gradient.b", FloatBuffer(gradient.b)},
        {"Loss", FloatBuffer(loss)}};
    std::vector<baton::OperationHandle> handles;
    for (const auto& [name, buffer] : averaged) {
      absl::StatusOr<baton::OperationHandle> handle =
          session.PushPullAsync(name, buffer, /*average=*/true);
      if (!handle.ok()) {
        return Fail("step " + std::to_string(step), handle.status());
      }
      handles.push_back(*handle);
    }
    for (const baton::OperationHandle& handle : handles) {
      status = session.Synchronize(handle, std::chrono::minutes(1));
      if (!status.ok()) return Fail("step " + std::to_string(step), status);
    }
    for (int d = 0; d < kDim; ++d) p.w[d] -= learning_rate * gradient.w[d];
    p.b[0] -= learning_rate * gradient.b[0];
    if (rank == 0 && (step % 10 == 0 || step == FLAGS_steps - 1)) {
      std::printf("step %3" PRId64 "  loss (mean over ranks) %.6f\n", step,
                  loss[0]);
    }
  }

  if (rank == 0) {
    std::printf("\nlearned w:");
    for (float v : p.w) std::printf(" %6.3f", v);
    std::printf("   b: %.3f\n   true w:", p.b[0]);
    for (float v : truth.w) std::printf(" %6.3f", v);
    std::printf("   b: %.3f\n", truth.b[0]);
    PrintJobStatus();
  }
  std::fflush(stdout);
  status = session.Shutdown();
  if (!status.ok()) return Fail("shutting down", status);
  // Every rank holds the same parameters; they must be near the truth.
  float worst = std::abs(p.b[0] - truth.b[0]);
  for (int d = 0; d < kDim; ++d) {
    worst = std::max(worst, std::abs(p.w[d] - truth.w[d]));
  }
  if (worst > 0.05f) {
    std::fprintf(stderr,
                 "example trainer: rank %d's parameters are %.3f off the "
                 "truth after %" PRId64 " steps\n",
                 rank, worst, static_cast<int64_t>(FLAGS_steps));
    return 4;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "a data-parallel linear regression on baton::Session; start it with "
      "batonrun");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return Train();
}
