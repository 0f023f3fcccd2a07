//! Recovery of `mode=optimistic`: JBD2's scan, then a verification of
//! every transaction's data tags, then JBD2's replay of the transactions
//! before the first one that fails.
//!
//! # The two passes
//!
//! 1. **Verify.** The JBD2 scan already proved each transaction's journal
//!    blocks (descriptor tails, per-copy v3 tag checksums, revoke tails, the
//!    commit checksum over the commit block and its data-tag table); a
//!    block that did not reach the disk fails there and ends the log. A
//!    commit block torn after its header (which JBD2 accepts, since its
//!    flush made the body durable first) is not a commit here: nothing
//!    ordered the body before it. Then every data tag's home block is read
//!    and checksummed. A mismatch of transaction *i* on block *B* is
//!    *resolved* when a later transaction *j* (still before the cut) journals
//!    *B*, revokes *B*, or tags *B* with the checksum *B* has now: a later
//!    owner legitimately changed the block (an overwrite is journaled, a
//!    free is revoked, a reuse waits until the free is durable, and the log
//!    is released in order, so a later transaction that explains the change
//!    is always still in the log). There is no bound on how many
//!    mismatches are tracked.
//! 2. **Replay** up to, not including, the first transaction with an
//!    unresolved mismatch (recomputed until stable: cutting the log earlier
//!    can only un-resolve mismatches), with JBD2's revoke rules; then the
//!    log is emptied and the journal's data-tag feature cleared, so the
//!    image is plain ext4 again.
//!
//! # Test-only fault
//!
//! `ORDO_FAULT=optimistic_replay_past_bad` drops only the failing
//! transactions and replays the ones after them: the crash explorer must
//! catch it.

use std::collections::{BTreeMap, BTreeSet};

use ordo_dev::{BlockClass, BlockDevice};
use ordo_format::jbd2::{self, DataTag};

use crate::error::Result;
use crate::protocol::jbd2::recovery::{read_jblock, JournalMap, Scan};
use crate::protocol::{ProtocolEnv, Recovered};

/// Mount-time recovery of `mode=optimistic` (see the module docs).
pub fn recover(dev: &dyn BlockDevice, env: &ProtocolEnv) -> Result<Recovered> {
    crate::protocol::jbd2::recover_with(dev, env, Some(&verify_scan))
}

/// Why a transaction is not replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Bad {
    /// Its commit block was torn after the header.
    TornCommit,
    /// Its data-tag table does not decode.
    Table(String),
    /// A tagged home block does not hold the data the tag names.
    Data { block: u64 },
}

/// Pass 1 over the scanned log: cut `scan.transactions` before the first
/// transaction that fails; returns report lines.
fn verify_scan(dev: &dyn BlockDevice, map: &JournalMap, scan: &mut Scan) -> Result<Vec<String>> {
    let fmt = scan.sb.format();
    let bs = dev.block_size() as usize;
    let n = scan.transactions.len();
    let mut tags: Vec<Vec<DataTag>> = Vec::with_capacity(n);
    let mut structural: Option<(usize, Bad)> = None;
    let mut buf = vec![0u8; bs];
    for (i, t) in scan.transactions.iter().enumerate() {
        if t.torn_commit {
            structural = Some((i, Bad::TornCommit));
            break;
        }
        read_jblock(dev, map, t.commit_block, &mut buf)?;
        match jbd2::decode_data_tags(&fmt, &buf) {
            Ok(v) => tags.push(v),
            Err(e) => {
                structural = Some((i, Bad::Table(e.to_string())));
                break;
            }
        }
    }
    let checked = tags.len();
    // The checksum every tagged block has now.
    let mut now: BTreeMap<u64, u32> = BTreeMap::new();
    let dev_blocks = dev.block_count();
    for t in tags.iter().flatten() {
        if now.contains_key(&t.block) {
            continue;
        }
        let c = if t.block < dev_blocks && !map.contains_phys(t.block) {
            dev.read(t.block, &mut buf, BlockClass::Data)?;
            fmt.data_checksum(&buf)
        } else {
            // A tag naming a block outside the file system never matches.
            !t.checksum
        };
        now.insert(t.block, c);
    }
    // Per block, the transactions that explain a later change of it.
    let mut journaled: BTreeMap<u64, BTreeSet<usize>> = BTreeMap::new();
    for (i, t) in scan.transactions.iter().enumerate().take(checked) {
        for b in &t.blocks {
            journaled.entry(b.home).or_default().insert(i);
        }
        for &b in &t.revoked {
            journaled.entry(b).or_default().insert(i);
        }
    }
    for (i, ts) in tags.iter().enumerate() {
        for t in ts {
            if now.get(&t.block) == Some(&t.checksum) {
                journaled.entry(t.block).or_default().insert(i);
            }
        }
    }
    let mismatches: Vec<(usize, u64)> = tags
        .iter()
        .enumerate()
        .flat_map(|(i, ts)| ts.iter().map(move |t| (i, t)))
        .filter(|(_, t)| now.get(&t.block) != Some(&t.checksum))
        .map(|(i, t)| (i, t.block))
        .collect();
    let resolved = |i: usize, block: u64, limit: usize| {
        journaled
            .get(&block)
            .is_some_and(|js| js.range(i + 1..limit).next().is_some())
    };
    let mut lines = Vec::new();
    let skip_bad = std::env::var("ORDO_FAULT").as_deref() == Ok("optimistic_replay_past_bad");
    if skip_bad {
        // Broken on purpose: drop the failing transactions, keep the rest.
        let bad: BTreeSet<usize> = mismatches
            .iter()
            .filter(|&&(i, b)| !resolved(i, b, checked))
            .map(|&(i, _)| i)
            .chain(structural.as_ref().map(|(i, _)| *i))
            .collect();
        let mut i = 0;
        scan.transactions.retain(|_| {
            i += 1;
            !bad.contains(&(i - 1))
        });
        return Ok(lines);
    }
    let mut limit = checked;
    let mut why: Option<(usize, Bad)> = structural;
    loop {
        let first = mismatches
            .iter()
            .filter(|&&(i, b)| i < limit && !resolved(i, b, limit))
            .min_by_key(|&&(i, _)| i)
            .copied();
        match first {
            Some((i, block)) => {
                limit = i;
                why = Some((i, Bad::Data { block }));
            }
            None => break,
        }
    }
    let unresolved = mismatches
        .iter()
        .filter(|&&(i, b)| !resolved(i, b, checked))
        .count();
    if let Some((i, bad)) = why {
        let t = &scan.transactions[i];
        let reason = match bad {
            Bad::TornCommit => format!("its commit block (journal block {}) is torn", t.commit_block),
            Bad::Table(e) => format!("its data-tag table: {e}"),
            Bad::Data { block } => format!(
                "block {block} does not hold the data its tag names (the data never reached the disk)"
            ),
        };
        lines.push(format!(
            "optimistic: replay stops before transaction {} ({} of {} transactions verified, {} unresolved data mismatches): {reason}",
            t.tid,
            i,
            n,
            unresolved
        ));
        scan.transactions.truncate(i);
    } else if checked > 0 {
        let tagged: usize = tags.iter().map(Vec::len).sum();
        lines.push(format!(
            "optimistic: {checked} transactions verified ({tagged} data tags, {} resolved by later transactions)",
            mismatches.len()
        ));
    }
    Ok(lines)
}
