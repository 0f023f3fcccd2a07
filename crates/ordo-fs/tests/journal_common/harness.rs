//! A minimal stand-in for the core, to drive the journal protocol directly:
//! a real buffer cache, block changes reported as updates on handles, plans
//! executed in order on a write-cache device that can lose unflushed
//! writes. The "metadata" it changes lives in free blocks of a real ext4
//! image, so any recovered image stays `e2fsck` clean whatever the blocks
//! hold, and the test can predict every block exactly.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ordo_dev::{BlockClass, BlockDevice, CrashPolicy, MemDevice, WriteCacheDevice};
use ordo_fs::cache::BufferCache;
use ordo_fs::protocol::{
    self, DataMode, Io, IoPlan, Protocol, ProtocolEnv, ProtocolKind, WriteBackReason,
};
use ordo_fs::update::{DataWrite, HandleInfo, OpKind, Update, UpdateKind};

pub struct Harness {
    pub dev: Arc<WriteCacheDevice<MemDevice>>,
    pub cache: BufferCache,
    pub proto: Box<dyn Protocol>,
    pub bs: u32,
    pub env: ProtocolEnv,
    next_handle: u64,
    /// Image of every block the harness changed, as of now.
    pub current: BTreeMap<u64, Vec<u8>>,
    /// Images as of each commit that a durability call asked for.
    pub promised: BTreeMap<u64, Vec<u8>>,
}

impl Harness {
    /// Load `img` (an ext4 image file) into memory and mount the journal
    /// protocol on it.
    pub fn new(img: &Path, data_mode: DataMode) -> Harness {
        let bytes = std::fs::read(img).unwrap();
        let bs = super::image_block_size(img);
        let mem = MemDevice::from_image(bs, &bytes).unwrap();
        let dev = Arc::new(WriteCacheDevice::new(mem));
        let uuid: [u8; 16] = bytes[1024 + 0x68..1024 + 0x78].try_into().unwrap();
        let ro_compat = u32::from_le_bytes(bytes[1024 + 0x64..1024 + 0x68].try_into().unwrap());
        let runs = ordo_fs::recovery::locate_journal(&*dev).unwrap().unwrap();
        let env = ProtocolEnv {
            block_size: bs,
            block_count: dev.block_count(),
            uuid,
            journal_runs: runs,
            commit_interval_ms: 5000,
            flush_interval_ms: 1000,
            data_mode,
            metadata_csum: ro_compat & 0x400 != 0,
            clock: ordo_fs::clock::system(),
            variant: "",
        };
        let journal = ProtocolKind::named("journal");
        let recovered = journal.recover(&*dev, &env).unwrap();
        let proto = journal.build(recovered, &env).unwrap();
        let mut cache = BufferCache::new(bs, 64 << 20);
        let sb_block = 1024 / bs as u64;
        let mut sb = vec![0u8; bs as usize];
        dev.read(sb_block, &mut sb, BlockClass::Super).unwrap();
        cache.insert_clean(sb_block, BlockClass::Super, sb);
        Harness {
            dev,
            cache,
            proto,
            bs,
            env,
            next_handle: 1,
            current: BTreeMap::new(),
            promised: BTreeMap::new(),
        }
    }

    fn handle(&mut self, op: OpKind) -> HandleInfo {
        let id = self.next_handle;
        self.next_handle += 1;
        HandleInfo {
            id,
            op,
            stream: 0,
            inodes: vec![12],
        }
    }

    fn ensure_cached(&mut self, block: u64, class: BlockClass) {
        if self.cache.snapshot(block).is_none() {
            let mut b = vec![0u8; self.bs as usize];
            self.dev.read(block, &mut b, class).unwrap();
            self.cache.insert_clean(block, class, b);
        }
    }

    /// One handle that fills each block of `blocks` with `fill` (a
    /// metadata change), then ends.
    pub fn meta(&mut self, blocks: &[u64], fill: u8) {
        let h = self.handle(OpKind::SetAttr);
        for &b in blocks {
            self.ensure_cached(b, BlockClass::InodeTable);
            let new = vec![fill; self.bs as usize];
            // Reported even when the block held these bytes already.
            let old = self
                .cache
                .modify(b, 0, &new)
                .unwrap_or_else(|| new.as_slice().into());
            self.proto.on_update(
                &Update {
                    block: b,
                    range: 0..self.bs,
                    old,
                    new: new.as_slice().into(),
                    kind: UpdateKind::Other,
                },
                &h,
            );
            self.current.insert(b, new);
        }
        self.end(&h);
    }

    /// One handle whose metadata block begins with the JBD2 magic (escaped
    /// in the log).
    pub fn meta_with_magic(&mut self, block: u64) {
        let h = self.handle(OpKind::SetAttr);
        self.ensure_cached(block, BlockClass::Directory);
        let mut new = vec![0x5Au8; self.bs as usize];
        new[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
        let old = self
            .cache
            .modify(block, 0, &new)
            .unwrap_or_else(|| new.as_slice().into());
        self.proto.on_update(
            &Update {
                block,
                range: 0..self.bs,
                old,
                new: new.as_slice().into(),
                kind: UpdateKind::Other,
            },
            &h,
        );
        self.current.insert(block, new);
        self.end(&h);
    }

    /// One handle writing file data into `block`.
    pub fn data(&mut self, block: u64, fill: u8, fresh: bool) {
        let h = self.handle(OpKind::Write);
        let new = vec![fill; self.bs as usize];
        if fresh {
            self.cache.insert_new(block, BlockClass::Data, new.clone());
        } else {
            self.ensure_cached(block, BlockClass::Data);
            self.cache.modify(block, 0, &new);
        }
        self.proto.on_data_write(
            &DataWrite {
                ino: 12,
                lblk: 0,
                pblk: block,
                generation: 0,
                fresh,
            },
            &h,
        );
        self.current.insert(block, new);
        self.end(&h);
    }

    /// One handle freeing `block`.
    pub fn free(&mut self, block: u64) {
        let h = self.handle(OpKind::Truncate);
        self.cache.forget(block);
        self.proto.on_block_freed(block, &h);
        self.current.remove(&block);
        self.promised.remove(&block);
        self.end(&h);
    }

    fn end(&mut self, h: &HandleInfo) {
        let mut plan = IoPlan::default();
        {
            let mut io = Io::new(&mut self.cache, &mut plan);
            self.proto.on_handle_end(h, &mut io).unwrap();
        }
        self.run(plan);
    }

    /// Execute a plan in order, then do what the core does after it.
    pub fn run(&mut self, plan: IoPlan) {
        let (done, r) = protocol::execute_plan(&plan, self.dev.as_ref());
        r.unwrap();
        for &(b, gen) in &plan.pinned {
            self.cache.unpin(b);
            self.cache.mark_clean_if(b, gen);
        }
        self.proto.plan_done(&done);
    }

    fn plan(&mut self, f: impl FnOnce(&mut dyn Protocol, &mut Io)) -> IoPlan {
        let mut plan = IoPlan::default();
        {
            let mut io = Io::new(&mut self.cache, &mut plan);
            f(self.proto.as_mut(), &mut io);
        }
        plan
    }

    /// fsync: everything changed so far is promised.
    pub fn fsync(&mut self) {
        let plan = self.plan(|p, io| p.fsync(12, false, io).unwrap());
        self.run(plan);
        self.promised = self.current.clone();
    }

    /// A commit-interval tick.
    pub fn timer(&mut self) {
        let plan = self.plan(|p, io| p.write_back(WriteBackReason::Timer, io).unwrap());
        self.run(plan);
    }

    pub fn pressure(&mut self) {
        let plan = self.plan(|p, io| p.write_back(WriteBackReason::Pressure, io).unwrap());
        self.run(plan);
    }

    pub fn unmount(&mut self) {
        let plan = self.plan(|p, io| p.write_back(WriteBackReason::Unmount, io).unwrap());
        self.run(plan);
        self.dev.flush().unwrap();
    }

    pub fn stat(&self, name: &str) -> u64 {
        self.proto
            .stats()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no stat {name}"))
    }

    /// The device a power cut would leave, recovered by ordo.
    pub fn crash_and_recover(&self, seed: u64, policy: CrashPolicy) -> MemDevice {
        let crashed = self.dev.crash(seed, policy).unwrap();
        ordo_fs::recovery::recover_device(&crashed, None).unwrap();
        crashed
    }

    /// The device a power cut would leave, not recovered.
    pub fn crash(&self, seed: u64, policy: CrashPolicy) -> MemDevice {
        self.dev.crash(seed, policy).unwrap()
    }

    pub fn block_of(dev: &dyn BlockDevice, b: u64) -> Vec<u8> {
        let mut buf = vec![0u8; dev.block_size() as usize];
        dev.read(b, &mut buf, BlockClass::Other).unwrap();
        buf
    }

    /// Every promised block holds its promised image (or a later one).
    pub fn check_promises(&self, dev: &dyn BlockDevice, later_ok: bool) -> Result<(), String> {
        for (&b, img) in &self.promised {
            let got = Self::block_of(dev, b);
            if &got != img && !(later_ok && self.current.get(&b) == Some(&got)) {
                return Err(format!(
                    "block {b}: promised {:#04x}.., found {:#04x}..",
                    img[0], got[0]
                ));
            }
        }
        Ok(())
    }
}
