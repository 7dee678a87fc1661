#include "runtime/memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

namespace quiver {
namespace {

// The first number in a file, or -1 (missing, unreadable, "max").
int64_t number_in(const std::string& path) {
  std::ifstream in(path);
  int64_t value = -1;
  if (!(in >> value)) return -1;
  return value;
}

// `key`'s value in a memory.stat file, or 0.
int64_t stat_value(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string name;
  int64_t value = 0;
  while (in >> name >> value)
    if (name == key) return value;
  return 0;
}

// limit - usage + reclaimable cache for one cgroup directory's files; -1 without a limit.
int64_t headroom_in(const std::string& dir, const std::string& limit_file, const std::string& usage_file,
                    const std::string& inactive_key) {
  const int64_t limit = number_in(dir + "/" + limit_file);
  const int64_t usage = number_in(dir + "/" + usage_file);
  // v1 reports "no limit" as a page-rounded 2^63 - 1; v2 writes "max", which reads as no number.
  if (limit < 0 || usage < 0 || limit >= (int64_t{1} << 62)) return -1;
  return std::max<int64_t>(0, limit - usage + stat_value(dir + "/memory.stat", inactive_key));
}

}  // namespace

int64_t cgroup_headroom_bytes(const std::string& proc_self_cgroup, const std::string& sys_fs_cgroup) {
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "hierarchy-id:controllers:path"; v2 is "0::path", v1's memory line names "memory".
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    const bool v2 = line.compare(0, first, "0") == 0 && controllers.empty();
    bool memory_v1 = false;
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) memory_v1 = memory_v1 || name == "memory";
    if (!v2 && !memory_v1) continue;
    const std::string root = v2 ? sys_fs_cgroup : sys_fs_cgroup + "/memory";
    // Every cgroup from the process's own up to the root limits it (a batch system often sets
    // the job's limit on a parent: Slurm's job/step/task), so the least headroom of them all.
    // Inside a cgroup namespace the process's own cgroup is mounted at the root, which the walk
    // reaches too; a path that leaves the namespace ("/../x") is read at the root only.
    std::string relative = path.find("/..") == std::string::npos ? path : std::string();
    int64_t least = -1;
    for (;;) {
      while (!relative.empty() && relative.back() == '/') relative.pop_back();
      const std::string dir = root + relative;
      const int64_t headroom = v2 ? headroom_in(dir, "memory.max", "memory.current", "inactive_file")
                                  : headroom_in(dir, "memory.limit_in_bytes", "memory.usage_in_bytes",
                                                "total_inactive_file");
      if (headroom >= 0 && (least < 0 || headroom < least)) least = headroom;
      if (relative.empty()) break;
      relative.erase(relative.rfind('/') == std::string::npos ? 0 : relative.rfind('/'));
    }
    if (least >= 0) return least;
  }
  return -1;
}

int64_t available_memory_bytes() {
  int64_t available = -1;
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    int64_t kib = 0;
    while (in >> key >> kib >> unit)
      if (key == "MemAvailable:") {
        available = kib * 1024;
        break;
      }
  }
  std::ifstream cgroup("/proc/self/cgroup");
  std::stringstream text;
  text << cgroup.rdbuf();
  const int64_t headroom = cgroup_headroom_bytes(text.str(), "/sys/fs/cgroup");
  if (headroom >= 0 && (available < 0 || headroom < available)) available = headroom;
  return available;
}

}  // namespace quiver
