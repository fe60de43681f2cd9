// What this binary was built from, for gpucompute_build_info.
#ifndef GPUCOMPUTE_SERVER_METRICS_BUILD_INFO_H_
#define GPUCOMPUTE_SERVER_METRICS_BUILD_INFO_H_

#include <string>

namespace gpucompute {

struct BuildInfo {
  std::string version;  // the project version, "0.1.0"
  std::string
      revision;  // the git commit, "-dirty" appended for local changes; "unknown" outside git
  std::string compiler;  // "GNU 12.2.0"
  std::string cuda;      // the CUDA toolkit version built against, or "none"
};

// Filled in by the build (server/metrics/build_info.cc.in, rewritten at each
// build when the revision changes).
const BuildInfo& ThisBuild();

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_METRICS_BUILD_INFO_H_
