use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::{DiskModel, MemDevice, TimedDevice};

const BS: u32 = 4096;
const BLOCKS: u64 = 1 << 14;

fn hdd() -> TimedDevice<MemDevice> {
    TimedDevice::new(MemDevice::new(BS, BLOCKS).unwrap(), DiskModel::hp_c2447()).unwrap()
}

fn img(byte: u8, blocks: usize) -> Arc<Vec<u8>> {
    Arc::new(vec![byte; blocks * BS as usize])
}

fn w(s: &mut Scheduler, block: u64, byte: u8) -> ReqId {
    s.submit_write(block, img(byte, 1), WriteFlags::new(BlockClass::Data), &[])
}

fn blocks_served(c: &[Completion]) -> Vec<u64> {
    c.iter().map(|c| c.block).collect()
}

fn sched(policy: Policy) -> Scheduler {
    let mut cfg = SchedConfig::new(policy);
    cfg.max_in_flight = 1;
    Scheduler::new(cfg, BS)
}

/// The queue of the order tests, with the head left at block 501.
fn known_queue(s: &mut Scheduler, dev: &dyn BlockDevice) {
    w(s, 500, 1);
    let (_, r) = s.run(dev);
    r.unwrap();
    for b in [900, 100, 700, 300, 520, 50] {
        w(s, b, 2);
    }
}

#[test]
fn clook_serves_ascending_from_the_head_then_wraps() {
    let dev = hdd();
    let mut s = sched(Policy::CLook);
    known_queue(&mut s, &dev);
    let (c, r) = s.run(&dev);
    r.unwrap();
    assert_eq!(blocks_served(&c), [520, 700, 900, 50, 100, 300]);
}

#[test]
fn sptf_serves_the_nearest_by_positioning_time() {
    let dev = hdd();
    let mut s = sched(Policy::Sptf);
    known_queue(&mut s, &dev);
    let (c, r) = s.run(&dev);
    r.unwrap();
    assert_eq!(blocks_served(&c), [520, 700, 900, 300, 100, 50]);
}

#[test]
fn sptf_is_clook_without_positioning() {
    for dev in [
        Box::new(MemDevice::new(BS, BLOCKS).unwrap()) as Box<dyn BlockDevice>,
        Box::new(
            TimedDevice::new(MemDevice::new(BS, BLOCKS).unwrap(), DiskModel::ssd_sata()).unwrap(),
        ),
    ] {
        let mut s = sched(Policy::Sptf);
        known_queue(&mut s, dev.as_ref());
        let (c, r) = s.run(dev.as_ref());
        r.unwrap();
        assert_eq!(blocks_served(&c), [520, 700, 900, 50, 100, 300]);
    }
}

#[test]
fn sptf_enters_a_run_at_its_start() {
    // From 501, block 498 is nearer than 496, but 496..499 is one run.
    let dev = hdd();
    let mut s = sched(Policy::Sptf);
    w(&mut s, 500, 1);
    let (_, r) = s.run(&dev);
    r.unwrap();
    let mut cfg = SchedConfig::new(Policy::Sptf);
    cfg.max_in_flight = 1;
    cfg.max_merge_bytes = BS as usize;
    let mut s = Scheduler::new(cfg, BS);
    for b in [498, 496, 497, 3000] {
        w(&mut s, b, 2);
    }
    let (c, r) = s.run(&dev);
    r.unwrap();
    assert_eq!(blocks_served(&c), [496, 497, 498, 3000]);
}

#[test]
fn random_is_a_function_of_its_seed_and_takes_many_orders() {
    let order = |seed: u64| {
        let dev = MemDevice::new(BS, BLOCKS).unwrap();
        let mut s = Scheduler::new(SchedConfig::new(Policy::Random(seed)), BS);
        for b in [900, 100, 700, 300, 520, 50] {
            w(&mut s, b, 2);
        }
        // 40 follows 900; everything after the barrier follows all of it.
        let first = s.submit_write(40, img(3, 1), WriteFlags::new(BlockClass::Data), &[0]);
        s.barrier();
        w(&mut s, 10, 4);
        w(&mut s, 20, 4);
        let (c, r) = s.run(&dev);
        r.unwrap();
        let served = blocks_served(&c);
        let at = |b: u64| served.iter().position(|&x| x == b).unwrap();
        assert!(at(900) < at(40), "{served:?}");
        assert!(served[..7].contains(&40) && served[7..].iter().all(|b| [10, 20].contains(b)));
        assert!(c.iter().any(|x| x.id == first));
        served
    };
    assert_eq!(order(7), order(7));
    let orders: std::collections::HashSet<Vec<u64>> = (0..20).map(order).collect();
    assert!(
        orders.len() > 10,
        "only {} orders from 20 seeds",
        orders.len()
    );
    assert_eq!("random:9".parse::<Policy>().unwrap(), Policy::Random(9));
    assert_eq!(Policy::Random(9).to_string(), "random:9");
}

#[test]
fn fifo_keeps_submission_order() {
    let dev = hdd();
    let mut s = sched(Policy::Fifo);
    known_queue(&mut s, &dev);
    let (c, r) = s.run(&dev);
    r.unwrap();
    assert_eq!(blocks_served(&c), [900, 100, 700, 300, 520, 50]);
}

#[test]
fn concatenation_merges_adjacent_eligible_writes() {
    let dev = MemDevice::new(BS, BLOCKS).unwrap();
    let mut s = sched(Policy::CLook);
    for (b, x) in [(12, 3), (10, 1), (14, 5), (11, 2)] {
        w(&mut s, b, x);
    }
    let (c, r) = s.run(&dev);
    r.unwrap();
    assert_eq!(blocks_served(&c), [10, 11, 12, 14]);
    assert_eq!(c[0].dispatch, c[1].dispatch);
    assert_eq!(c[1].dispatch, c[2].dispatch);
    assert_ne!(c[2].dispatch, c[3].dispatch);
    assert_eq!(c[0].ticket, c[2].ticket);
    assert_eq!(dev.counters().total().writes, 2, "two device requests");
    assert_eq!(s.stats().disk_requests, 2);
    assert_eq!(s.stats().merged, 2);
    let mut buf = vec![0u8; 5 * BS as usize];
    dev.read(10, &mut buf, BlockClass::Data).unwrap();
    let firsts: Vec<u8> = buf.chunks(BS as usize).map(|b| b[0]).collect();
    assert_eq!(firsts, [1, 2, 3, 0, 5]);
}

#[test]
fn concatenation_stops_at_its_bound_and_at_ineligible_requests() {
    let dev = MemDevice::new(BS, BLOCKS).unwrap();
    let mut cfg = SchedConfig::new(Policy::CLook);
    cfg.max_in_flight = 1;
    cfg.max_merge_bytes = 2 * BS as usize;
    let mut s = Scheduler::new(cfg, BS);
    for b in 10..13 {
        w(&mut s, b, 1);
    }
    let (c, r) = s.run(&dev);
    r.unwrap();
    assert_eq!(c[0].dispatch, c[1].dispatch);
    assert_ne!(c[1].dispatch, c[2].dispatch);

    // 21 waits for 40: when 20 is served, 21 is not eligible.
    let mut s = sched(Policy::CLook);
    w(&mut s, 20, 1);
    let far = w(&mut s, 40, 1);
    s.submit_write(21, img(1, 1), WriteFlags::new(BlockClass::Data), &[far]);
    let (c, r) = s.run(&dev);
    r.unwrap();
    assert_eq!(blocks_served(&c), [20, 40, 21]);
    assert_eq!(s.stats().disk_requests, 3);
}

#[test]
fn barriers_and_flushes_order_everything_around_them() {
    let dev = MemDevice::new(BS, BLOCKS).unwrap();
    let mut s = sched(Policy::CLook);
    w(&mut s, 100, 1);
    w(&mut s, 90, 1);
    s.barrier();
    w(&mut s, 1, 1);
    let f = s.flush();
    w(&mut s, 0, 1);
    let (c, r) = s.run(&dev);
    r.unwrap();
    let order: Vec<(ReqKind, u64)> = c.iter().map(|c| (c.kind, c.block)).collect();
    assert_eq!(
        order,
        [
            (ReqKind::Write, 90),
            (ReqKind::Write, 100),
            (ReqKind::Write, 1),
            (ReqKind::Flush, 0),
            (ReqKind::Write, 0)
        ]
    );
    assert_eq!(c[3].id, f);
    assert_eq!(dev.counters().flushes, 1);
}

#[test]
fn writes_of_one_block_keep_their_order() {
    let dev = MemDevice::new(BS, BLOCKS).unwrap();
    let mut s = sched(Policy::CLook);
    // The first write of 7 waits for 50; the second names nothing, yet
    // must not pass the first.
    let far = w(&mut s, 50, 9);
    s.submit_write(7, img(1, 1), WriteFlags::new(BlockClass::Data), &[far]);
    w(&mut s, 7, 2);
    let (_, r) = s.run(&dev);
    r.unwrap();
    let mut buf = vec![0u8; BS as usize];
    dev.read(7, &mut buf, BlockClass::Data).unwrap();
    assert_eq!(buf[0], 2, "the later write of block 7 lands last");
}

#[test]
fn reads_are_served_from_queued_writes() {
    let dev = MemDevice::new(BS, BLOCKS).unwrap();
    dev.write(4, &img(7, 3), WriteFlags::new(BlockClass::Data))
        .unwrap();
    let mut s = sched(Policy::CLook);
    w(&mut s, 5, 1);
    let whole = s.submit_read(5, 1, BlockClass::Data);
    assert_eq!(s.take_read(whole).unwrap()[0], 1, "no device request");
    assert_eq!(dev.counters().total().reads, 0);
    let part = s.submit_read(4, 3, BlockClass::Data);
    // The write after the read must not change what the read returns.
    w(&mut s, 6, 3);
    let (c, r) = s.run(&dev);
    r.unwrap();
    let data = s.take_read(part).unwrap();
    let firsts: Vec<u8> = data.chunks(BS as usize).map(|b| b[0]).collect();
    assert_eq!(firsts, [7, 1, 7]);
    assert_eq!(s.stats().reads_from_queue, 1);
    let pos = |b: u64, k: ReqKind| c.iter().position(|c| c.block == b && c.kind == k);
    assert!(pos(4, ReqKind::Read) < pos(6, ReqKind::Write));
}

/// Writes at scattered blocks, all queued at once, served on the HDD model.
fn scattered_run(policy: Policy) -> (Vec<Completion>, SchedStats, u64) {
    let dev = hdd();
    let mut s = sched(policy);
    for i in 0..64u64 {
        let b = (i * 7919 * 104_729) % (BLOCKS - 8);
        w(&mut s, b, i as u8);
        if i % 16 == 15 {
            s.flush();
        }
    }
    let (c, r) = s.run(&dev);
    r.unwrap();
    (c, s.stats(), dev.virtual_time_ns())
}

#[test]
fn virtual_time_response_times_are_deterministic() {
    for p in Policy::ALL {
        let (c1, s1, t1) = scattered_run(p);
        let (c2, s2, t2) = scattered_run(p);
        assert_eq!(c1, c2);
        assert_eq!(s1, s2);
        assert_eq!(t1, t2);
        assert!(s1.virtual_time);
        // Everything arrived at 0 and the disk served back to back: each
        // request waited for the service of every request before it.
        let mut clock = 0;
        let mut last = None;
        for c in &c1 {
            if last != Some(c.dispatch) {
                assert_eq!(c.queue_ns, clock, "{p}: {c:?}");
                clock += c.service_ns;
                last = Some(c.dispatch);
            }
        }
        assert!(clock.abs_diff(t1) <= c1.len() as u64, "{clock} vs {t1}");
        let all = s1.all();
        assert_eq!(all.requests, 64 + 4);
        assert_eq!(
            all.response_ns(),
            c1.iter().map(Completion::response_ns).sum::<u64>()
        );
    }
    // Reordering pays on the disk of the paper: C-LOOK and SPTF serve the
    // same writes in less time than FIFO.
    let fifo = scattered_run(Policy::Fifo).2;
    assert!(scattered_run(Policy::CLook).2 < fifo);
    assert!(scattered_run(Policy::Sptf).2 < fifo);
}

#[test]
fn real_devices_take_several_requests_in_flight() {
    let dev = MemDevice::new(BS, BLOCKS).unwrap();
    let mut s = Scheduler::new(SchedConfig::new(Policy::CLook), BS);
    for i in 0..32u64 {
        w(&mut s, i * 3, i as u8 + 1);
    }
    let (c, r) = s.run(&dev);
    r.unwrap();
    assert_eq!(c.len(), 32);
    assert!(!s.stats().virtual_time);
    for i in 0..32u64 {
        let mut buf = vec![0u8; BS as usize];
        dev.read(i * 3, &mut buf, BlockClass::Data).unwrap();
        assert_eq!(buf[0], i as u8 + 1);
    }
}

#[test]
fn policies_parse_and_bad_names_are_refused() {
    for p in Policy::ALL {
        assert_eq!(p.name().parse::<Policy>().unwrap(), p);
    }
    let e = "elevator".parse::<Policy>().unwrap_err();
    assert!(e.contains("fifo, clook, sptf"), "{e}");
}

#[derive(Clone, Debug)]
enum Step {
    Write {
        block: u64,
        len: u64,
        deps: Vec<usize>,
    },
    Barrier,
    Flush,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            8 => (0u64..48, 1u64..4, prop::collection::vec(any::<prop::sample::Index>(), 0..3))
                .prop_map(|(block, len, d)| Step::Write { block, len, deps: d.into_iter().map(|i| i.index(1 << 20)).collect() }),
            1 => Just(Step::Barrier),
            1 => Just(Step::Flush),
        ],
        1..60,
    )
}

/// Submit `steps`; returns per request (id, the epoch it is in, its
/// explicit deps, (block, len, byte) for writes).
type Submitted = Vec<(ReqId, u64, Vec<ReqId>, Option<(u64, u64, u8)>)>;

fn submit(s: &mut Scheduler, steps: &[Step]) -> Submitted {
    let mut out: Submitted = Vec::new();
    let mut epoch = 0;
    for (n, st) in steps.iter().enumerate() {
        match st {
            Step::Write { block, len, deps } => {
                let writes: Vec<ReqId> =
                    out.iter().filter(|r| r.3.is_some()).map(|r| r.0).collect();
                let after: Vec<ReqId> = if writes.is_empty() {
                    Vec::new()
                } else {
                    deps.iter().map(|d| writes[d % writes.len()]).collect()
                };
                let byte = (n % 251) as u8 + 1;
                let id = s.submit_write(
                    *block,
                    img(byte, *len as usize),
                    WriteFlags::new(BlockClass::Data),
                    &after,
                );
                out.push((id, epoch, after, Some((*block, *len, byte))));
            }
            Step::Barrier => {
                s.barrier();
                epoch += 1;
            }
            Step::Flush => {
                epoch += 1;
                let id = s.flush();
                out.push((id, epoch, Vec::new(), None));
                epoch += 1;
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn dependencies_and_barriers_are_never_violated(
        steps in steps(),
        policy in prop_oneof![
            prop::sample::select(Policy::ALL.to_vec()),
            any::<u64>().prop_map(Policy::Random),
        ],
        timed in any::<bool>(),
        merge_blocks in 1usize..8,
    ) {
        let dev: Box<dyn BlockDevice> = if timed {
            Box::new(hdd())
        } else {
            Box::new(MemDevice::new(BS, BLOCKS).unwrap())
        };
        let mut cfg = SchedConfig::new(policy);
        cfg.max_merge_bytes = merge_blocks * BS as usize;
        cfg.max_in_flight = 4;
        let mut s = Scheduler::new(cfg, BS);
        let reqs = submit(&mut s, &steps);
        let (c, r) = s.run(dev.as_ref());
        prop_assert!(r.is_ok());
        prop_assert_eq!(c.len(), reqs.len());
        let dispatch: HashMap<ReqId, u64> = c.iter().map(|c| (c.id, c.dispatch)).collect();
        let pos: HashMap<ReqId, usize> = c.iter().enumerate().map(|(i, c)| (c.id, i)).collect();
        for (id, epoch, after, _) in &reqs {
            for a in after {
                prop_assert!(dispatch[a] < dispatch[id], "{} issued with or before its dependency {}", id, a);
                prop_assert!(pos[a] < pos[id]);
            }
            for (id2, epoch2, _, _) in &reqs {
                if epoch2 < epoch {
                    prop_assert!(dispatch[id2] < dispatch[id], "{} passed {} across a barrier", id, id2);
                }
            }
        }
        // The device ends with the image of in-order issue.
        let mut want: HashMap<u64, u8> = HashMap::new();
        for (_, _, _, w) in &reqs {
            if let Some((b, len, byte)) = w {
                for k in *b..b + len {
                    want.insert(k, *byte);
                }
            }
        }
        for (b, byte) in want {
            let mut buf = vec![0u8; BS as usize];
            dev.read(b, &mut buf, BlockClass::Data).unwrap();
            prop_assert_eq!(buf[0], byte, "block {}", b);
        }
        // Concatenated requests are adjacent, one direction, within the bound.
        let mut by_dispatch: BTreeMap<u64, Vec<&Completion>> = BTreeMap::new();
        for x in &c {
            by_dispatch.entry(x.dispatch).or_default().push(x);
        }
        for group in by_dispatch.values() {
            let total: u64 = group.iter().map(|x| x.blocks).sum();
            prop_assert!(group.len() == 1 || total as usize <= merge_blocks);
            for pair in group.windows(2) {
                prop_assert_eq!(pair[0].block + pair[0].blocks, pair[1].block);
            }
        }
    }
}
