#include "common/job/rpc.h"

#include <grpc/grpc.h>

#include "google/protobuf/util/json_util.h"

namespace tally {

std::string JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED: return "queued";
    case v1::JOB_STATE_RUNNING: return "running";
    case v1::JOB_STATE_SUCCEEDED: return "succeeded";
    case v1::JOB_STATE_FAILED: return "failed";
    case v1::JOB_STATE_CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

v1::JobState JobStateFromName(const std::string& name) {
  for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED,
                         v1::JOB_STATE_CANCELLED}) {
    if (JobStateName(s) == name) return s;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(m, &out, o).ok()) return "{}";
  return out;
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

void KeepGrpcUntilExit() {
  static const bool held = [] {
    grpc_init();
    return true;
  }();
  (void)held;
}

}  // namespace tally
