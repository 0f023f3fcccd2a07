//! Parsing of `ordo mount -o` options and of sizes ("64M", "2G").
//!
//! Every option is checked before anything is opened, so a typo never
//! touches an image: like mount(8), an unknown or conflicting option is a
//! usage error.

use std::time::Duration;

use ordo_fs::sched::Policy;
use ordo_fs::{DataMode, MountOptions, ProtocolKind};

/// A parsed `-o` list: the library's mount options and how the kernel
/// mount is served.
#[derive(Clone, Debug)]
pub struct ParsedMount {
    /// What `Fs::mount` gets.
    pub fs: MountOptions,
    /// Worker threads serving FUSE requests, as given (`threads=`);
    /// [`ParsedMount::threads`] is the count to use.
    pub threads_given: Option<usize>,
    /// How long the kernel caches attributes and names.
    pub attr_ttl: Duration,
    /// `mode=` was given; otherwise [`ParsedMount::resolve_mode`] picks
    /// the protocol from the image, as the kernel's ext4 would.
    pub mode_given: bool,
    /// `data=` as given (checked against the mode once it is known).
    pub data_given: Option<DataMode>,
    /// `direct_create=on|off` (default on): serve a create's handle with
    /// direct I/O where the kernel allows it (one request less per write).
    pub direct_create: bool,
    /// `open_requests=on|off` (default on): ordo is asked to open and
    /// close regular files. Off, the kernel opens them without a request
    /// (FUSE's `no_open`) and an unlinked inode lives until the kernel
    /// forgets it.
    pub open_requests: bool,
    /// `io_uring=on|off` (default off): serve requests through FUSE over
    /// io_uring when the kernel offers it, `/dev/fuse` otherwise.
    pub io_uring: bool,
    /// `readers=demand|all` (default demand): with several workers, one
    /// reads requests while it runs and another only while it waits
    /// (`demand`), or every worker reads (`all`).
    pub readers_on_demand: bool,
    /// `readahead=SIZE` (default 1M): the kernel's readahead window for
    /// the mount, in KiB (FUSE's own default is 128K).
    pub readahead_kib: u32,
    /// `fsync_threads=N`, as given: the most threads serving fsyncs apart
    /// from the request workers (0: each on the worker that read it);
    /// [`ParsedMount::fsync_threads`] is the count to use.
    pub fsync_threads_given: Option<usize>,
}

impl ParsedMount {
    /// Worker threads serving FUSE requests: as given, or the machine's
    /// default ([`ordo_fuse::default_threads`]).
    pub fn threads(&self) -> usize {
        self.threads_given
            .unwrap_or_else(ordo_fuse::default_threads)
    }

    /// Threads serving fsyncs apart from the workers: as given, or the
    /// protocol's default ([`ordo_fuse::default_fsync_threads`]; the mode
    /// must be resolved).
    pub fn fsync_threads(&self) -> usize {
        self.fsync_threads_given
            .unwrap_or_else(|| ordo_fuse::default_fsync_threads(self.fs.mode))
    }

    /// Choose the protocol when `mode=` was not given, from the image's
    /// features (`feature_compat`), as the kernel's ext4 mounts it:
    /// `fast_commit` when the image has the feature, `journal`
    /// (data=ordered unless `data=` says otherwise) when it has a journal,
    /// `async` otherwise. Then check `data=` against the mode.
    pub fn resolve_mode(&mut self, feature_compat: u32) -> Result<(), String> {
        use ordo_format::features::compat;
        if !self.mode_given {
            let name = if feature_compat & compat::FAST_COMMIT != 0
                && feature_compat & compat::HAS_JOURNAL != 0
            {
                "fast_commit"
            } else if feature_compat & compat::HAS_JOURNAL != 0 {
                "journal"
            } else {
                "async"
            };
            self.fs.mode = name.parse()?;
        }
        if let Some(d) = self.data_given {
            if !self.fs.mode.caps().data_modes {
                let takes: Vec<String> = ProtocolKind::all()
                    .filter(|k| k.caps().data_modes)
                    .map(|k| format!("mode={k}"))
                    .collect();
                return Err(format!(
                    "conflicting options: data= applies to {}, not mode={}{}",
                    takes.join(" or "),
                    self.fs.mode.name(),
                    if self.mode_given {
                        ""
                    } else {
                        " (the image's default: it has no journal)"
                    }
                ));
            }
            self.fs.data = d;
        }
        Ok(())
    }
}

/// The most `fsync_threads=` accepts.
const FSYNC_THREADS_MAX: usize = 1024;

/// The options `ordo mount -o` accepts, for messages (the modes from the
/// protocol registry).
pub fn known_options() -> String {
    let modes: Vec<&str> = ProtocolKind::all().map(|k| k.name()).collect();
    format!(
        "mode={}[:VARIANT], data=ordered|writeback|journal, \
ro, rw, commit=SECS, cache=SIZE, threads=N, attr_timeout=SECS, sched=fifo|clook|sptf|random[:SEED], fsync=dsync|osync, flush_interval=SECS, scan_rate=N|max, direct_create=on|off, open_requests=on|off, io_uring=on|off, readers=demand|all, fsync_threads=N, readahead=SIZE, barrier=0|1, nobarrier",
        modes.join("|")
    )
}

/// One line per protocol of the registry: `NAME  summary`.
pub fn protocol_list() -> String {
    ProtocolKind::all()
        .map(|k| {
            let mut line = format!("  {:<12} {}", k.name(), k.spec().summary);
            if !k.spec().variants.is_empty() {
                line += &format!(
                    "\n  {:<12} variants (:V): {} (default {})",
                    "",
                    k.spec().variants.join(", "),
                    k.spec().variants[0]
                );
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Parse a size: a number of bytes with an optional suffix K, M, G or T
/// (powers of 1024; a trailing "B" or "iB" is accepted: "64M", "64MiB").
pub use ordo_dev::parse_size_bytes as parse_size;

/// Parse a comma-separated `-o` list (several `-o` are joined first).
pub fn parse_mount_options(lists: &[String]) -> Result<ParsedMount, String> {
    let mut fs = MountOptions {
        background: true,
        ..MountOptions::default()
    };
    let mut threads = None;
    let mut fsync_threads = None;
    let mut direct_create = true;
    let mut open_requests = true;
    let mut io_uring = false;
    let mut readers_on_demand = true;
    let mut readahead_kib = 1024u32;
    let mut attr_ttl = Duration::from_secs(1);
    let mut mode: Option<ProtocolKind> = None;
    let mut data: Option<DataMode> = None;
    let mut ro: Option<bool> = None;
    for opt in lists.iter().flat_map(|l| l.split(',')) {
        let opt = opt.trim();
        if opt.is_empty() {
            continue;
        }
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let need = |v: Option<&str>| -> Result<String, String> {
            match v {
                Some(v) if !v.is_empty() => Ok(v.to_string()),
                _ => Err(format!("option '{key}' needs a value ({key}=...)")),
            }
        };
        let refuse_value = |v: Option<&str>| -> Result<(), String> {
            match v {
                None => Ok(()),
                Some(_) => Err(format!("option '{key}' takes no value")),
            }
        };
        match key {
            "mode" => {
                let k: ProtocolKind = need(value)?.parse()?;
                if mode.is_some_and(|m| m != k) {
                    return Err(format!(
                        "conflicting options: mode={} and mode={}",
                        mode.unwrap(),
                        k
                    ));
                }
                mode = Some(k);
            }
            "data" => {
                let d: DataMode = need(value)?.parse()?;
                if data.is_some_and(|x| x != d) {
                    return Err(
                        "conflicting options: data= given twice with different values".to_string(),
                    );
                }
                data = Some(d);
            }
            "ro" | "rw" => {
                refuse_value(value)?;
                let want = key == "ro";
                if ro.is_some_and(|r| r != want) {
                    return Err("conflicting options: ro and rw".to_string());
                }
                ro = Some(want);
            }
            "flush_interval" => {
                let secs: f64 = need(value)?
                    .parse()
                    .map_err(|_| format!("flush_interval= needs seconds, got '{opt}'"))?;
                if !(0.01..=3600.0).contains(&secs) {
                    return Err(format!("flush_interval={secs}: must be 0.01..3600 seconds"));
                }
                fs.flush_interval_ms = (secs * 1000.0).round() as u64;
            }
            "fsync" => {
                fs.fsync = need(value)?.parse()?;
            }
            "scan_rate" => {
                let v = need(value)?;
                fs.scan_rate = if v == "max" {
                    0
                } else {
                    match v.parse::<u64>() {
                        Ok(n) if (1..=100_000_000).contains(&n) => n,
                        _ => {
                            return Err(format!(
                                "scan_rate={v}: must be inodes per second, 1..100000000, or max"
                            ))
                        }
                    }
                };
            }
            "readahead" => {
                let bytes = parse_size(&need(value)?)?;
                if !(4096..=(64 << 20)).contains(&bytes) || bytes % 4096 != 0 {
                    return Err(format!(
                        "readahead={bytes}: must be a multiple of 4K from 4K to 64M"
                    ));
                }
                readahead_kib = (bytes / 1024) as u32;
            }
            "direct_create" => {
                direct_create = match need(value)?.as_str() {
                    "on" => true,
                    "off" => false,
                    v => return Err(format!("direct_create={v}: must be on or off")),
                };
            }
            "barrier" | "nobarrier" => {
                fs.barrier = match (key, value) {
                    ("nobarrier", None) => false,
                    ("barrier", None | Some("1")) => true,
                    ("barrier", Some("0")) => false,
                    ("nobarrier", Some(_)) => {
                        return Err("option 'nobarrier' takes no value".into())
                    }
                    (_, Some(v)) => return Err(format!("barrier={v}: must be 0 or 1")),
                    _ => unreachable!(),
                };
            }
            "open_requests" => {
                open_requests = match need(value)?.as_str() {
                    "on" => true,
                    "off" => false,
                    v => return Err(format!("open_requests={v}: must be on or off")),
                };
            }
            "readers" => {
                readers_on_demand = match need(value)?.as_str() {
                    "demand" => true,
                    "all" => false,
                    v => return Err(format!("readers={v}: must be demand or all")),
                };
            }
            "io_uring" => {
                io_uring = match value {
                    None | Some("on") => true,
                    Some("off") => false,
                    Some(v) => return Err(format!("io_uring={v}: must be on or off")),
                };
            }
            "commit" => {
                let secs: u64 = need(value)?
                    .parse()
                    .map_err(|_| format!("commit= needs whole seconds, got '{opt}'"))?;
                if secs == 0 || secs > 24 * 3600 {
                    return Err(format!("commit={secs}: must be 1..86400 seconds"));
                }
                fs.commit_interval_ms = secs * 1000;
            }
            "cache" => {
                let bytes = parse_size(&need(value)?)?;
                if bytes < (1 << 20) {
                    return Err(format!("cache={bytes}: must be at least 1M"));
                }
                fs.cache_bytes = bytes;
            }
            "threads" => {
                let n: usize = need(value)?
                    .parse()
                    .map_err(|_| format!("threads= needs a number, got '{opt}'"))?;
                if !(1..=64).contains(&n) {
                    return Err(format!("threads={n}: must be 1..64"));
                }
                threads = Some(n);
            }
            "fsync_threads" => {
                let n: usize = need(value)?
                    .parse()
                    .map_err(|_| format!("fsync_threads= needs a number, got '{opt}'"))?;
                if n > FSYNC_THREADS_MAX {
                    return Err(format!("fsync_threads={n}: must be 0..{FSYNC_THREADS_MAX}"));
                }
                fsync_threads = Some(n);
            }
            "sched" => {
                let p: Policy = need(value)?.parse()?;
                if fs.sched.is_some_and(|q| q != p) {
                    return Err(
                        "conflicting options: sched= given twice with different values".to_string(),
                    );
                }
                fs.sched = Some(p);
            }
            "attr_timeout" => {
                let secs: f64 = need(value)?
                    .parse()
                    .map_err(|_| format!("attr_timeout= needs seconds, got '{opt}'"))?;
                if !(0.0..=3600.0).contains(&secs) {
                    return Err(format!("attr_timeout={secs}: must be 0..3600 seconds"));
                }
                attr_ttl = Duration::from_secs_f64(secs);
            }
            _ => {
                return Err(format!(
                    "unknown mount option '{opt}' (known: {})",
                    known_options()
                ))
            }
        }
    }
    fs.mode = mode.unwrap_or_default();
    let mut parsed = ParsedMount {
        fs,
        threads_given: threads,
        attr_ttl,
        mode_given: mode.is_some(),
        data_given: data,
        direct_create,
        open_requests,
        io_uring,
        readers_on_demand,
        readahead_kib,
        fsync_threads_given: fsync_threads,
    };
    if mode.is_some() {
        // Checked now when the mode is known; otherwise at resolve_mode.
        parsed.resolve_mode(0)?;
    }
    let mut fs = parsed.fs;
    fs.read_only = ro.unwrap_or(false);
    parsed.fs = fs;
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ParsedMount, String> {
        parse_mount_options(&[s.to_string()])
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn defaults_follow_the_image_as_ext4s_do() {
        use ordo_format::features::compat;
        let resolved = |opts: &str, features: u32| {
            let mut p = parse(opts).unwrap();
            p.resolve_mode(features).map(|()| p)
        };
        let p = resolved("", 0).unwrap();
        assert_eq!(p.fs.mode, ProtocolKind::named("async"));
        assert!(!p.fs.read_only);
        assert!(p.fs.background);
        assert_eq!(p.fs.commit_interval_ms, 5000);
        let p = resolved("", compat::HAS_JOURNAL).unwrap();
        assert_eq!(p.fs.mode, ProtocolKind::named("journal"));
        assert_eq!(p.fs.data, DataMode::Ordered);
        let p = resolved("", compat::HAS_JOURNAL | compat::FAST_COMMIT).unwrap();
        assert_eq!(p.fs.mode, ProtocolKind::named("fast_commit"));
        // data= alone picks the journal's data mode on a journaled image,
        // and is refused on an image without a journal.
        let p = resolved("data=writeback", compat::HAS_JOURNAL).unwrap();
        assert_eq!(p.fs.mode, ProtocolKind::named("journal"));
        assert_eq!(p.fs.data, DataMode::Writeback);
        assert!(resolved("data=journal", 0)
            .unwrap_err()
            .contains("no journal"));
        // An explicit mode wins over the image.
        let p = resolved("mode=sync", compat::HAS_JOURNAL).unwrap();
        assert_eq!(p.fs.mode, ProtocolKind::named("sync"));
    }

    #[test]
    fn fsync_and_flush_interval_parse_and_bad_values_are_refused() {
        let p = parse("mode=optimistic,fsync=osync,flush_interval=0.25").unwrap();
        assert_eq!(p.fs.fsync, ordo_fs::FsyncMeaning::Osync);
        assert_eq!(p.fs.flush_interval_ms, 250);
        let p = parse("mode=optimistic").unwrap();
        assert_eq!(p.fs.fsync, ordo_fs::FsyncMeaning::Dsync);
        assert_eq!(p.fs.flush_interval_ms, 1000);
        for bad in [
            "fsync=maybe",
            "fsync=",
            "flush_interval=0",
            "flush_interval=-1",
            "flush_interval=soon",
            "flush_interval=99999",
        ] {
            assert!(parse(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn threads_default_to_the_machine_and_fsync_threads_to_the_protocol() {
        // Workers: one per CPU, 2..=4, whatever the protocol.
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let want = cpus.clamp(2, ordo_fuse::WORKER_THREADS_MAX_DEFAULT);
        for mode in ["journal", "backpointers", "softdep", "async"] {
            let p = parse(&format!("mode={mode}")).unwrap();
            assert_eq!(p.threads(), want, "{mode}");
        }
        assert_eq!(parse("mode=journal,threads=3").unwrap().threads(), 3);
        // The FUSE floor (`ordo fuse-floor`, which takes its count from
        // `MountConfig::default()`) is served by as many workers.
        assert_eq!(ordo_fuse::MountConfig::default().threads, want, "the floor");
        // fsync threads: only where concurrent fsyncs share a commit.
        for mode in [
            "journal",
            "fast_commit",
            "optimistic",
            "streams",
            "backpointers",
        ] {
            let p = parse(&format!("mode={mode}")).unwrap();
            assert_eq!(
                p.fsync_threads(),
                ordo_fuse::FSYNC_THREADS_DEFAULT,
                "{mode}"
            );
        }
        for mode in ["async", "sync", "softdep", "sched-chain"] {
            assert_eq!(
                parse(&format!("mode={mode}")).unwrap().fsync_threads(),
                0,
                "{mode}"
            );
        }
        assert_eq!(
            parse("mode=journal,fsync_threads=0")
                .unwrap()
                .fsync_threads(),
            0
        );
        assert_eq!(
            parse("mode=async,fsync_threads=5").unwrap().fsync_threads(),
            5
        );
        assert!(parse("fsync_threads=1025").is_err());
        assert!(parse("fsync_threads=x").is_err());
    }

    #[test]
    fn barrier_parses_as_ext4_spells_it() {
        assert!(parse("mode=journal").unwrap().fs.barrier);
        for on in ["barrier", "barrier=1", "nobarrier,barrier"] {
            assert!(parse(on).unwrap().fs.barrier, "{on}");
        }
        for off in ["nobarrier", "barrier=0", "barrier,nobarrier"] {
            assert!(!parse(off).unwrap().fs.barrier, "{off}");
        }
        for bad in ["barrier=2", "barrier=yes", "nobarrier=1", "barrier="] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scan_rate_parses_and_bad_values_are_refused() {
        assert_eq!(parse("mode=backpointers").unwrap().fs.scan_rate, 0);
        assert_eq!(parse("scan_rate=5000").unwrap().fs.scan_rate, 5000);
        assert_eq!(parse("scan_rate=max").unwrap().fs.scan_rate, 0);
        for bad in [
            "scan_rate=",
            "scan_rate=0",
            "scan_rate=-3",
            "scan_rate=fast",
        ] {
            assert!(parse(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn direct_create_defaults_on_and_takes_on_or_off() {
        assert!(parse("mode=journal").unwrap().direct_create);
        assert!(!parse("direct_create=off").unwrap().direct_create);
        assert!(parse("direct_create=on").unwrap().direct_create);
        assert!(parse("mode=journal").unwrap().open_requests);
        assert!(!parse("open_requests=off").unwrap().open_requests);
        assert!(!parse("mode=journal").unwrap().io_uring);
        assert!(parse("io_uring").unwrap().io_uring);
        assert!(parse("io_uring=on").unwrap().io_uring);
        assert!(!parse("io_uring=off").unwrap().io_uring);
        assert!(parse("mode=journal").unwrap().readers_on_demand);
        assert!(parse("readers=demand").unwrap().readers_on_demand);
        assert!(!parse("readers=all").unwrap().readers_on_demand);
        assert_eq!(parse("mode=journal").unwrap().readahead_kib, 1024);
        assert_eq!(parse("readahead=128K").unwrap().readahead_kib, 128);
        for bad in [
            "direct_create",
            "direct_create=",
            "direct_create=yes",
            "open_requests",
            "open_requests=no",
            "io_uring=yes",
            "readers",
            "readers=some",
            "io_uring=",
            "readahead=0",
            "readahead=1000",
            "readahead=1G",
        ] {
            assert!(parse(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn every_known_option_parses() {
        let p = parse("mode=journal,data=writeback,ro,commit=7,cache=64M,threads=2,attr_timeout=0")
            .unwrap();
        assert_eq!(p.fs.mode, ProtocolKind::named("journal"));
        assert_eq!(p.fs.data, DataMode::Writeback);
        assert!(p.fs.read_only);
        assert_eq!(p.fs.commit_interval_ms, 7000);
        assert_eq!(p.fs.cache_bytes, 64 << 20);
        assert_eq!(p.threads(), 2);
        assert_eq!(p.attr_ttl, Duration::ZERO);
    }

    #[test]
    fn unknown_and_conflicting_options_are_refused() {
        assert!(parse("bogus").unwrap_err().contains("unknown mount option"));
        assert!(parse("mode=nope").is_err());
        assert!(parse("ro,rw").unwrap_err().contains("conflicting"));
        assert!(parse("mode=sync,mode=async")
            .unwrap_err()
            .contains("conflicting"));
        assert!(parse("mode=async,data=journal")
            .unwrap_err()
            .contains("conflicting"));
        assert!(parse("commit=0").is_err());
        assert!(parse("commit").is_err());
        assert!(parse("ro=1").is_err());
        assert!(parse("cache=12").is_err());
    }

    #[test]
    fn mode_takes_a_variant_of_protocols_that_have_them() {
        let o = parse("mode=sched-flag:full-cb").unwrap();
        assert_eq!(o.fs.mode.name(), "sched-flag");
        assert_eq!(o.fs.mode.variant(), "full-cb");
        assert_eq!(o.fs.mode.to_string(), "sched-flag:full-cb");
        // The default variant is the bare name.
        let o = parse("mode=sched-chain").unwrap();
        assert_eq!(o.fs.mode.variant(), "dep-cb");
        assert_eq!(o.fs.mode, parse("mode=sched-chain:dep-cb").unwrap().fs.mode);
        assert_eq!(o.fs.mode.to_string(), "sched-chain");
        let e = parse("mode=sched-flag:sideways").unwrap_err();
        assert!(
            e.contains("unknown variant 'sideways' of mode 'sched-flag'"),
            "{e}"
        );
        let e = parse("mode=sync:fast").unwrap_err();
        assert!(e.contains("mode 'sync' has no variants"), "{e}");
        let e = parse("mode=sched-flag:part,mode=sched-flag:full").unwrap_err();
        assert!(e.contains("conflicting options"), "{e}");
    }

    #[test]
    fn sched_names_a_policy_and_defaults_to_in_order() {
        assert_eq!(parse("").unwrap().fs.sched, None);
        for p in Policy::ALL {
            let o = parse(&format!("mode=sync,sched={p}")).unwrap();
            assert_eq!(o.fs.sched, Some(p));
        }
        assert_eq!(
            parse("sched=random:7").unwrap().fs.sched,
            Some(Policy::Random(7))
        );
        assert!(parse("sched=random:x")
            .unwrap_err()
            .contains("bad seed in I/O scheduler"));
        let e = parse("sched=elevator").unwrap_err();
        assert!(e.contains("unknown I/O scheduler 'elevator'"), "{e}");
        assert!(parse("sched").unwrap_err().contains("needs a value"));
        assert!(parse("sched=fifo,sched=sptf")
            .unwrap_err()
            .contains("conflicting"));
    }

    #[test]
    fn several_lists_are_joined() {
        let p = parse_mount_options(&["mode=sync".into(), "ro".into()]).unwrap();
        assert_eq!(p.fs.mode, ProtocolKind::named("sync"));
        assert!(p.fs.read_only);
        assert!(parse_mount_options(&["ro".into(), "rw".into()]).is_err());
    }
}
