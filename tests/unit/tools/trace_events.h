#pragma once

// Reading back the Chrome trace batonctl timeline writes, for its unit and
// integration tests.

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace baton::batonctl {

// A number field of a JSON object, as an int.
inline int Int(const google::protobuf::Struct& object,
               const std::string& field) {
  return static_cast<int>(object.fields().at(field).number_value());
}

inline const std::string& String(const google::protobuf::Struct& object,
                                 const std::string& field) {
  return object.fields().at(field).string_value();
}

inline const google::protobuf::Struct& Args(
    const google::protobuf::Struct& event) {
  return event.fields().at("args").struct_value();
}

struct TraceEvents {
  std::string display_time_unit;
  // pid -> process_name.
  std::map<int, std::string> processes;
  // (pid, tid) -> thread_name.
  std::map<std::pair<int, int>, std::string> threads;
  // (pid, event name: "<tensor> p<i>/<n> step <s>") -> the complete events
  // of that partition on that node, by start time (ties in file order).
  std::map<std::pair<int, std::string>, std::vector<google::protobuf::Struct>>
      partitions;
};

// Parses `json` (a failure fails the test) and sorts its events out.
inline TraceEvents ReadTraceEvents(const std::string& json) {
  google::protobuf::Struct trace;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &trace);
  EXPECT_TRUE(status.ok()) << "not JSON: " << status.message() << "\n" << json;
  TraceEvents events;
  if (!status.ok()) return events;
  events.display_time_unit = String(trace, "displayTimeUnit");
  for (const auto& value :
       trace.fields().at("traceEvents").list_value().values()) {
    const google::protobuf::Struct& e = value.struct_value();
    const std::string& ph = String(e, "ph");
    const std::string& name = String(e, "name");
    if (ph == "M" && name == "process_name") {
      events.processes[Int(e, "pid")] = String(Args(e), "name");
    } else if (ph == "M" && name == "thread_name") {
      events.threads[{Int(e, "pid"), Int(e, "tid")}] = String(Args(e), "name");
    } else if (ph == "X") {
      events.partitions[{Int(e, "pid"), name}].push_back(e);
    }
  }
  for (auto& [partition, phases] : events.partitions) {
    std::stable_sort(phases.begin(), phases.end(),
                     [](const auto& a, const auto& b) {
                       return Int(a, "ts") < Int(b, "ts");
                     });
  }
  return events;
}

// Every partition has the five phases in order, each starting where the
// previous one ended, none before the earliest record.
inline void ExpectEveryPhaseInOrder(const TraceEvents& events) {
  for (const auto& [partition, phases] : events.partitions) {
    SCOPED_TRACE(::testing::Message()
                 << "node " << partition.first << " " << partition.second);
    std::vector<std::string> names;
    for (const google::protobuf::Struct& e : phases) {
      names.push_back(String(e, "cat"));
      EXPECT_GE(Int(e, "ts"), 0);
      EXPECT_GE(Int(e, "dur"), 0);
    }
    EXPECT_THAT(names,
                ::testing::ElementsAre("queued", "credit", "worker queue",
                                       "local reduce", "network"));
    for (size_t i = 1; i < phases.size(); ++i) {
      EXPECT_EQ(Int(phases[i - 1], "ts") + Int(phases[i - 1], "dur"),
                Int(phases[i], "ts"))
          << names[i] << " starts where " << names[i - 1] << " ended";
    }
  }
}

}  // namespace baton::batonctl
