//! Page-table work per plugin call, counted from outside the runtime
//! (`capstan-bench-plugin --breakdown`'s `per_call_*` lines).
//!
//! On a host with nested paging every page-table change costs several
//! plain syscalls (an `mprotect`, an `madvise`, a minor fault), so a call
//! should cause none. The benchmark runs a probe of itself twice under
//! `strace -f -c`, once with no measured calls and once with N, and takes
//! the difference per call: start-up, loading and warm-up cancel out.
//! Minor faults are read from `/proc/self/stat` around the N calls.

use std::collections::HashMap;

/// The system calls that change page tables (or scan them) and are counted.
pub const PAGE_TABLE_SYSCALLS: &[&str] = &["mprotect", "madvise", "mmap", "munmap", "ioctl"];

/// The `calls` column of `strace -c`'s summary, by system call name.
/// Lines that are not table rows (headers, rules, `total`) are skipped.
pub fn parse_strace_summary(text: &str) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors,] syscall
        if !(5..=6).contains(&fields.len()) || fields[0].parse::<f64>().is_err() {
            continue;
        }
        let name = fields[fields.len() - 1];
        if name == "total" {
            continue;
        }
        if let Ok(calls) = fields[3].parse::<u64>() {
            *counts.entry(name.to_string()).or_default() += calls;
        }
    }
    counts
}

/// Minor page faults this process took so far (`/proc/self/stat`, field
/// 10), or `None` where there is no such file.
pub fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(7)?.parse().ok()
}

/// The kernel command line's words that say how this host is virtualized
/// (idle polling, nested paging, mitigations), for the benchmark's header:
/// the per-call figures depend on them.
pub fn virtualization_flags() -> String {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let words: Vec<&str> = cmdline
        .split_whitespace()
        .take_while(|w| *w != "--")
        .filter(|w| {
            ["haltpoll", "nested", "pvm", "kvm", "mitigations", "idle"]
                .iter()
                .any(|k| w.contains(k))
        })
        .collect();
    if words.is_empty() {
        "none on the kernel command line".into()
    } else {
        words.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_summaries_are_read_by_name_with_and_without_errors() {
        let text = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 45.00    0.000045           2        20           mprotect
 30.00    0.000030           3        10         2 ioctl
 25.00    0.000025           1        25           madvise
------ ----------- ----------- --------- --------- ----------------
100.00    0.000100           1        55         2 total
";
        let counts = parse_strace_summary(text);
        assert_eq!(counts.get("mprotect"), Some(&20));
        assert_eq!(counts.get("ioctl"), Some(&10));
        assert_eq!(counts.get("madvise"), Some(&25));
        assert_eq!(counts.get("total"), None);
        assert_eq!(counts.len(), 3);
    }

    #[test]
    fn this_process_has_taken_minor_faults() {
        assert!(minor_faults().is_some_and(|n| n > 0));
    }
}
