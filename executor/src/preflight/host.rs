//! The host memory a run may use (and, [`host_ceiling`], the most it could ever get): the smallest of `MemAvailable` in `/proc/meminfo` and what
//! the process's memory cgroups leave (v2: `memory.max` less `memory.current`, every level up
//! to the root; v1: `memory.limit_in_bytes` less `memory.usage_in_bytes`). Parsing is split from
//! reading, so the arithmetic is tested on fixed text.

use std::path::{Path, PathBuf};

use super::MemoryFigure;

/// What this process may allocate on the host, from the files of this machine (`None` where
/// none of them can be read, e.g. not Linux).
pub fn host_available() -> Option<MemoryFigure> {
    let mut best: Option<MemoryFigure> = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_available(&text))
        .map(|bytes| MemoryFigure {
            bytes,
            source: "MemAvailable in /proc/meminfo".to_string(),
        });
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for (dir, version) in cgroup_dirs(&cgroups, Path::new("/sys/fs/cgroup")) {
        let Some(bytes) = cgroup_room(&dir, version) else {
            continue;
        };
        if best.as_ref().is_none_or(|b| bytes < b.bytes) {
            let files = match version {
                CgroupVersion::V2 => "memory.max less memory.current",
                CgroupVersion::V1 => "memory.limit_in_bytes less memory.usage_in_bytes",
            };
            best = Some(MemoryFigure {
                bytes,
                source: format!("the cgroup's {files} in {}", dir.display()),
            });
        }
    }
    best
}

/// The most host memory this process could ever have: `MemTotal` plus `SwapTotal` (and the
/// cgroups' `memory.max`, when lower). A plan beyond it cannot run even with `--force`: its
/// allocations would fail (and abort the process).
pub fn host_ceiling() -> Option<MemoryFigure> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mut best = MemoryFigure {
        bytes: meminfo_field(&meminfo, "MemTotal:")?
            .saturating_add(meminfo_field(&meminfo, "SwapTotal:").unwrap_or(0)),
        source: "MemTotal plus SwapTotal in /proc/meminfo".to_string(),
    };
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for (dir, version) in cgroup_dirs(&cgroups, Path::new("/sys/fs/cgroup")) {
        let limit = match version {
            CgroupVersion::V2 => "memory.max",
            CgroupVersion::V1 => "memory.limit_in_bytes",
        };
        let Some(bytes) = std::fs::read_to_string(dir.join(limit))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        else {
            continue;
        };
        if bytes < best.bytes {
            best = MemoryFigure {
                bytes,
                source: format!("the cgroup's {limit} in {}", dir.display()),
            };
        }
    }
    Some(best)
}

/// A `/proc/meminfo` field (`MemTotal:`), in bytes.
pub fn meminfo_field(meminfo: &str, field: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?;
        let mut words = rest.split_whitespace();
        let value: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

/// `MemAvailable` of `/proc/meminfo`'s text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("MemAvailable:")?;
        let mut words = rest.split_whitespace();
        let value: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

/// The two cgroup hierarchies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The unified hierarchy (`0::/path`).
    V2,
    /// The `memory` controller's own hierarchy (`N:memory:/path`).
    V1,
}

/// The cgroup directories whose memory limits apply to this process, from
/// `/proc/self/cgroup`'s text, under `root` (`/sys/fs/cgroup`): its own and every ancestor
/// (a limit on a parent applies too), and the mount's root (in a container the mount shows
/// the container's cgroup, whatever the path says).
pub fn cgroup_dirs(proc_cgroup: &str, root: &Path) -> Vec<(PathBuf, CgroupVersion)> {
    let mut dirs = Vec::new();
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (base, version) = if controllers.is_empty() {
            (root.to_path_buf(), CgroupVersion::V2)
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), CgroupVersion::V1)
        } else {
            continue;
        };
        let mut relative = PathBuf::from(path.trim_start_matches('/'));
        loop {
            let dir = if relative.as_os_str().is_empty() {
                base.clone()
            } else {
                base.join(&relative)
            };
            dirs.push((dir, version));
            if !relative.pop() {
                break;
            }
        }
    }
    dirs.dedup();
    dirs
}

/// What the cgroup at `dir` leaves: its limit less its use (`None` without a limit or where
/// the files are not there).
pub fn cgroup_room(dir: &Path, version: CgroupVersion) -> Option<u64> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (limit, usage) = match version {
        CgroupVersion::V2 => (read("memory.max")?, read("memory.current")?),
        CgroupVersion::V1 => (
            read("memory.limit_in_bytes")?,
            read("memory.usage_in_bytes")?,
        ),
    };
    room(&limit, &usage)
}

/// `limit - usage` from a cgroup's files' text; `None` for no limit (`max`, or v1's
/// page-rounded 2^63).
pub fn room(limit: &str, usage: &str) -> Option<u64> {
    let limit = limit.trim();
    if limit == "max" {
        return None;
    }
    let limit: u64 = limit.parse().ok()?;
    if limit >= 1 << 62 {
        return None;
    }
    let usage: u64 = usage.trim().parse().ok()?;
    Some(limit.saturating_sub(usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:   20753584 kB\n";
        assert_eq!(mem_available(text), Some(20_753_584 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn cgroup_limits_leave_the_limit_less_the_use() {
        assert_eq!(room("max\n", "123\n"), None);
        assert_eq!(room("9223372036854771712\n", "5\n"), None);
        assert_eq!(room("1073741824\n", "73741824\n"), Some(1_000_000_000));
        assert_eq!(room("100", "200"), Some(0));
    }

    #[test]
    fn every_level_of_both_hierarchies_is_looked_at() {
        let text = "4:memory:/a/b\n0::/c\n3:cpuset:/\n";
        let dirs = cgroup_dirs(text, Path::new("/cg"));
        let shown: Vec<(String, CgroupVersion)> = dirs
            .iter()
            .map(|(d, v)| (d.display().to_string(), *v))
            .collect();
        assert_eq!(
            shown,
            [
                ("/cg/memory/a/b".to_string(), CgroupVersion::V1),
                ("/cg/memory/a".to_string(), CgroupVersion::V1),
                ("/cg/memory".to_string(), CgroupVersion::V1),
                ("/cg/c".to_string(), CgroupVersion::V2),
                ("/cg".to_string(), CgroupVersion::V2),
            ]
        );
    }

    #[test]
    fn a_v2_cgroup_directory_is_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("memory.max"), "4096\n").expect("write");
        std::fs::write(dir.path().join("memory.current"), "1024\n").expect("write");
        assert_eq!(cgroup_room(dir.path(), CgroupVersion::V2), Some(3072));
        assert_eq!(cgroup_room(dir.path(), CgroupVersion::V1), None);
    }
}
