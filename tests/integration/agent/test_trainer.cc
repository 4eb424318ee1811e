// A trainer for the agent's integration tests, built on the client library.
// It attaches through the environment (BATON_AGENT_SOCKET, BATON_JOB,
// LOCAL_RANK, LOCAL_WORLD_SIZE, BATON_NODES, ...), runs one scenario, checks
// every result against values computed here, and prints "PASS checks=N" or
// "FAIL ..." lines (exit 1), or "FAILED step=S code=C: message" when an
// operation fails (exit 3).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baton/client.h"
#include "gflags/gflags.h"

DEFINE_string(scenario, "correctness", "correctness | priority | loop");
DEFINE_string(dtypes, "float32,float64,float16,bfloat16,int32,int64,uint8,int8",
              "dtypes of the correctness tensors");
DEFINE_string(counts, "1,p-1,p+1",
              "element counts: N, or p-1 / p+1 (partition_bytes -/+ one "
              "element, one byte for 1-byte types)");
DEFINE_string(big, "",
              "extra float32 tensors (push_pull and broadcast) of this many "
              "MiB (correctness)");
DEFINE_int32(steps, 2, "steps to run");
DEFINE_int32(max_delay_ms, 0, "random delay before each enqueue");
DEFINE_int64(count, 1024, "elements of the loop scenario's tensor");
DEFINE_int32(step_sleep_ms, 0, "sleep between steps (loop scenario)");
DEFINE_bool(retry, false,
            "on ABORTED / UNAVAILABLE / DEADLINE_EXCEEDED, print RETRY, wait "
            "for the next generation, agree with the other ranks on the step "
            "to resume from (rank 0's failed step: a collective that timed "
            "out may have completed on some nodes) and run it again");
DEFINE_int32(kill_coordinator_at_step, -1,
             "rank 0, after this step (loop scenario): SIGKILL the "
             "baton-coordinator that its parent (batonrun) started, and wait "
             "until it is dead");
DEFINE_int32(late_tensor_at_step, -1,
             "from this step on (loop scenario): a second tensor, declared "
             "then, which only a running coordinator can plan");

namespace baton {
namespace {

struct DType {
  const char* name;
  v1::DataType type;
  size_t size;
};
constexpr DType kDTypes[] = {
    {"float32", v1::DATA_TYPE_FLOAT32, 4},
    {"float64", v1::DATA_TYPE_FLOAT64, 8},
    {"float16", v1::DATA_TYPE_FLOAT16, 2},
    {"bfloat16", v1::DATA_TYPE_BFLOAT16, 2},
    {"int32", v1::DATA_TYPE_INT32, 4},
    {"int64", v1::DATA_TYPE_INT64, 8},
    {"uint8", v1::DATA_TYPE_UINT8, 1},
    {"int8", v1::DATA_TYPE_INT8, 1},
    {"int16", v1::DATA_TYPE_INT16, 2},
};

// Small integers, exact in every dtype: float16 and bfloat16 included.
uint16_t FloatToHalf(float f) {
  // Exact for the small integers used here.
  if (f == 0) return 0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
  const uint32_t mantissa = (bits >> 13) & 0x3ff;
  return static_cast<uint16_t>(sign | (exponent << 10) | mantissa);
}
uint16_t FloatToBfloat(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

void Store(v1::DataType type, uint8_t* data, size_t i, int64_t value) {
  switch (type) {
    case v1::DATA_TYPE_FLOAT32: {
      const float f = static_cast<float>(value);
      std::memcpy(data + 4 * i, &f, 4);
      break;
    }
    case v1::DATA_TYPE_FLOAT64: {
      const double d = static_cast<double>(value);
      std::memcpy(data + 8 * i, &d, 8);
      break;
    }
    case v1::DATA_TYPE_FLOAT16: {
      const uint16_t h = FloatToHalf(static_cast<float>(value));
      std::memcpy(data + 2 * i, &h, 2);
      break;
    }
    case v1::DATA_TYPE_BFLOAT16: {
      const uint16_t h = FloatToBfloat(static_cast<float>(value));
      std::memcpy(data + 2 * i, &h, 2);
      break;
    }
    case v1::DATA_TYPE_INT32: {
      const int32_t v = static_cast<int32_t>(value);
      std::memcpy(data + 4 * i, &v, 4);
      break;
    }
    case v1::DATA_TYPE_INT64:
      std::memcpy(data + 8 * i, &value, 8);
      break;
    case v1::DATA_TYPE_UINT8:
      data[i] = static_cast<uint8_t>(value);
      break;
    case v1::DATA_TYPE_INT8:
      data[i] = static_cast<uint8_t>(static_cast<int8_t>(value));
      break;
    case v1::DATA_TYPE_INT16: {
      const int16_t v = static_cast<int16_t>(value);
      std::memcpy(data + 2 * i, &v, 2);
      break;
    }
    default:
      break;
  }
}

// Rank r's input: (i % 5 + 1) * 2 * (r + 1). Sum over W ranks:
// (i % 5 + 1) * W * (W + 1), so the average (i % 5 + 1) * (W + 1) is exact.
int64_t Input(size_t i, int rank) {
  return static_cast<int64_t>(i % 5 + 1) * 2 * (rank + 1);
}

// What a rank must read back, encoded in the dtype (integers wrap and
// truncate like the agent; floats are exact here).
int64_t Expected(v1::DataType type, size_t i, int world, bool average,
                 bool broadcast, int root) {
  if (broadcast) return Input(i, root);
  const int64_t sum = static_cast<int64_t>(i % 5 + 1) * world * (world + 1);
  int64_t wrapped = sum;
  if (type == v1::DATA_TYPE_INT8) wrapped = static_cast<int8_t>(sum);
  if (type == v1::DATA_TYPE_INT16) wrapped = static_cast<int16_t>(sum);
  if (type == v1::DATA_TYPE_UINT8) wrapped = static_cast<uint8_t>(sum);
  if (type == v1::DATA_TYPE_INT32) wrapped = static_cast<int32_t>(sum);
  if (!average) return wrapped;
  return wrapped / world;
}

int checks = 0;
int failures = 0;

void Check(const Tensor& tensor, int world, bool average, bool broadcast,
           int root, int64_t step, int rank, int local_size) {
  const v1::DataType type = tensor.spec().dtype();
  size_t element = 0;
  for (const DType& d : kDTypes) {
    if (d.type == type) element = d.size;
  }
  const size_t n = static_cast<size_t>(tensor.size_bytes()) / element;
  // A broadcast root alone on its node keeps its input as the result; the
  // agent does not write its output region.
  const uint8_t* result = broadcast && rank == root && local_size == 1
                              ? tensor.input()
                              : tensor.output();
  std::vector<uint8_t> want(element);
  for (size_t i = 0; i < n; ++i) {
    Store(type, want.data(), 0,
          Expected(type, i, world, average, broadcast, root));
    if (std::memcmp(want.data(), result + i * element, element) != 0) {
      if (++failures <= 10) {
        std::printf("FAIL tensor=%s step=%" PRId64
                    " element=%zu average=%d broadcast=%d root=%d\n",
                    tensor.spec().name().c_str(), step, i, average, broadcast,
                    root);
      }
      return;
    }
  }
  ++checks;
}

void Fill(const Tensor& tensor, int rank) {
  size_t element = 0;
  for (const DType& d : kDTypes) {
    if (d.type == tensor.spec().dtype()) element = d.size;
  }
  const size_t n = static_cast<size_t>(tensor.size_bytes()) / element;
  for (size_t i = 0; i < n; ++i) {
    Store(tensor.spec().dtype(), tensor.input(), i, Input(i, rank));
  }
}

v1::TensorSpec Spec(const std::string& name, v1::DataType type, int64_t count,
                    v1::CollectiveOp op) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(type);
  spec.add_shape(count);
  spec.set_op(op);
  return spec;
}

[[noreturn]] void Die(const char* what, const absl::Status& status) {
  std::printf("ERROR %s: %s\n", what, std::string(status.message()).c_str());
  std::fflush(stdout);
  std::exit(2);
}

int Failed(int64_t step, const absl::Status& status) {
  std::printf("FAILED step=%" PRId64 " code=%d: %s\n", step,
              static_cast<int>(status.code()),
              std::string(status.message()).c_str());
  std::fflush(stdout);
  return 3;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

// Kills the baton-coordinator among the parent's children and waits (10 s
// at most) until it is a zombie or gone.
void KillCoordinator(int64_t step) {
  const pid_t parent = getppid();
  std::vector<pid_t> found;
  std::ifstream children(
      absl::StrCat("/proc/", parent, "/task/", parent, "/children"));
  pid_t child;
  while (children >> child) {
    // argv[0], up to its NUL.
    std::string argv0 = ReadAll(absl::StrCat("/proc/", child, "/cmdline"));
    argv0 = argv0.substr(0, argv0.find('\0'));
    const size_t slash = argv0.rfind('/');
    if (argv0.substr(slash == std::string::npos ? 0 : slash + 1) ==
        "baton-coordinator") {
      found.push_back(child);
    }
  }
  if (found.size() != 1) {
    Die("--kill_coordinator_at_step",
        absl::NotFoundError(
            absl::StrCat("expected one baton-coordinator child of pid ", parent,
                         " (batonrun), found ", found.size())));
  }
  if (kill(found[0], SIGKILL) != 0) {
    Die("--kill_coordinator_at_step",
        absl::InternalError(std::strerror(errno)));
  }
  const std::string stat = absl::StrCat("/proc/", found[0], "/stat");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    // "PID (COMM) STATE ...": Z once it is dead and not yet reaped.
    const std::string text = ReadAll(stat);
    const size_t paren = text.rfind(") ");
    if (paren == std::string::npos || text[paren + 2] == 'Z') break;
    if (std::chrono::steady_clock::now() > deadline) {
      Die("--kill_coordinator_at_step",
          absl::DeadlineExceededError(
              "the coordinator is alive 10 s after SIGKILL"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::printf("killed the coordinator (pid %d) after step %" PRId64 "\n",
              static_cast<int>(found[0]), step);
  std::fflush(stdout);
}

int Main() {
  absl::StatusOr<ClientOptions> options = ClientOptions::FromEnvironment();
  if (!options.ok()) Die("options", options.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(*options);
  if (!client.ok()) Die("connect", client.status());
  Client& c = **client;
  const int rank = c.rank();
  const int world = c.size();
  std::printf("attached rank=%d size=%d generation=%" PRId64 "\n", rank, world,
              c.generation());
  std::fflush(stdout);
  std::mt19937 rng(static_cast<unsigned>(rank * 7919 + 17));
  const auto delay = [&] {
    if (FLAGS_max_delay_ms <= 0) return;
    std::uniform_int_distribution<int> d(0, FLAGS_max_delay_ms * 1000);
    std::this_thread::sleep_for(std::chrono::microseconds(d(rng)));
  };

  std::vector<v1::TensorSpec> specs;
  if (FLAGS_scenario == "correctness") {
    const int64_t partition =
        options->partition_bytes > 0 ? options->partition_bytes : 4 << 20;
    for (const std::string& dname :
         std::vector<std::string>(absl::StrSplit(FLAGS_dtypes, ','))) {
      const DType* dtype = nullptr;
      for (const DType& d : kDTypes) {
        if (dname == d.name) dtype = &d;
      }
      if (dtype == nullptr) Die("--dtypes", absl::InvalidArgumentError(dname));
      for (const std::string& token :
           std::vector<std::string>(absl::StrSplit(FLAGS_counts, ','))) {
        int64_t count = 0;
        const int64_t p = partition / static_cast<int64_t>(dtype->size);
        if (token == "p-1") {
          count = p - 1;
        } else if (token == "p+1") {
          count = p + 1;
        } else if (!absl::SimpleAtoi(token, &count)) {
          Die("--counts", absl::InvalidArgumentError(token));
        }
        specs.push_back(Spec(std::string("sum.") + dname + "." + token,
                             dtype->type, count, v1::COLLECTIVE_OP_PUSH_PULL));
        specs.push_back(Spec(std::string("bcast.") + dname + "." + token,
                             dtype->type, count, v1::COLLECTIVE_OP_BROADCAST));
      }
    }
    int64_t big_mib = 0;
    if (!FLAGS_big.empty() && absl::SimpleAtoi(FLAGS_big, &big_mib)) {
      specs.push_back(Spec("sum.float32.big", v1::DATA_TYPE_FLOAT32,
                           big_mib << 18, v1::COLLECTIVE_OP_PUSH_PULL));
      specs.push_back(Spec("bcast.float32.big", v1::DATA_TYPE_FLOAT32,
                           big_mib << 18, v1::COLLECTIVE_OP_BROADCAST));
    }
  } else if (FLAGS_scenario == "priority") {
    // Declared first: the most urgent.
    specs.push_back(Spec("urgent", v1::DATA_TYPE_FLOAT32, 256,
                         v1::COLLECTIVE_OP_PUSH_PULL));
    specs.push_back(Spec("large", v1::DATA_TYPE_FLOAT32, FLAGS_count,
                         v1::COLLECTIVE_OP_PUSH_PULL));
  } else {
    specs.push_back(Spec("loop", v1::DATA_TYPE_FLOAT32, FLAGS_count,
                         v1::COLLECTIVE_OP_PUSH_PULL));
  }
  auto tensors = c.Declare(specs);
  if (!tensors.ok()) Die("declare", tensors.status());
  // --retry: rank 0's failed step, broadcast after each failure.
  std::shared_ptr<Tensor> resume;
  int64_t resumes = 0;
  if (FLAGS_retry) {
    auto declared = c.Declare(
        {Spec("resume", v1::DATA_TYPE_INT64, 1, v1::COLLECTIVE_OP_BROADCAST)});
    if (!declared.ok()) Die("declare resume", declared.status());
    resume = declared->front();
  }
  // The step every rank resumes from after `failed_step` failed here in
  // `failed_generation`; a failure meanwhile waits for the next generation
  // and agrees again, a few times at most.
  const auto agree_on_resume =
      [&](int64_t failed_step,
          int64_t failed_generation) -> absl::StatusOr<int64_t> {
    for (int attempt = 0; attempt < 5; ++attempt) {
      auto next =
          c.WaitForGeneration(failed_generation, std::chrono::minutes(2));
      if (!next.ok()) return next.status();
      std::memcpy(resume->input(), &failed_step, sizeof(failed_step));
      auto handle = c.BroadcastAsync(*resume, resumes++, 0);
      if (!handle.ok()) return handle.status();
      const absl::Status status = (*handle)->Wait(std::chrono::minutes(2));
      if (status.ok()) {
        int64_t agreed = failed_step;
        if (c.rank() != 0) {
          std::memcpy(&agreed, resume->output(), sizeof(agreed));
        }
        return agreed;
      }
      std::printf("RETRY resume code=%d: %s\n", static_cast<int>(status.code()),
                  std::string(status.message()).c_str());
      std::fflush(stdout);
      failed_generation = (*handle)->generation();
    }
    return absl::DeadlineExceededError("no agreement on the step to resume");
  };

  for (int64_t step = 0; step < FLAGS_steps; ++step) {
    std::vector<std::shared_ptr<Handle>> handles;
    std::vector<std::shared_ptr<Tensor>> order;
    const bool average = step % 2 == 1;
    const int root = static_cast<int>(step % world);
    if (FLAGS_scenario == "priority") {
      // The large, least urgent tensor first; the urgent one while the large
      // one's partitions are on the wire. Soon after: on loopback the TCP
      // rings move the large one's 32 MiB in 10-20 ms, and a 20 ms pause
      // let it finish first now and then.
      Fill(*(*tensors)[1], rank);
      Fill(*(*tensors)[0], rank);
      auto large = c.PushPullAsync(*(*tensors)[1], step, false);
      if (!large.ok()) return Failed(step, large.status());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      auto urgent = c.PushPullAsync(*(*tensors)[0], step, false);
      if (!urgent.ok()) return Failed(step, urgent.status());
      handles = {*large, *urgent};
      order = {(*tensors)[1], (*tensors)[0]};
    } else {
      if (FLAGS_scenario == "loop" && step == FLAGS_late_tensor_at_step) {
        auto late = c.Declare({Spec("late", v1::DATA_TYPE_FLOAT32, FLAGS_count,
                                    v1::COLLECTIVE_OP_PUSH_PULL)});
        if (!late.ok()) Die("declare late", late.status());
        tensors->insert(tensors->end(), late->begin(), late->end());
      }
      // Backward order: the last declared tensor is ready first.
      for (auto it = tensors->rbegin(); it != tensors->rend(); ++it) {
        const Tensor& t = **it;
        Fill(t, rank);
        delay();
        const bool broadcast = t.spec().op() == v1::COLLECTIVE_OP_BROADCAST;
        const bool avg = FLAGS_scenario == "correctness" && average;
        auto handle = broadcast ? c.BroadcastAsync(t, step, root)
                                : c.PushPullAsync(t, step, avg);
        if (!handle.ok()) return Failed(step, handle.status());
        handles.push_back(*handle);
        order.push_back(*it);
      }
    }
    bool retry = false;
    int64_t failed_generation = 0;
    for (size_t i = 0; i < handles.size(); ++i) {
      absl::Status status = handles[i]->Wait(std::chrono::minutes(5));
      const bool retryable =
          status.code() == absl::StatusCode::kAborted ||
          status.code() == absl::StatusCode::kUnavailable ||
          status.code() == absl::StatusCode::kDeadlineExceeded;
      if (FLAGS_retry && retryable) {
        std::printf("RETRY step=%" PRId64 " code=%d: %s\n", step,
                    static_cast<int>(status.code()),
                    std::string(status.message()).c_str());
        std::fflush(stdout);
        retry = true;
        failed_generation =
            std::max(failed_generation, handles[i]->generation());
        continue;
      }
      if (!status.ok()) return Failed(step, status);
      const Tensor& t = *order[i];
      const bool broadcast = t.spec().op() == v1::COLLECTIVE_OP_BROADCAST;
      const bool avg = FLAGS_scenario == "correctness" && average;
      Check(t, world, avg, broadcast, root, step, c.rank(), c.local_size());
    }
    if (retry) {
      // The next generation may already be there: wait for one newer than
      // the generation the step failed in, not the current one.
      auto agreed = agree_on_resume(step, failed_generation);
      if (!agreed.ok()) return Failed(step, agreed.status());
      step = *agreed - 1;
      continue;
    }
    if (FLAGS_scenario == "loop") {
      std::printf("step %" PRId64 " ok generation=%" PRId64 "\n", step,
                  handles[0]->generation());
      std::fflush(stdout);
      if (step == FLAGS_kill_coordinator_at_step && rank == 0) {
        KillCoordinator(step);
      }
      if (FLAGS_step_sleep_ms > 0) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(FLAGS_step_sleep_ms));
      }
    }
  }
  absl::Status detached = c.Detach(/*finished=*/true);
  if (!detached.ok()) Die("detach", detached);
  if (failures > 0) {
    std::printf("FAIL failures=%d checks=%d\n", failures, checks);
    return 1;
  }
  std::printf("PASS checks=%d\n", checks);
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return baton::Main();
}
