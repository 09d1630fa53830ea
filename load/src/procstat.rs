//! CPU time and resident memory of a process, read from `/proc`.

use serde::Serialize;

/// One reading of a process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProcSample {
    /// User + system CPU time of all its threads, in seconds.
    pub cpu_s: f64,
    /// Resident set size, in KiB.
    pub rss_kib: u64,
    /// Of it, anonymous memory (heap, stacks, anonymous mappings: what the
    /// process itself wrote), in KiB. The rest is file-backed, mostly the
    /// program's code and read-only data, clean pages the kernel can drop
    /// and read back. `None` on kernels without `RssAnon` (before 4.5).
    pub rss_anon_kib: Option<u64>,
}

/// Reads process `pid` (`None`: this process). `None` if it is gone or
/// `/proc` is not there (not Linux).
pub fn sample(pid: Option<u32>) -> Option<ProcSample> {
    let dir = match pid {
        Some(p) => format!("/proc/{p}"),
        None => "/proc/self".to_owned(),
    };
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
    Some(ProcSample {
        cpu_s: cpu_seconds(&stat)?,
        rss_kib: status_kib(&status, "VmRSS:")?,
        rss_anon_kib: status_kib(&status, "RssAnon:"),
    })
}

/// `utime + stime` from a `/proc/PID/stat` line. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last `)`.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // After the name: state (3), ppid (4), … utime is field 14, stime 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    Some((utime + stime) as f64 / ticks)
}

/// A `kB` field of `/proc/PID/status`, e.g. `VmRSS:`.
fn status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Raises this process's open-file limit to its hard limit, so thousands
/// of sessions (each a socket, twice during a storm) do not run out.
/// Returns the soft limit now in force.
pub fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
    getrlimit(Resource::Nofile).current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_fields() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 3 0 1 2 3";
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        assert_eq!(cpu_seconds(stat), Some(300.0 / ticks));
        let status = "Name:\tx\nVmRSS:\t  1234 kB\nRssAnon:\t   234 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(1234));
        assert_eq!(status_kib(status, "RssAnon:"), Some(234));
        assert_eq!(status_kib(status, "RssShmem:"), None);
    }

    #[test]
    fn this_process_can_be_read() {
        let s = sample(None).expect("/proc/self");
        assert!(s.rss_kib > 0);
        let anon = s.rss_anon_kib.expect("RssAnon (Linux 4.5 and later)");
        assert!(anon > 0 && anon <= s.rss_kib, "{s:?}");
    }
}
