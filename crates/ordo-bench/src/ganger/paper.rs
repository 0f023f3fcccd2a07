//! The paper's own figures (Ganger & Patt, OSDI '94, Tables 1-3), quoted
//! next to ordo's. Where the paper has rows with and without allocation
//! initialisation, these are the rows with it (ordo always initialises);
//! No Order has only the row without.

/// A row of Table 1 or 2.
#[derive(Clone, Copy, Debug)]
pub struct TreeRow {
    /// Scheme.
    pub scheme: &'static str,
    /// Elapsed time, s (average among the users).
    pub elapsed_s: f64,
    /// CPU time, s (sum among the users).
    pub cpu_s: f64,
    /// Disk requests.
    pub requests: u64,
    /// Average I/O response time, ms.
    pub response_ms: f64,
}

const fn row(
    scheme: &'static str,
    elapsed_s: f64,
    cpu_s: f64,
    requests: u64,
    response_ms: f64,
) -> TreeRow {
    TreeRow {
        scheme,
        elapsed_s,
        cpu_s,
        requests,
        response_ms,
    }
}

/// Table 1, 4-user copy (allocation-initialisation rows).
pub const TABLE1: &[TreeRow] = &[
    row("Conventional", 732.3, 82.4, 51419, 140.1),
    row("Scheduler Flag", 545.7, 90.0, 51028, 2297.0),
    row("Scheduler Chains", 530.6, 86.0, 51248, 423.8),
    row("Soft Updates", 330.9, 80.0, 31880, 262.1),
    row("No Order", 315.3, 68.4, 31574, 304.1),
];

/// Table 2, 4-user remove.
pub const TABLE2: &[TreeRow] = &[
    row("Conventional", 80.24, 12.68, 4600, 68.02),
    row("Scheduler Flag", 24.97, 13.64, 4631, 22173.0),
    row("Scheduler Chains", 31.03, 14.80, 4618, 2495.0),
    row("Soft Updates", 6.71, 5.64, 391, 73.53),
    row("No Order", 7.64, 7.44, 278, 84.03),
];

/// A row of Table 3: the five phases and the total, s.
#[derive(Clone, Copy, Debug)]
pub struct AndrewRow {
    /// Scheme.
    pub scheme: &'static str,
    /// Phases 1-5, then the total.
    pub phases: [f64; 6],
}

/// Table 3, Andrew benchmark (allocation initialisation only for Soft
/// Updates, as in the paper).
pub const TABLE3: &[AndrewRow] = &[
    AndrewRow {
        scheme: "Conventional",
        phases: [2.49, 4.07, 4.08, 5.91, 295.8, 312.4],
    },
    AndrewRow {
        scheme: "Scheduler Flag",
        phases: [0.54, 4.45, 4.09, 5.91, 279.1, 294.1],
    },
    AndrewRow {
        scheme: "Scheduler Chains",
        phases: [0.53, 3.72, 4.09, 5.86, 280.6, 294.8],
    },
    AndrewRow {
        scheme: "Soft Updates",
        phases: [0.34, 2.77, 4.25, 5.84, 276.3, 289.5],
    },
    AndrewRow {
        scheme: "No Order",
        phases: [0.37, 2.74, 4.14, 5.84, 276.6, 289.7],
    },
];
