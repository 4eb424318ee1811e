// Throughput of the agent's local reduction (agent/reduce.h) against memcpy
// of the same buffer size, the bound a memory-bound sum cannot beat.
//
// Every rate counts the bytes read plus the bytes written: memcpy of N bytes
// moves 2N, SumInto of k sources of N bytes moves (k + 1)N, and the in-place
// pairwise sum gloo runs (dst == a) moves 3N. After the usual benchmark
// output, a table gives each kernel's rate as a fraction of memcpy's at the
// same size. Buffers are allocated and touched once, before any timing.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/reduce.h"

namespace baton::agent {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSizes[] = {4 * kMiB, 64 * kMiB};
constexpr size_t kMaxSources = 8;

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

// kMaxSources sources and one destination of `bytes` each.
struct Buffers {
  std::vector<Buffer> srcs;
  Buffer dst;
};

Buffer Allocate(size_t bytes) {
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  if (p == nullptr) {
    std::fprintf(stderr, "cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  return Buffer(p);
}

// Ordinary finite values of `dtype` (no NaN, no subnormals), like gradients.
void Fill(v1::DataType dtype, uint8_t* data, size_t bytes, uint32_t seed) {
  const size_t count = bytes / ElementSize(dtype);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t noise = static_cast<uint32_t>(i * 2654435761u + seed);
    switch (dtype) {
      case v1::DATA_TYPE_FLOAT32: {
        const float f = static_cast<float>(noise % 2001) * 1e-3f - 1.0f;
        std::memcpy(data + 4 * i, &f, 4);
        break;
      }
      case v1::DATA_TYPE_FLOAT16: {  // Magnitudes in [2^-8, 2^8).
        const uint16_t h =
            static_cast<uint16_t>(((noise & 1) << 15) | (7 + noise % 16) << 10 |
                                  ((noise >> 8) & 0x3ff));
        std::memcpy(data + 2 * i, &h, 2);
        break;
      }
      case v1::DATA_TYPE_BFLOAT16: {  // Magnitudes in [2^-8, 2^8).
        const uint16_t b = static_cast<uint16_t>(((noise & 1) << 15) |
                                                 (119 + noise % 16) << 7 |
                                                 ((noise >> 8) & 0x7f));
        std::memcpy(data + 2 * i, &b, 2);
        break;
      }
      default: {
        const uint64_t x = noise;
        std::memcpy(data + ElementSize(dtype) * i, &x, ElementSize(dtype));
        break;
      }
    }
  }
}

Buffers& BuffersFor(v1::DataType dtype, size_t bytes) {
  static auto* cache = new std::map<std::pair<int, size_t>, Buffers>;
  Buffers& buffers = (*cache)[{dtype, bytes}];
  if (buffers.dst == nullptr) {
    for (size_t k = 0; k < kMaxSources; ++k) {
      buffers.srcs.push_back(Allocate(bytes));
      Fill(dtype, buffers.srcs.back().get(), bytes, static_cast<uint32_t>(k));
    }
    buffers.dst = Allocate(bytes);
    std::memset(buffers.dst.get(), 0, bytes);
  }
  return buffers;
}

void Memcpy(benchmark::State& state, size_t bytes) {
  Buffers& buffers = BuffersFor(v1::DATA_TYPE_FLOAT32, bytes);
  for (auto _ : state) {
    std::memcpy(buffers.dst.get(), buffers.srcs[0].get(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * bytes));
}

void Sum(benchmark::State& state, v1::DataType dtype, size_t num_srcs,
         size_t bytes) {
  Buffers& buffers = BuffersFor(dtype, bytes);
  std::vector<const void*> srcs;
  for (size_t k = 0; k < num_srcs; ++k) srcs.push_back(buffers.srcs[k].get());
  const size_t count = bytes / ElementSize(dtype);
  for (auto _ : state) {
    SumInto(dtype, buffers.dst.get(), srcs.data(), num_srcs, count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() *
                          static_cast<int64_t>((num_srcs + 1) * bytes));
}

// gloo's reduce step: a += b. The kernels are branch-free, so values that
// grow over the iterations (to infinity for the narrow types) do not change
// their speed.
void PairwiseInPlace(benchmark::State& state, v1::DataType dtype,
                     size_t bytes) {
  Buffers& buffers = BuffersFor(dtype, bytes);
  Buffer a = Allocate(bytes);
  std::memcpy(a.get(), buffers.srcs[1].get(), bytes);
  const PairwiseSum sum = PairwiseSumFor(dtype);
  const size_t count = bytes / ElementSize(dtype);
  for (auto _ : state) {
    sum(a.get(), a.get(), buffers.srcs[0].get(), count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(3 * bytes));
}

std::string SizeName(size_t bytes) {
  return std::to_string(bytes / kMiB) + "MiB";
}

// Keeps each benchmark's rate for the table after the run: the median over
// repetitions when there are several (run_local_reduce asks for 5, which
// steadies the numbers on a shared machine), else the single run's.
class RateCollector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      const bool median =
          run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (run.error_occurred ||
          (run.run_type != Run::RT_Iteration && !median)) {
        continue;
      }
      const auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      rates_[run.run_name.function_name] = it->second;
      if (median) repetitions_ = run.repetitions;
    }
  }
  // Bytes per second, or 0 when the benchmark did not run (--filter).
  double Rate(const std::string& name) const {
    const auto it = rates_.find(name);
    return it == rates_.end() ? 0 : it->second;
  }
  int64_t repetitions() const { return repetitions_; }

 private:
  std::map<std::string, double> rates_;
  int64_t repetitions_ = 1;
};

struct Row {
  std::string label;
  std::string name_prefix;  // Completed by "/<size>".
};

void PrintTable(const RateCollector& rates, const std::vector<Row>& rows) {
  std::printf(
      "\nbytes read+written per second (median of %lld), and the ratio to "
      "memcpy\n",
      static_cast<long long>(rates.repetitions()));
  std::printf("%-28s", "kernel");
  for (size_t bytes : kSizes) {
    std::printf(" | %6s GB/s  vs memcpy", SizeName(bytes).c_str());
  }
  std::printf("\n");
  for (const Row& row : rows) {
    std::printf("%-28s", row.label.c_str());
    for (size_t bytes : kSizes) {
      const double rate = rates.Rate(row.name_prefix + "/" + SizeName(bytes));
      const double memcpy_rate = rates.Rate("memcpy/" + SizeName(bytes));
      if (rate == 0 || memcpy_rate == 0) {
        std::printf(" | %11s  %9s", "-", "-");
      } else {
        std::printf(" | %11.2f  %9.2f", rate / 1e9, rate / memcpy_rate);
      }
    }
    std::printf("\n");
  }
}

int Main(int argc, char** argv) {
  const v1::DataType kTypes[] = {v1::DATA_TYPE_FLOAT32, v1::DATA_TYPE_FLOAT16,
                                 v1::DATA_TYPE_BFLOAT16, v1::DATA_TYPE_INT64};
  const size_t kSourceCounts[] = {1, 2, 4, 8};
  std::vector<Row> rows = {{"memcpy", "memcpy"}};
  for (size_t bytes : kSizes) {
    benchmark::RegisterBenchmark(("memcpy/" + SizeName(bytes)).c_str(), Memcpy,
                                 bytes)
        ->UseRealTime();
  }
  for (v1::DataType dtype : kTypes) {
    const std::string type_name =
        v1::DataType_Name(dtype).substr(std::strlen("DATA_TYPE_"));
    for (size_t num_srcs : kSourceCounts) {
      const std::string prefix =
          "SumInto/" + type_name + "/srcs:" + std::to_string(num_srcs);
      rows.push_back({type_name + " SumInto " + std::to_string(num_srcs) +
                          (num_srcs == 1 ? " src" : " srcs"),
                      prefix});
      for (size_t bytes : kSizes) {
        benchmark::RegisterBenchmark((prefix + "/" + SizeName(bytes)).c_str(),
                                     Sum, dtype, num_srcs, bytes)
            ->UseRealTime();
      }
    }
    const std::string prefix = "PairwiseInPlace/" + type_name;
    rows.push_back({type_name + " pairwise a+=b", prefix});
    for (size_t bytes : kSizes) {
      benchmark::RegisterBenchmark((prefix + "/" + SizeName(bytes)).c_str(),
                                   PairwiseInPlace, dtype, bytes)
          ->UseRealTime();
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RateCollector reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  PrintTable(reporter, rows);
  return 0;
}

}  // namespace
}  // namespace baton::agent

int main(int argc, char** argv) { return baton::agent::Main(argc, argv); }
