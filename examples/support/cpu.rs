//! Who had the machine's cores while a stage ran: CPU time and run-queue wait of every
//! thread, from Linux's `/proc/<pid>/task/<tid>/schedstat` (nanoseconds on a CPU, then
//! nanoseconds runnable but waiting for one), grouped by who it works for. On 2 cores the
//! database server, the relays, librdkafka's producers and the in-process mock cluster all
//! share the cores, so a relay's figure beside the bare loop's (which has the server alone)
//! depends on what the rest took; this says how much that was.
//!
//! A thread that ended between two samples is missing from the later one and its time is
//! not counted, so a sample is taken while the stage's threads still run.
//!
//! On a virtual machine the hypervisor may run other guests while this one's cores want to
//! run: that time, the `steal` column of `/proc/stat`, is given too. A stage during which
//! it was high ran on a slower machine than its neighbours.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs;
use std::time::{Duration, Instant};

/// Who a thread works for.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    /// The database server's processes (`postgres`, `mariadbd`).
    Server,
    /// This process's own threads: the tokio runtime, that is the relays and the benchmark.
    Relays,
    /// librdkafka's client threads in this process (`rdk:main`, `rdk:broker…`).
    Producers,
    /// The mock cluster's broker thread (`rdk:mock`): the broker, which in production runs
    /// elsewhere.
    MockCluster,
    /// Every other process on the machine.
    Other,
}

impl Group {
    const ALL: [Group; 5] = [
        Group::Server,
        Group::Relays,
        Group::Producers,
        Group::MockCluster,
        Group::Other,
    ];

    fn name(self) -> &'static str {
        match self {
            Group::Server => "server",
            Group::Relays => "relays",
            Group::Producers => "producers",
            Group::MockCluster => "mock cluster",
            Group::Other => "other",
        }
    }
}

/// Every thread's CPU and run-queue nanoseconds at one moment.
struct Sample {
    at: Instant,
    /// Nanoseconds stolen from all cores so far.
    steal: u64,
    threads: HashMap<(u32, u32), (Group, u64, u64)>,
}

impl Sample {
    /// Reads every thread of every process it may read (an unreadable one is skipped).
    fn take() -> Sample {
        let own = std::process::id();
        let mut threads = HashMap::new();
        for pid in numbered_entries("/proc") {
            let process = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            for tid in numbered_entries(&format!("/proc/{pid}/task")) {
                let task = format!("/proc/{pid}/task/{tid}");
                let Some((on_cpu, waiting)) = schedstat(&format!("{task}/schedstat")) else {
                    continue;
                };
                let group = if pid == own {
                    let thread = fs::read_to_string(format!("{task}/comm")).unwrap_or_default();
                    match thread.trim() {
                        "rdk:mock" => Group::MockCluster,
                        name if name.starts_with("rdk:") => Group::Producers,
                        _ => Group::Relays,
                    }
                } else if matches!(process.trim(), "postgres" | "mariadbd") {
                    Group::Server
                } else {
                    Group::Other
                };
                threads.insert((pid, tid), (group, on_cpu, waiting));
            }
        }
        Sample {
            at: Instant::now(),
            steal: steal(),
            threads,
        }
    }
}

/// A stage being measured into a [`Split`] (or not, without one): a sample now, and one more
/// at [`stop`](Self::stop).
pub struct Meter<'a> {
    into: Option<(&'a RefCell<Split>, Sample)>,
}

impl<'a> Meter<'a> {
    /// Starts measuring into `split`, if any.
    pub fn start(split: Option<&'a RefCell<Split>>) -> Meter<'a> {
        Meter {
            into: split.map(|split| (split, Sample::take())),
        }
    }

    /// Adds what every thread spent since the start; call it while the stage's threads and
    /// server processes still run.
    pub fn stop(self) {
        if let Some((split, before)) = self.into {
            split.borrow_mut().add(&before, &Sample::take());
        }
    }
}

/// CPU and run-queue wait per group between two samples, summed over the stages measured
/// (cores = nanoseconds over the stages' wall nanoseconds).
#[derive(Default)]
pub struct Split {
    wall: Duration,
    steal: u64,
    on_cpu: HashMap<Group, u64>,
    waiting: HashMap<Group, u64>,
}

impl Split {
    /// Adds what every thread spent from `before` to `after`.
    fn add(&mut self, before: &Sample, after: &Sample) {
        self.wall += after.at.saturating_duration_since(before.at);
        self.steal += after.steal.saturating_sub(before.steal);
        for (key, &(group, on_cpu, waiting)) in &after.threads {
            let (was_cpu, was_waiting) = before
                .threads
                .get(key)
                .map_or((0, 0), |&(_, cpu, wait)| (cpu, wait));
            *self.on_cpu.entry(group).or_default() += on_cpu.saturating_sub(was_cpu);
            *self.waiting.entry(group).or_default() += waiting.saturating_sub(was_waiting);
        }
    }

    /// `server 1.62 (0.31), relays 0.20 (0.05), …, steal 0.02`: cores used by each group
    /// over the stages, in brackets how many cores' worth of its threads waited to run, and
    /// the cores the hypervisor took; or `not measured` when nothing was added.
    pub fn cell(&self) -> String {
        let wall = self.wall.as_nanos() as f64;
        if wall == 0.0 {
            return "not measured".to_owned();
        }
        let cores =
            |map: &HashMap<Group, u64>, group| map.get(&group).copied().unwrap_or(0) as f64 / wall;
        Group::ALL
            .iter()
            .map(|&group| {
                format!(
                    "{} {:.2} ({:.2})",
                    group.name(),
                    cores(&self.on_cpu, group),
                    cores(&self.waiting, group)
                )
            })
            .chain(std::iter::once(format!(
                "steal {:.2}",
                self.steal as f64 / wall
            )))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The numeric entries (pids, tids) of a /proc directory; none when it cannot be read.
fn numbered_entries(dir: &str) -> Vec<u32> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A schedstat file's first two fields: nanoseconds on a CPU, nanoseconds waiting for one.
fn schedstat(path: &str) -> Option<(u64, u64)> {
    let text = fs::read_to_string(path).ok()?;
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

/// Nanoseconds stolen from all cores since boot: the eighth value of `/proc/stat`'s `cpu`
/// line, in USER_HZ ticks (100 a second on Linux); 0 when it cannot be read.
fn steal() -> u64 {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks = stat
        .lines()
        .next()
        .and_then(|cpu| cpu.split_whitespace().nth(8))
        .and_then(|field| field.parse::<u64>().ok())
        .unwrap_or(0);
    ticks * 10_000_000
}
