// How much memory this process may still take, for the checks that refuse a model or a learner
// group before training rather than leave it to the kernel's out-of-memory killer.
#pragma once

#include <cstdint>
#include <string>

namespace quiver {

// MemAvailable from /proc/meminfo, or less where the memory cgroup this process runs in (a
// container, a CI job) has a limit: what that limit still leaves. Bytes; -1 when unknown.
int64_t available_memory_bytes();

// What the memory cgroup described by `proc_self_cgroup` (the text of /proc/self/cgroup) still
// lets its processes take, with the cgroup file systems mounted under `sys_fs_cgroup`: its limit
// less its usage, plus the inactive file cache the kernel would reclaim first, the least of it
// over the cgroup and every parent up to the root (each one's limit applies). cgroup v2
// (memory.max, memory.current) and v1 (memory.limit_in_bytes, memory.usage_in_bytes). Bytes; -1
// when there is no limit or nothing to read.
int64_t cgroup_headroom_bytes(const std::string& proc_self_cgroup, const std::string& sys_fs_cgroup);

}  // namespace quiver
