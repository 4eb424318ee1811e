// What a trainer can send its agent: TrainerRequests on up to four trainer
// streams, and the raw bytes of each trainer's shared-memory request ring
// (head, tail and entries: the trainer maps the ring read-write, so it can
// write anything there). They go through what the agent runs on them before
// acting: JobTrainers (attach, declare, detach, the channels it drains),
// TensorEnqueue's conversions and ValidateEnqueue, with the job's waiting
// operations modelled as JobOperations keeps them (an operation completes
// once every local rank enqueued it). No agent, gRPC or data plane runs.
//
// Input: a world-size byte (0: no generation sealed), then actions:
//   0: request   stream byte, 2 length bytes, that many bytes of TrainerRequest
//   1: ring      stream byte, mode byte, head (8), tail (8), entry count,
//                32 bytes per entry: written raw into the stream's request
//                ring (mode bit 0 clear) or pushed as a producer would
//                (set), then the job drains every ring
//   2: drain     the job drains every ring
//
// Invariants: an accepted enqueue names a declared tensor and a step past the
// rank's last one of it (the rest of the agent indexes by them); a drain pops
// at most one ring's capacity per trainer, and nothing from a ring whose tail
// is more than its capacity ahead of its head (no producer following the
// protocol makes one), whose trainer's stream is closed instead.

#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/agent_config.h"
#include "agent/enqueue_validation.h"
#include "agent/gpu_support.h"
#include "agent/job_trainers.h"
#include "agent/links.h"
#include "agent/tensor_enqueue.h"
#include "baton/v1/trainer.pb.h"
#include "common/shm.h"
#include "common/shm_channel.h"
#include "common/tensor_spec.h"
#include "tests/fuzz/fuzz_input.h"

namespace baton::agent {
namespace {

using fuzz::FuzzInput;

constexpr int kStreams = 4;
constexpr int kMaxActions = 64;
// Host tensors get shared memory of (local_size + 1) regions, reserved with
// posix_fallocate: keep what one input may reserve small.
constexpr int64_t kMaxShmBytes = int64_t{4} << 20;

// The ring's layout is the protocol between two processes
// (common/shm_channel.h): head, tail, entries, each on its own cache line.
constexpr size_t kHeadOffset = 0;
constexpr size_t kTailOffset = 64;
constexpr size_t kEntriesOffset = 128;
static_assert(sizeof(ChannelRing) ==
              kEntriesOffset + ChannelRing::kCapacity * sizeof(ChannelEntry));

[[noreturn]] void Broken(const std::string& what) {
  fuzz::Broken("trainer_protocol_fuzz", what);
}

class NullSink : public TrainerSink {
 public:
  void Send(v1::TrainerEvent) override {}
  void Close(absl::Status) override { closed = true; }
  bool closed = false;
};

struct Stream {
  std::shared_ptr<NullSink> sink = std::make_shared<NullSink>();
  int32_t rank = -1;  // -1: not attached
  bool ended = false;
};

// The operation of a tensor waiting for more local ranks.
struct Waiting {
  int64_t step = 0;
  std::vector<bool> present;
};

int64_t AlignedRegion(int64_t bytes) {
  return (std::max<int64_t>(bytes, 1) + 4095) / 4096 * 4096;
}

class Driver {
 public:
  explicit Driver(int32_t world_size)
      : world_size_(world_size),
        prefix_(absl::StrCat("/baton-fuzz.", getpid(), ".", ++runs_, ".")) {
    auto doorbell =
        SharedMemory::Create(prefix_ + "db", sizeof(Doorbell), std::nullopt);
    if (!doorbell.ok()) Broken(std::string(doorbell.status().message()));
    doorbell_ = std::move(*doorbell);
    new (doorbell_.data()) Doorbell();
    trainers_ = std::make_unique<JobTrainers>("job", config_, gpus_, prefix_,
                                              &doorbell_);
  }
  ~Driver() {
    trainers_.reset();
    SharedMemory::Unlink(doorbell_.name()).IgnoreError();
  }

  void Run(FuzzInput& in) {
    for (int n = 0; n < kMaxActions && !in.empty(); ++n) {
      switch (in.Below(3)) {
        case 0: {
          Stream& stream = streams_[in.Below(kStreams)];
          const size_t length = static_cast<size_t>(in.Int(2)) % 4096;
          std::string bytes;
          for (size_t i = 0; i < length && !in.empty(); ++i) {
            bytes.push_back(static_cast<char>(in.Byte()));
          }
          v1::TrainerRequest request;
          if (request.ParseFromString(bytes)) Dispatch(stream, request);
          break;
        }
        case 1:
          WriteRing(streams_[in.Below(kStreams)], in);
          Drain();
          break;
        default:
          Drain();
          break;
      }
    }
  }

 private:
  // As TrainerService's reactor and AgentJob hand requests to the job.
  void Dispatch(Stream& stream, v1::TrainerRequest& request) {
    if (stream.ended) return;
    const uint64_t seq = request.seq();
    if (stream.rank < 0) {
      if (!request.has_attach()) {
        stream.ended = true;
        return;
      }
      // The job takes attaches until every local rank attached (and again
      // for the place of one that was lost).
      const bool attaching =
          trainers_->size() == 0 || !trainers_->all_attached();
      const absl::Status status =
          trainers_->Attach(stream.sink, request.attach(), attaching);
      if (status.ok()) {
        stream.rank = request.attach().local_rank();
      } else {
        stream.ended = true;
      }
      return;
    }
    switch (request.body_case()) {
      case v1::TrainerRequest::kDeclare:
        Declare(stream, seq, request.declare());
        break;
      case v1::TrainerRequest::kEnqueue:
        Enqueue(stream.rank, TensorEnqueue::FromRequest(request.enqueue()));
        break;
      case v1::TrainerRequest::kDetach:
        if (request.detach().finished()) {
          trainers_->Detach(stream.rank);
        } else {
          trainers_->Lose(stream.rank);
        }
        stream.ended = true;
        break;
      default:
        break;
    }
  }

  void Declare(Stream& stream, uint64_t seq,
               const v1::DeclareRequest& request) {
    // Reserve little shared memory: a valid spec too large to map here is
    // only checked, not declared.
    for (const v1::TensorSpec& spec : request.tensors()) {
      if (!ValidateTensorSpec("fuzz", spec).ok()) continue;
      if (AlignedRegion(TensorSizeBytes(spec)) * (trainers_->local_size() + 1) >
          kMaxShmBytes) {
        return;
      }
    }
    trainers_->Declare(stream.rank, seq, request, [this](int32_t index) {
      auto it = waiting_.find(index);
      return it != waiting_.end() ? it->second.step
                                  : trainers_->tensor(index).last_step[0] + 1;
    });
  }

  // As JobOperations::Enqueue records what ValidateEnqueue accepted.
  void Enqueue(int32_t rank, const TensorEnqueue& e) {
    auto it = waiting_.find(e.index);
    WaitingEnqueue waiting;
    if (it != waiting_.end()) {
      waiting.step = it->second.step;
      waiting.rank_present = it->second.present[rank];
    }
    const absl::Status status =
        ValidateEnqueue(*trainers_, rank, e,
                        it != waiting_.end() ? &waiting : nullptr, world_size_);
    if (!status.ok()) return;
    if (e.index < 0 || e.index >= trainers_->tensor_count() ||
        e.index >= trainers_->trainer(rank).declared || e.step < 0 ||
        e.step <= trainers_->tensor(e.index).last_step[rank]) {
      Broken(absl::StrCat("enqueue of index ", e.index, " step ", e.step,
                          " by local rank ", rank, " was accepted"));
    }
    LocalTensor& tensor = trainers_->tensor(e.index);
    tensor.last_step[rank] = e.step;
    if (it == waiting_.end()) {
      it = waiting_.emplace(e.index, Waiting{e.step, {}}).first;
      it->second.present.assign(trainers_->local_size(), false);
    }
    it->second.present[rank] = true;
    for (bool present : it->second.present) {
      if (!present) return;
    }
    for (int32_t r = 0; r < trainers_->local_size(); ++r) {
      trainers_->Completed(r, e.step);
    }
    waiting_.erase(it);
  }

  void WriteRing(Stream& stream, FuzzInput& in) {
    const uint8_t mode = in.Byte();
    const auto head = static_cast<uint64_t>(in.Int(8));
    const auto tail = static_cast<uint64_t>(in.Int(8));
    const int count = static_cast<int>(in.Below(9));
    if (stream.rank < 0 || stream.ended) return;
    const JobTrainers::Trainer& trainer = trainers_->trainer(stream.rank);
    if (trainer.mapping == nullptr) return;
    ChannelRing& ring = trainer.mapping->channel->requests;
    auto* raw = reinterpret_cast<unsigned char*>(&ring);
    if ((mode & 1) == 0) {
      std::memcpy(raw + kHeadOffset, &head, sizeof head);
      std::memcpy(raw + kTailOffset, &tail, sizeof tail);
    }
    for (int i = 0; i < count; ++i) {
      ChannelEntry entry;
      unsigned char bytes[sizeof(ChannelEntry)];
      for (unsigned char& b : bytes) b = in.Byte();
      std::memcpy(&entry, bytes, sizeof entry);
      if ((mode & 1) != 0) {
        ring.Push(entry);
      } else {
        std::memcpy(raw + kEntriesOffset +
                        ((head + i) % ChannelRing::kCapacity) * sizeof entry,
                    &entry, sizeof entry);
      }
    }
  }

  void Drain() {
    // What each ring holds before: a ring whose tail is more than its
    // capacity ahead gives nothing.
    std::vector<uint64_t> allowed(trainers_->size(), 0);
    for (int32_t r = 0; r < trainers_->size(); ++r) {
      const JobTrainers::Trainer& trainer = trainers_->trainer(r);
      if (trainer.mapping == nullptr) continue;
      const auto* raw = reinterpret_cast<const unsigned char*>(
          &trainer.mapping->channel->requests);
      uint64_t head = 0;
      uint64_t tail = 0;
      std::memcpy(&head, raw + kHeadOffset, sizeof head);
      std::memcpy(&tail, raw + kTailOffset, sizeof tail);
      allowed[r] = tail - head <= ChannelRing::kCapacity ? tail - head : 0;
    }
    std::vector<uint64_t> popped(trainers_->size(), 0);
    trainers_->DrainChannels([&](int32_t rank, const TensorEnqueue& e) {
      if (++popped[rank] > allowed[rank]) {
        Broken(absl::StrCat("local rank ", rank, "'s request ring gave ",
                            popped[rank], " entries; it held ", allowed[rank]));
      }
      if (!e.via_channel) Broken("an entry of a ring is not via_channel");
      Enqueue(rank, e);
    });
    for (int32_t r = 0; r < trainers_->size(); ++r) {
      const JobTrainers::Trainer& trainer = trainers_->trainer(r);
      if (trainer.detached || trainer.mapping == nullptr ||
          !trainer.mapping->channel->requests.Corrupt()) {
        continue;
      }
      const auto* sink = dynamic_cast<const NullSink*>(trainer.sink.get());
      if (sink == nullptr || !sink->closed) {
        Broken(absl::StrCat("local rank ", r,
                            "'s request ring is corrupt and its stream open"));
      }
    }
  }

  static inline int runs_ = 0;
  const int32_t world_size_;
  const std::string prefix_;
  AgentConfig config_;
  GpuSupport gpus_;
  SharedMemory doorbell_;
  std::unique_ptr<JobTrainers> trainers_;
  Stream streams_[kStreams];
  std::map<int32_t, Waiting> waiting_;
};

}  // namespace
}  // namespace baton::agent

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  baton::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::fuzz::FuzzInput in(data, size);
  baton::agent::Driver driver(static_cast<int32_t>(in.Below(9)));
  driver.Run(in);
  return 0;
}
