#include "server/metrics/process_stats.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpucompute {
namespace {

absl::StatusOr<std::string> ReadAll(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The btime line of /proc/stat: boot time in seconds since the epoch.
absl::StatusOr<double> BootTime() {
  absl::StatusOr<std::string> stat = ReadAll("/proc/stat");
  if (!stat.ok()) return stat.status();
  for (absl::string_view line : absl::StrSplit(*stat, '\n')) {
    if (absl::ConsumePrefix(&line, "btime ")) {
      double seconds = 0;
      if (absl::SimpleAtod(line, &seconds)) return seconds;
    }
  }
  return absl::InvalidArgumentError("/proc/stat: no btime line");
}

absl::StatusOr<int64_t> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return absl::UnavailableError("cannot list /proc/self/fd");
  int64_t count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory stream's own descriptor
}

}  // namespace

absl::StatusOr<ProcessStats> ParseProcStat(absl::string_view stat, double ticks_per_second,
                                           int64_t page_bytes, double boot_time_seconds) {
  // "pid (comm) state ppid ...": comm may hold anything but ends at the last ')'.
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("stat: no ')' after the command name");
  }
  std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state) of proc(5); field k is fields[k - 3].
  constexpr size_t kUtime = 14 - 3, kStime = 15 - 3, kStart = 22 - 3, kVsize = 23 - 3,
                   kRss = 24 - 3;
  if (fields.size() <= kRss) {
    return absl::InvalidArgumentError(
        absl::StrCat("stat: ", fields.size() + 2, " fields, expected at least 24"));
  }
  double utime = 0, stime = 0, start = 0;
  int64_t vsize = 0, rss = 0;
  if (!absl::SimpleAtod(fields[kUtime], &utime) || !absl::SimpleAtod(fields[kStime], &stime) ||
      !absl::SimpleAtod(fields[kStart], &start) || !absl::SimpleAtoi(fields[kVsize], &vsize) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[kRss]), &rss)) {
    return absl::InvalidArgumentError("stat: a field is not a number");
  }
  ProcessStats stats;
  stats.cpu_seconds = (utime + stime) / ticks_per_second;
  stats.start_time_seconds = boot_time_seconds + start / ticks_per_second;
  stats.virtual_bytes = vsize;
  stats.resident_bytes = rss * page_bytes;
  return stats;
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  absl::StatusOr<std::string> stat = ReadAll("/proc/self/stat");
  if (!stat.ok()) return stat.status();
  absl::StatusOr<double> boot = BootTime();
  if (!boot.ok()) return boot.status();
  absl::StatusOr<ProcessStats> stats = ParseProcStat(
      absl::StripTrailingAsciiWhitespace(*stat), static_cast<double>(sysconf(_SC_CLK_TCK)),
      static_cast<int64_t>(sysconf(_SC_PAGESIZE)), *boot);
  if (!stats.ok()) return stats.status();
  absl::StatusOr<int64_t> fds = OpenFds();
  if (!fds.ok()) return fds.status();
  stats->open_fds = *fds;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    stats->max_fds = limit.rlim_cur == RLIM_INFINITY ? INT64_MAX : int64_t(limit.rlim_cur);
  }
  return stats;
}

}  // namespace gpucompute
