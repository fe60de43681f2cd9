// The process's own resource use, read from /proc at each scrape and exported
// under the names Prometheus's client libraries give it (process_*), so that
// the usual process panels and alerts work on this server unchanged.
#ifndef GPUCOMPUTE_SERVER_METRICS_PROCESS_STATS_H_
#define GPUCOMPUTE_SERVER_METRICS_PROCESS_STATS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpucompute {

struct ProcessStats {
  double cpu_seconds = 0;         // user + system CPU time
  int64_t resident_bytes = 0;     // resident set size
  int64_t virtual_bytes = 0;      // virtual memory size
  double start_time_seconds = 0;  // since the Unix epoch
  int64_t open_fds = 0;
  int64_t max_fds = 0;  // the soft RLIMIT_NOFILE
};

// The fields of a /proc/<pid>/stat line that ProcessStats takes (CPU time,
// start time, virtual and resident size), converted with `ticks_per_second`
// (sysconf(_SC_CLK_TCK)), `page_bytes` and `boot_time_seconds` (the btime of
// /proc/stat). The command name may hold spaces and parentheses. Errors:
// INVALID_ARGUMENT for a line that does not have the fields.
absl::StatusOr<ProcessStats> ParseProcStat(absl::string_view stat, double ticks_per_second,
                                           int64_t page_bytes, double boot_time_seconds);

// This process's stats from /proc/self/stat, /proc/stat, /proc/self/fd and
// getrlimit. Errors: UNAVAILABLE when /proc cannot be read (not Linux),
// INVALID_ARGUMENT when it reads as something unexpected.
absl::StatusOr<ProcessStats> ReadProcessStats();

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_METRICS_PROCESS_STATS_H_
